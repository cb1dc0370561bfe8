"""Fused element-wise chains are checked per node against the float64 reference
(``benchmarks/check.py``), and a broken fused kernel is caught (the autotuner's
check of fused candidates: ``tests/passes/test_fuse_elementwise.py``)."""

from __future__ import annotations

import attrs
import pytest

import opgraph as og
from opgraph.benchmarks import check
from opgraph.benchmarks.models import Model
from opgraph.benchmarks.protocol import random_feeds, training_graph

FUSE_ON_CPU = {"prefer": {"conv": ["gemm"]}, "include": ["fused-reference"]}


def fan_out_model(batch: int = 2) -> Model:
    """conv -> bias -> SiLU read by two convolutions whose sum goes through a
    ReLU to a linear layer: forward chains and a gradient sum to fuse."""
    g = og.Graph("fan_out")
    x = g.input("data", (batch, 3, 6, 6))
    params = []

    def param(name, shape):
        params.append(g.param(name, shape))
        return params[-1]

    a = og.silu(og.bias_add(og.conv2d(x, param("c0.weight", (4, 3, 3, 3)), padding=1, name="c0"),
                            param("c0.bias", (4,)), name="b0"), name="act0")
    s = og.add(og.conv2d(a, param("c1.weight", (4, 4, 3, 3)), padding=1, name="c1"),
               og.conv2d(a, param("c2.weight", (4, 4, 1, 1)), name="c2"), name="sum")
    y = og.flatten(og.sigmoid(og.relu(s, name="act1"), name="act2"), 1, name="flat")
    y = og.linear(y, param("fc.weight", (5, y.shape[1])), param("fc.bias", (5,)), name="fc")
    return Model(key="fan_out", spec_key="fan_out", title="fan out", graph=g, input=x, output=y,
                 params=params, first_conv_input=x, seed_batch=batch, batch=batch, dtype="float32")


@pytest.fixture
def setup():
    tg = training_graph(fan_out_model())
    feeds = random_feeds(tg.model, seed=2)
    return tg, feeds, check.Reference(tg, feeds, "cpu")


def fused_steps(exe):
    return [(i, st) for i, st in enumerate(exe.steps) if st.op.op.name == "FusedElementwise"]


def test_fused_chains_pass_the_per_node_check(setup):
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy=FUSE_ON_CPU)
    fused = fused_steps(exe)
    assert len(fused) >= 2
    res = check.check_lowering(exe, ref)
    assert res.passed, res.failures
    assert res.nodes_checked == sum(st.op.op.name in check.CHECKED_OPS for st in exe.steps)
    assert res.max_rel_error < 1e-5


def test_a_broken_fused_kernel_is_caught(setup):
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy=FUSE_ON_CPU)
    for i, good in fused_steps(exe):
        broken = list(exe.steps)
        broken[i] = attrs.evolve(good, kernel=lambda ctx, op, *a, k=good.kernel: k(ctx, op, *a) * 1.001)
        exe.steps, kept = broken, exe.steps
        res = check.check_lowering(exe, ref)
        exe.steps = kept
        assert not res.passed
        (f,) = res.failures
        assert (f["node"], f["op"]) == (good.name, "FusedElementwise")
        assert f["rel_error"] > f["tolerance"] == 1e-4  # 1e-3 off, measured on the terms' scale where it cancels


def test_recomputed_masks_are_checked_on_the_operands_they_were_fed():
    """bf16 MobileNet-v2 with ``bn-gradient-remat``'s chains (the ReLU6 of a batch
    norm recomputed from its rounded input in both backward passes): checked
    against the exact reference mask, 0.1 % of the masks flip and the sums were
    off by up to 1.4 %; on their own operands, and a float32 sum of bf16
    operands held to bf16's tolerance, every node passes."""
    from opgraph.benchmarks.models import build
    tg = training_graph(build("mobilenet_v2", batch=2))
    feeds = random_feeds(tg.model, seed=3)
    ref = check.Reference(tg, feeds, "cpu")
    exe = og.compile(tg.outputs, device="cpu", policy={"include": ["fused-reference"]}, dtype="bfloat16")
    remat = [st for st in exe.steps if check.recomputes_a_gradient_input(st.op.op)]
    assert len(remat) == 2 * 35  # every ReLU6's gradient, in both passes of its batch norm's backward
    res = check.check_lowering(exe, ref)
    assert res.passed, res.failures[:3]


