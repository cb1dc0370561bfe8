"""The fuse pass's convolution epilogues (residual add, ReLU6) and backward-data
with its ReLU gradient, on the CPU algorithms: which chains it finds, what it
leaves alone, and that the fused graph computes what the unfused one does."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.op import Lowered
from opgraph.passes.fuse import dgrad_relu_pairs, epilogue_chains


def _conv(x, c_out, name, g, k=3, padding=1):
    w = g.param(f"{name}.w", (c_out, x.shape[1], k, k))
    b = g.param(f"{name}.b", (c_out,))
    return og.conv2d(x, w, b, padding=padding, name=name)


def resnet_blocks(blocks: int = 1, shortcut_first: bool = False):
    """``blocks`` basic blocks ``relu(conv(relu(conv(h))) + h)`` on 4 channels,
    a head so that no block output is the graph's output, every gradient."""
    g = og.Graph()
    h = g.input("x", (2, 4, 6, 6))
    for i in range(blocks):
        a = og.relu(_conv(h, 4, f"b{i}.conv1", g), name=f"b{i}.relu1")
        c = _conv(a, 4, f"b{i}.conv2", g)
        s = og.add(h, c, name=f"b{i}.add") if shortcut_first else og.add(c, h, name=f"b{i}.add")
        h = og.relu(s, name=f"b{i}.relu2")
    y = og.flatten(og.max_pool2d(h, 2, name="head"))
    return g, y


def mobilenet_block(training: bool = True):
    """``relu6(conv)`` then a 1x1 conv and a ReLU6 head (MobileNet's activations)."""
    g = og.Graph()
    x = g.input("x", (2, 3, 6, 6))
    a = og.relu6(_conv(x, 4, "conv1", g), name="act1")
    y = og.flatten(og.relu6(_conv(a, 4, "conv2", g, k=1, padding=0), name="act2"))
    return g, y


def training(g, y):
    return [y, *og.grad(y, [s.output for s in g.sources("param")])]


