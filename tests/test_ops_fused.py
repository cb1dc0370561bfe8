"""``FusedElementwise`` (opgraph/ops/fused.py): building one from graph nodes
with ``fuse`` as the fusion pass will, putting it in the graph with
``Graph.rewrite``, and running it on the CPU (its reference rule runs the
members' reference kernels), against the unfused graph; the program's
checks and the stacked output of several reductions."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import NotDifferentiableError, OpgraphError, ShapeError
from opgraph.ops.fused import FusedElementwise, FusedStep, Program, fuse
from opgraph.types import TensorType


def _bn_relu_graph():
    g = og.Graph()
    x = g.input("x", (2, 4, 3, 5))
    w, b = g.param("w", (4,)), g.param("b", (4,))
    y = og.relu(og.batch_norm(x, None, None, w, b, training=True, name="bn"), name="act")
    return g, x, w, b, y


def _feeds(rng):
    return dict(x=rng.standard_normal((2, 4, 3, 5)), w=rng.standard_normal(4), b=rng.standard_normal(4))


def test_fuse_nodes_rewrite_and_run_against_the_unfused_graph():
    g, x, w, b, y = _bn_relu_graph()
    rng = np.random.default_rng(0)
    feeds = _feeds(rng)
    (want,) = og.compile([y], dtype="float64")(**feeds)
    members = [g["bn/stats"].node, g["bn"].node, y.node]
    op, inputs = fuse(g, members)
    assert [v.name for v in inputs] == ["x", "w", "b"]
    assert op.members == ("BatchNormStats", "BatchNormTraining", "Relu") and op.fused
    assert op.describe() == "FusedElementwise(Relu(BatchNormTraining(eps=1e-05)(%0, BatchNormStats(%0), %1, %2)))"
    g.rewrite(y.node, op, inputs)
    exe = og.compile([y], dtype="float64")
    assert exe.report.node("act").algorithm == "reference"
    (got,) = exe(**feeds)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(OpgraphError, match="FusedElementwise is already fused"):
        fuse(g, [y.node])


def test_several_outputs_are_stacked_in_the_statistics_dtype():
    g = og.Graph()
    x, gy = g.input("x", (3, 4, 2, 2), "bfloat16"), g.input("gy", (3, 4, 2, 2), "bfloat16")
    stats = g.apply(ops.BatchNormStats, {}, [x])
    d = og.relu(gy)
    db = g.apply(ops.BiasAddBackward, {}, [d])
    dw = g.apply(ops.BatchNormTrainingBackwardScale, {"eps": 1e-5}, [x, stats, d])
    op, inputs = fuse(g, [d.node, db.node, dw.node], outputs=[db.node, dw.node])
    assert [v.name for v in inputs] == ["gy", "x", stats.name]
    assert op.infer(*(v.type for v in inputs)) == TensorType((2, 4), "float32")
    with pytest.raises(OpgraphError, match="2 members are read by no other member"):
        fuse(g, [d.node, db.node, dw.node])


def test_a_stacked_output_computes_each_row(monkeypatch):
    rng = np.random.default_rng(1)
    x, gy = rng.standard_normal((3, 4, 2, 2)), rng.standard_normal((3, 4, 2, 2))
    op = FusedElementwise(Program(2, [(ops.Relu(), (1,)), (ops.BiasAddBackward(), (2,)),
                                      (ops.Mean(axes=(0, 2, 3)), (0,))], (3, 4)))
    from opgraph.backends.registry import KernelContext, rules_for
    out = rules_for(FusedElementwise)["reference"].kernel(KernelContext(np), op, x, gy)
    np.testing.assert_allclose(out, [np.maximum(gy, 0).sum(axis=(0, 2, 3)), x.mean(axis=(0, 2, 3))])


def test_program_checks():
    relu = ops.Relu()
    with pytest.raises(OpgraphError, match="reads value 3"):
        Program(1, [FusedStep(relu, (0,)), FusedStep(relu, (3,))], 2)
    with pytest.raises(OpgraphError, match="outputs"):
        Program(1, [FusedStep(relu, (0,))], 5)
    with pytest.raises(OpgraphError, match="already fused"):
        Program(1, [FusedStep(FusedElementwise(Program(1, [(relu, (0,))], 1)), (0,))], 1)
    prog = Program(2, [(ops.Add(), (0, 1))], 2)
    with pytest.raises(ShapeError, match="fused step 0 \\(Add\\)"):
        FusedElementwise(prog).infer(TensorType((2, 3)), TensorType((3, 3)))
    with pytest.raises(ShapeError, match="cannot stack"):
        Program(1, [(relu, (0,)), (ops.BiasAddBackward(), (0,))], (1, 2)).output_type([TensorType((2, 3))])
    # equal programs are equal ops (the plan cache keys on them)
    assert FusedElementwise(prog) == FusedElementwise(Program(2, [(ops.Add(), (0, 1))], 2))
    assert hash(FusedElementwise(prog)) == hash(FusedElementwise(Program(2, [(ops.Add(), (0, 1))], 2)))


def test_a_fused_node_has_no_gradient_and_counts_its_members_flops():
    g, x, w, b, y = _bn_relu_graph()
    op, inputs = fuse(g, [g["bn"].node, y.node])
    types = [v.type for v in inputs]
    assert op.flops(types, y.type) == ops.BatchNormTraining().flops(
        (x.type, g["bn/stats"].type, w.type, b.type), y.type) + ops.Relu().flops((y.type,), y.type)
    g.rewrite(y.node, op, inputs)
    with pytest.raises(NotDifferentiableError, match="made after grad"):
        og.grad(y, [w])