def test_a_forward_chain_recomputes_no_gradient_input():
    from opgraph.ops.fused import fuse
    g = og.Graph()
    x = g.input("x", (2, 4, 3, 3))
    y = og.relu(og.add(x, x))
    gy = og.relu(og.mul(x, x))
    forward, _ = fuse(g, [g.input_ids(y.node)[0], y.node])
    assert not check.recomputes_a_gradient_input(forward)
    mask = g.apply(og.ops.ReluBackward, {}, [y, gy])
    backward, _ = fuse(g, [g.input_ids(y.node)[0], y.node, mask.node])
    assert check.recomputes_a_gradient_input(backward)
    assert not check.recomputes_a_gradient_input(og.ops.Relu())


def mlp_blocks_model(blocks: int, batch: int = 4) -> Model:
    """``blocks`` ConvNeXt-style MLPs with residuals, channels-last: matmul, bias add, GELU,
    matmul, bias add (each product between two reshapes, the biases as ``BroadcastAdd``, as the
    ONNX import writes a Linear). The reference keeps no value of the fused chains' (no checked
    op reads the GELU or its gradient directly: reshapes come between), so the check computes
    the members' values for each chain from kept ones."""
    g = og.Graph("mlp_blocks")
    x = g.input("data", (batch, 16, 16, 16))
    params, h = [], x

    def linear(h, w, b):  # as modern_blocks.convnext_block's: reshape, 2-D product, reshape, bias
        y = og.reshape(og.matmul(og.reshape(h, (-1, h.shape[-1])), w), (*h.shape[:-1], w.shape[1]))
        return g.apply(og.ops.BroadcastAdd, {}, [y, b])

    for k in range(blocks):
        w1, b1 = g.param(f"fc{k}.w1", (16, 64)), g.param(f"fc{k}.b1", (64,))
        w2, b2 = g.param(f"fc{k}.w2", (64, 16)), g.param(f"fc{k}.b2", (16,))
        params += [w1, b1, w2, b2]
        u = og.gelu(linear(h, w1, b1))
        h = og.add(h, linear(u, w2, b2))
    return Model(key="mlp_blocks", spec_key="mlp_blocks", title="MLP blocks", graph=g, input=x, output=h,
                 params=params, first_conv_input=x, seed_batch=batch, batch=batch, dtype="float32")


def test_values_the_reference_does_not_keep_are_not_held_past_their_step():
    """The fused chains' members the reference does not keep (bias adds, GELUs, their gradients)
    are computed for the step that reads them and dropped after it: the check's peak does not
    grow with the depth (kept for the whole check, they held about 42 GB of float64 on
    ConvNeXt-tiny at batch 128 and ran an H100 out of memory)."""
    import tracemalloc

    peaks = []
    for blocks in (2, 8):
        tg = training_graph(mlp_blocks_model(blocks))
        feeds = random_feeds(tg.model, seed=0)
        ref = check.Reference(tg, feeds, "cpu")
        exe = og.compile(tg.outputs, policy=FUSE_ON_CPU)
        assert any("bias add(s) recomputed" in n and "fused" in n for n in exe.report.notes), exe.report.notes
        tracemalloc.start()
        res = check.check_lowering(exe, ref)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert res.passed, res.failures
    product = 4 * 16 * 16 * 64 * 8  # one block's product in float64
    assert peaks[1] < peaks[0] + 2 * product, (peaks, product)
