"""The ``bn-backward-sums`` fusion rule (``passes/fuse_bn_backward.py``): where it
fires (cuda compiled without a GPU, cuDNN's checks stubbed, in float32 and
bfloat16 storage; the CPU), where it must not (excluded, a node forced
elsewhere, a missing sibling), the cancellation measurement that needs the
sums in float32, and whole training steps on the CPU against the float64
reference."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends.reference import batchnorm_training as bn
from opgraph.benchmarks.models import build
from opgraph.op import Lowered
from opgraph.types import numpy_dtype

from fused_training_steps import bottleneck, step_errors, step_failures, training_step
from passes_stubs import compile_for_cuda, cudnn_accepts

FUSED, UNFUSED = "BatchNormTrainingBackwardDataFromSums", "BatchNormTrainingBackwardData"
SUMS, ROW = "BatchNormTrainingBackwardSums", "BatchNormBackwardSumsRow"


def conv_bn_relu(affine=True):
    """conv -> training batch norm -> ReLU -> global pool: ``(y, params, extra)``."""
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8)), g.param("w", (8, 3, 3, 3))
    gamma, beta = (g.param("gamma", (8,)), g.param("beta", (8,))) if affine else (None, None)
    h = og.batch_norm(og.conv2d(x, w, padding=1), None, None, gamma, beta, training=True, name="bn")
    return og.flatten(og.adaptive_avg_pool2d(og.relu(h), 1)), [w, gamma, beta] if affine else [w], []


def conv_bn_relu_step(affine=True):
    """:func:`conv_bn_relu`'s output and every parameter's gradient."""
    y, params, _ = conv_bn_relu(affine)
    return [y, *og.grad(y, params, grad_outputs=[y])]


def kinds(graph, outs):
    return collections.Counter(v.op.op.name for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered))


def lowered_named(graph, outs, op_name):
    return [v for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered) and v.op.op.name == op_name]


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fires_on_a_conv_bn_relu_step_for_cuda(monkeypatch, layout, dtype):
    """One sums node read by the data gradient and by the two parameter
    gradients, which keep their names (they are outputs); all generated
    (``bn-gradient-remat``, which would take the ReLU's gradient into both, off)."""
    cudnn_accepts(monkeypatch)
    outs = conv_bn_relu_step()
    graph, louts, report = compile_for_cuda(outs, og.LoweringPolicy(layout=layout, exclude=["bn-gradient-remat"]),
                                            dtype=dtype)
    count = kinds(graph, louts)
    assert (count[FUSED], count[SUMS], count[ROW], count[UNFUSED]) == (1, 1, 2, 0)
    assert not count["BatchNormTrainingBackwardScale"] and not count["BiasAddBackward"]
    (dx,), (sums,) = lowered_named(graph, louts, FUSED), lowered_named(graph, louts, SUMS)
    assert dx.name == "bn.grad/batch_norm_training_backward_data" and graph.input_ids(dx.id)[3] == sums.id
    rows = {v.name: (v.op.op.row, graph.input_ids(v.id)[0]) for v in lowered_named(graph, louts, ROW)}
    assert rows == {"bn.grad/batch_norm_training_backward_scale": (1, sums.id), "bn.grad/bias_add_backward": (0, sums.id)}
    assert {v.op.algorithm for v in (*lowered_named(graph, louts, ROW), dx, sums)} == {"codegen"}
    assert [graph.node(v.node).name for v in louts[2:]] == ["bn.grad/batch_norm_training_backward_scale",
                                                           "bn.grad/bias_add_backward"]
    assert report.nodes[sums.name].op_type == SUMS and report.nodes[dx.name].op_type == FUSED
    assert "fuse: 1 batch-norm backward(s) sharing one pass of per-channel sums fused" in report.notes


@pytest.mark.parametrize("exclude", [["bn-backward-sums"], ["fused"]])
def test_excluded_it_leaves_the_data_gradient(monkeypatch, exclude):
    cudnn_accepts(monkeypatch)
    graph, louts, report = compile_for_cuda(conv_bn_relu_step(), og.LoweringPolicy(exclude=exclude),
                                            dtype="bfloat16")
    count = kinds(graph, louts)
    assert count[UNFUSED] == 1 and not count[FUSED] and not count[SUMS] and not count[ROW]


def test_a_missing_bias_gradient_leaves_it(monkeypatch):
    cudnn_accepts(monkeypatch)
    graph, louts, _ = compile_for_cuda(conv_bn_relu_step(affine=False))  # no weight, no bias: no sums anyway
    members = [m for v in graph.nodes_in_order(louts) if isinstance(v.op, Lowered)
               for m in getattr(v.op.op, "members", ())]
    assert not kinds(graph, louts)[FUSED] and not kinds(graph, louts)[SUMS]
    assert UNFUSED in members  # the element-wise chain took it


def test_a_node_forced_to_cudnn_stays(monkeypatch):
    """cuDNN's batch-norm backward has no from-sums kernel: the node keeps it."""
    import attrs
    from opgraph.backends import registry
    from passes_stubs import install_rule
    cudnn_accepts(monkeypatch)
    rule = registry.rules_for(ops.BatchNormTrainingBackwardData)["cudnn"]
    install_rule(monkeypatch, ops.BatchNormTrainingBackwardData, attrs.evolve(rule, check=lambda *a: None))
    policy = og.LoweringPolicy(force={"bn.grad/batch_norm_training_backward_data": "cudnn"})
    graph, louts, report = compile_for_cuda(conv_bn_relu_step(), policy)
    assert kinds(graph, louts)[UNFUSED] == 1 and not kinds(graph, louts)[SUMS]
    assert any("cudnn has no batch-norm backward from sums" in n for n in report.notes)


def test_a_sibling_forced_to_another_algorithm_stays(monkeypatch):
    """The bias gradient forced to our hand-written kernel: the rule would drop that choice."""
    cudnn_accepts(monkeypatch)
    policy = og.LoweringPolicy(force={"bn.grad/bias_add_backward": "cuda"})
    graph, louts, report = compile_for_cuda(conv_bn_relu_step(), policy, dtype="bfloat16")
    count = kinds(graph, louts)
    assert count["BiasAddBackward"] == 1 and not count[SUMS] and not count[FUSED]
    assert any("bn.grad/bias_add_backward is forced to cuda" in n for n in report.notes)


def test_one_per_affine_batch_norm_of_resnet50_in_bf16(monkeypatch):
    cudnn_accepts(monkeypatch)
    m = build("resnet50", batch=2)
    outs = [m.output, *og.grad(m.output, m.params, grad_outputs=[m.output])]
    bns = sum(v.op.name == "BatchNormTraining" and len(v.inputs) == 4 for v in m.graph.nodes_in_order(outs))
    graph, louts, _ = compile_for_cuda(outs, og.LoweringPolicy(layout="NHWC"), dtype="bfloat16")
    count = kinds(graph, louts)
    for v in graph.nodes_in_order(louts):  # a pass that took its gradient's making in (bn-gradient-remat)
        if isinstance(v.op, Lowered) and v.op.op.name == "FusedElementwise" and v.op.op.members[-1] in (FUSED, SUMS):
            count[v.op.op.members[-1]] += 1
    assert bns == 53 and (count[FUSED], count[SUMS], count[ROW]) == (53, 53, 106) and not count[UNFUSED]
    assert not count["BatchNormTrainingBackwardScale"]


def _cancelling(rng, x, stats, noise):
    """gy = a + b * xhat per channel plus ``noise``: dx is the noise's small remainder."""
    per_channel = (1, x.shape[1], 1, 1)
    xhat = (x - stats[0].reshape(per_channel)) / np.sqrt(stats[1].reshape(per_channel) + 1e-5)
    a, b = 3 * rng.standard_normal(per_channel), 3 * rng.standard_normal(per_channel)
    return a + b * xhat + noise * rng.standard_normal(x.shape)


def _relative_errors(dtype, x, gy, w, sums_in=None):
    """(unfused, fused) data gradients in storage ``dtype`` against the float64
    kernel on the same stored inputs (as the per-node check compares), relative
    to ||dx||; the fused one from the sums kernel's (2, C) sums, rounded to
    ``sums_in`` first when given (what the sums would be if kept in storage)."""
    xs, gs, ws = (a.astype(numpy_dtype(dtype)) for a in (x, gy, w))
    stats = bn.batch_norm_stats(np, xs)
    want = bn.batch_norm_training_backward_data(np, *(a.astype(np.float64) for a in (gs, xs, stats, ws)), eps=1e-5)
    unfused = bn.batch_norm_training_backward_data(np, gs, xs, stats, ws, eps=1e-5)
    sums = bn.batch_norm_training_backward_sums(np, xs, stats, gs, eps=1e-5)
    if sums_in is not None:
        sums = sums.astype(numpy_dtype(sums_in)).astype(sums.dtype)
    fused = bn.batch_norm_training_backward_data_from_sums(np, gs, xs, stats, sums, ws, eps=1e-5)
    return [np.linalg.norm(d.astype(np.float64) - want) / np.linalg.norm(want) for d in (unfused, fused)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_float32_sums_keep_dx_within_tolerance_where_it_cancels(dtype):
    """With gy nearly a + b * xhat per channel (noise 0.03 on a, b ~ 3) dx is a
    small difference. Measured (unfused, fused, fused with the sums rounded to
    the storage dtype): bf16 1.56e-3, 1.56e-3, 0.164; fp16 2.16e-4, 2.16e-4,
    1.58e-2; float32 6.5e-6, 7.3e-6, 7.3e-6 (random gy: bf16 1.7e-3, fp16
    2.0e-4, float32 6e-8 both). So the sums stay float32 for half storage."""
    from opgraph.passes.autotune import tolerance
    tol = tolerance("codegen", dtype=dtype)
    rng = np.random.default_rng(0)
    x = 1.5 * rng.standard_normal((8, 16, 7, 7)) + 0.3
    w = rng.standard_normal(16)
    assert max(_relative_errors(dtype, x, rng.standard_normal(x.shape), w)) < tol
    gy = _cancelling(rng, x, bn.batch_norm_stats(np, x), 0.03)
    unfused, fused = _relative_errors(dtype, x, gy, w)
    assert fused < tol and fused < 1.5 * unfused
    if dtype != "float32":  # the same sums rounded to half storage fail the tolerance
        assert _relative_errors(dtype, x, gy, w, sums_in=dtype)[1] > tol


@pytest.mark.parametrize("make", [conv_bn_relu, bottleneck], ids=["conv-bn-relu", "bottleneck"])
def test_a_bf16_training_step_with_the_rule_is_as_close_as_the_unfused_one(make):
    """The whole step in bf16 storage on the CPU's reference kernels, fused
    against unfused against float64 (the criterion of tests/fused_training_steps.py:
    a gradient's error under 2x the unfused one's + 3e-2)."""
    outs, feeds, n_grads = training_step(make, np.random.default_rng(0))
    on = og.compile(outs, dtype="bfloat16")
    off = og.compile(outs, dtype="bfloat16", policy={"exclude": ["bn-backward-sums"]})
    ref = og.compile(outs, pipeline="reference", dtype="float64")
    assert sum(st.op.op.name == SUMS for st in on.steps) == sum(st.op.op.name == UNFUSED for st in off.steps) > 0
    runs = [e(**feeds) for e in (on, off, ref)]
    assert not step_failures(*runs, n_grads, "bfloat16")
    assert all(fe < 0.5 for fe, _, _ in step_errors(*runs))  # a wrong kernel moves a gradient by ~1


def test_a_cpu_training_step_with_the_rule_equals_the_unfused_one():
    outs, feeds, n_grads = training_step(bottleneck, np.random.default_rng(0))
    on = og.compile(outs)
    off = og.compile(outs, policy={"exclude": ["bn-backward-sums"]})
    ref = og.compile(outs, pipeline="reference", dtype="float64")
    assert sum(st.op.op.name == FUSED for st in on.steps) == sum(st.op.op.name == SUMS for st in on.steps) == 4
    assert not any(st.op.op.name in (FUSED, SUMS) for st in off.steps)
    runs = [e(**feeds) for e in (on, off, ref)]
    assert not step_failures(*runs, n_grads, "float32")


def test_the_scope_order_stays_topological_after_the_rewrite(monkeypatch):
    """The data gradient comes before its siblings in graph order and now reads them:
    the table's scope re-sorts (``Scope.rewired``) so later rules sweep a valid order."""
    from opgraph.passes.base import PassContext
    from opgraph.passes.fuse_bn_backward import BN_BACKWARD_SUMS
    from opgraph.passes.pattern import apply_table
    cudnn_accepts(monkeypatch)
    graph, louts, _ = compile_for_cuda(conv_bn_relu_step(), og.LoweringPolicy(exclude=["bn-backward-sums"]))
    tallies, scope = apply_table([BN_BACKWARD_SUMS], graph, louts, PassContext(device="cuda"))
    assert [len(t.done) for t in tallies.values()] == [1]
    position = {n: k for k, n in enumerate(scope.order())}
    assert all(position[u] < position[n] for n in position for u in graph.input_ids(n) if u in position)


def test_the_rows_read_x_so_dx_may_overwrite_gy(monkeypatch):
    """The rows take their dtype from x, not gy: gy's last reader is then the
    data gradient, and the memory plan writes dx into gy's buffer on cuda (one
    buffer per batch-norm backward fewer than with rows reading gy). Without
    ``bn-gradient-remat``, which would leave no gy to overwrite."""
    cudnn_accepts(monkeypatch)
    policy = og.LoweringPolicy(layout="NHWC", exclude=["bn-gradient-remat"])
    graph, louts, _ = compile_for_cuda(conv_bn_relu_step(), policy, dtype="bfloat16")
    (dx,), rows = lowered_named(graph, louts, FUSED), lowered_named(graph, louts, ROW)
    x = graph.input_ids(dx.id)[1]
    assert len(rows) == 2 and all(graph.input_ids(r.id)[1] == x for r in rows)
    assert graph.inplace_plan.writes.get(dx.id) == 0  # into gy