def feeds_for(outs, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    g = outs[0].graph
    return {s.name: scale * rng.standard_normal(s.type.shape) for s in g.sources() if s.op.role != "grad"}


def labelled(g, chains):
    return [(g.node(c.conv).name, None if c.add is None else g.node(c.add).name, g.node(c.act).name,
             c.activation) for c in chains]


@pytest.mark.parametrize("shortcut_first", [False, True])
def test_finds_the_residual_chain_in_either_operand_order(shortcut_first):
    g, y = resnet_blocks(shortcut_first=shortcut_first)
    outs = training(g, y)
    assert labelled(g, epilogue_chains(g, outs)) == [
        ("b0.conv1", None, "b0.relu1", "relu"), ("b0.conv2", "b0.add", "b0.relu2", "relu")]


def test_finds_relu6_chains_in_training_graphs():
    """ReLU6's gradient reads its input, the pre-activation: a reader the fused
    output replaces (the same mask), so training graphs qualify."""
    g, y = mobilenet_block()
    assert labelled(g, epilogue_chains(g, training(g, y))) == [
        ("conv1", None, "act1", "relu6"), ("conv2", None, "act2", "relu6")]


def test_leaves_chains_whose_intermediates_are_read_or_wanted():
    g, y = resnet_blocks()
    conv2, add = g["b0.conv2"], g["b0.add"]
    assert [c.act for c in epilogue_chains(g, [y, conv2])] == [g["b0.relu1"].node]  # the conv wanted
    assert [c.act for c in epilogue_chains(g, [y, add])] == [g["b0.relu1"].node]  # the sum wanted
    extra = og.add(og.flatten(add), og.flatten(add), name="again")  # the sum read elsewhere
    assert [c.act for c in epilogue_chains(g, [y, extra])] == [g["b0.relu1"].node]
    h = og.Graph()
    x, w, b = h.input("x", (1, 2, 4, 4)), h.param("w", (2, 2, 1, 1)), h.param("b", (2,))
    c = og.conv2d(x, w, b, name="c")
    twice = og.relu(og.add(c, c, name="twice"), name="r")  # the conv is both operands: no residual
    clipped = og.hardtanh(og.conv2d(x, w, b, name="c2"), -1.0, 1.0, name="t")  # not ReLU6
    out = og.concat([og.flatten(twice), og.flatten(clipped)], dim=1)
    assert epilogue_chains(h, [out]) == []


def test_dgrad_relu_pairs_only_when_the_input_gradient_is_private():
    g, y = mobilenet_block()
    outs = training(g, y)
    assert dgrad_relu_pairs(g, outs) == []  # ReLU6: its gradient is not a ReluBackward
    g, y = resnet_blocks()
    outs = training(g, y)
    pairs = [(g.node(d).op.name, g.node(r).op.name) for d, r in dgrad_relu_pairs(g, outs)]
    # conv2 reads relu1's output alone: its input gradient is masked by relu1's; relu2's output is read
    # by the head only (the block input x needs no gradient)
    assert pairs == [("Conv2dBackwardData", "ReluBackward")]
    g2, y2 = resnet_blocks(blocks=2)
    # block 1 reads block 0's output twice (conv1 and the shortcut): that ReLU's gradient masks a
    # sum, not a backward-data; each block's relu1 masks its conv2's input gradient
    masks = [g2.node(g2.input_ids(r)[0]).name for _, r in dgrad_relu_pairs(g2, training(g2, y2))]
    assert sorted(masks) == ["b0.relu1", "b1.relu1"]


ALGORITHMS = ["gemm", "direct", "fft", "winograd"]


def _compare(outs, feeds, algorithm, want_fused):
    policy = og.LoweringPolicy(prefer={"conv": [algorithm]})
    exe = og.compile(outs, policy=policy)
    fused = sorted(st.op.op.name for st in exe.steps if st.op.op.fused and st.op.family == "conv")
    assert fused == sorted(want_fused)
    assert algorithm in {st.op.algorithm for st in exe.steps if st.op.op.fused}  # (winograd declines 1x1)
    off = og.compile(outs, policy=og.LoweringPolicy(prefer={"conv": [algorithm]}, exclude=["fused"]))
    assert not any(st.op.op.fused for st in off.steps)
    gy = {outs[0]: np.random.default_rng(9).standard_normal(outs[0].shape)}
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs=gy, **feeds)
    got, unfused = exe(grad_outputs=gy, **feeds), off(grad_outputs=gy, **feeds)
    for a, b, want in zip(got, unfused, ref):
        scale = np.linalg.norm(want) or 1.0
        assert np.linalg.norm(a - want) / scale < 1e-4
        assert np.linalg.norm(a - b) / scale < 1e-4
    return exe


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_resnet_blocks_fused_compute_the_unfused_values(algorithm):
    """Two chained blocks: the second's residual is the first's fused ReLU
    output (a node an earlier rewrite replaced)."""
    g, y = resnet_blocks(blocks=2)
    outs = training(g, y)
    exe = _compare(outs, feeds_for(outs), algorithm, ["Conv2dBiasRelu"] * 2 + ["Conv2dBiasActivation"] * 2
                   + ["Conv2dBackwardDataRelu"] * 2)
    for i in range(2):
        op = exe.graph[f"b{i}.conv2"].op.op
        assert (op.activation, op.residual) == ("relu", True)
        assert f"b{i}.add" not in exe.graph and f"b{i}.relu2" not in exe.graph
    assert exe.graph["b1.conv2"].op.op.name == "Conv2dBiasActivation"
    assert any("2 conv + bias + add + relu chain(s) fused" in n for n in exe.report.notes)
    assert any("2 backward-data + relu backward pair(s) fused" in n for n in exe.report.notes)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_relu6_blocks_fused_compute_the_unfused_values(algorithm):
    g, y = mobilenet_block()
    outs = training(g, y)
    feeds = feeds_for(outs, scale=3.0)  # pre-activations on both sides of both bounds
    exe = _compare(outs, feeds, algorithm, ["Conv2dBiasActivation"] * 2)
    assert {exe.graph[n].op.op.activation for n in ("conv1", "conv2")} == {"relu6"}
    assert "act1" not in exe.graph and any("2 conv + bias + relu6 chain(s) fused" in n for n in exe.report.notes)


def test_inference_resnet_block_is_one_fused_node():
    g, y = resnet_blocks()
    exe = og.compile([y])
    kinds = [st.op.op.name for st in exe.steps]
    assert "Add" not in kinds and "Relu" not in kinds
    node = exe.graph.node(exe.graph["b0.conv2"].node)
    # conv1 took relu1's place (fused), the residual is the block input
    assert [v.name for v in node.inputs] == ["b0.conv1", "b0.conv2.w", "b0.conv2.b", "x"]
    feeds = feeds_for([y])
    (want,) = og.compile([y], pipeline="reference", dtype="float64")(**feeds)
    (got,) = exe(**feeds)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_a_forced_add_keeps_the_chain_unfused():
    g, y = resnet_blocks()
    outs = training(g, y)
    exe = og.compile(outs, policy=og.LoweringPolicy(prefer={"conv": ["gemm"]}, force={"b0.add": "reference"}))
    assert exe.graph["b0.conv2"].op.op.name == "Conv2d" and "b0.add" in exe.graph
    assert any("b0.add is forced to reference, b0.conv2 runs gemm" in n for n in exe.report.notes)


def test_fused_nodes_are_lowered_and_reported_under_the_convolution():
    g, y = resnet_blocks()
    exe = og.compile(training(g, y))
    rec = exe.report.node("b0.conv2")
    assert rec.op_type == "Conv2dBiasActivation" and "residual=True" in rec.op
    assert exe.report.nodes.get("b0.add") is None and exe.report.nodes.get("b0.relu2") is None
    assert all(isinstance(v.op, Lowered) for v in exe.graph.nodes_in_order(exe.outputs)
               if v.op.name not in ("Input", "Param", "Grad"))
