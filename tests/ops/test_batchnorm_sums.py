"""The ops of the ``bn-backward-sums`` fuse rule (``opgraph/ops/batchnorm_sums.py``):
shape inference in every storage dtype (the sums in the statistics' dtype, the
rows in the storage dtype), the errors naming the node, the input and the
value, and that they are fused ops without a gradient rule."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import NotDifferentiableError, ParameterError, ShapeError
from opgraph.types import TensorType

X = TensorType((2, 3, 4, 4), "float32")
C = TensorType((3,), "float32")
STATS = TensorType((2, 3), "float32")
NEW_OPS = (ops.BatchNormTrainingBackwardSums, ops.BatchNormBackwardSumsRow, ops.BatchNormTrainingBackwardDataFromSums)


@pytest.mark.parametrize("storage,wide", [("float32", "float32"), ("bfloat16", "float32"),
                                          ("float16", "float32"), ("float64", "float64")])
def test_sums_are_wide_and_rows_and_dx_in_the_storage_dtype(storage, wide):
    x, stats = TensorType(X.shape, storage), TensorType((2, 3), wide)
    sums = ops.BatchNormTrainingBackwardSums(eps=1e-3).infer(x, stats, x)
    assert sums == TensorType((2, 3), wide)
    assert ops.BatchNormBackwardSumsRow(row=1).infer(sums, x) == TensorType((3,), storage)
    dx = ops.BatchNormTrainingBackwardDataFromSums()
    assert dx.infer(x, x, stats, sums) == x
    assert dx.infer(x, x, stats, sums, TensorType((3,), storage)) == x


def test_declarations_and_flops():
    assert all(t.fused and t.family == "norm" for t in NEW_OPS)
    assert ops.BatchNormTrainingBackwardDataFromSums.arity == (4, 5)
    assert ops.BatchNormTrainingBackwardSums().flops((X, STATS, X), STATS) == 5 * X.size
    assert ops.BatchNormTrainingBackwardDataFromSums().flops((X, X, STATS, STATS), X) == 6 * X.size
    assert ops.BatchNormBackwardSumsRow(row=0).flops((STATS, X), C) == 0


@pytest.mark.parametrize("op,inputs,match", [
    (ops.BatchNormTrainingBackwardDataFromSums(), (X, X, STATS, TensorType((2, 4))),
     r"sums must be float32\[2, 3\] \(sum\(gy\) and sum\(gy \* xhat\) of the 3 channels"),
    (ops.BatchNormTrainingBackwardDataFromSums(), (X, X, STATS, STATS, TensorType((2,))),
     r"weight shape \(2,\) != \(C,\)"),
    (ops.BatchNormTrainingBackwardDataFromSums(), (TensorType((2, 3, 4, 5)), X, STATS, STATS),
     r"output gradient shape \(2, 3, 4, 5\) != input shape"),
    (ops.BatchNormTrainingBackwardDataFromSums(), (X, X, TensorType((3, 3)), STATS), r"stats must be float32\[2, 3\]"),
    (ops.BatchNormTrainingBackwardDataFromSums(), (X, X, STATS, STATS, TensorType((3,), "float64")), "mixed dtypes"),
    (ops.BatchNormTrainingBackwardSums(), (X, STATS, TensorType((2, 3, 4, 5))),
     r"output gradient shape \(2, 3, 4, 5\) != input shape"),
    (ops.BatchNormTrainingBackwardSums(), (TensorType((3,)), STATS, TensorType((3,))), r"must be \(N, C, \.\.\.\)"),
    (ops.BatchNormBackwardSumsRow(row=0), (TensorType((2, 3), "bfloat16"), TensorType(X.shape, "bfloat16")),
     r"sums must be float32\[2, 3\].*got bfloat16\[2, 3\]"),
    (ops.BatchNormBackwardSumsRow(row=1), (STATS, TensorType((2, 4, 4, 4))), r"sums must be float32\[2, 4\]"),
])
def test_bad_inputs_are_named(op, inputs, match):
    with pytest.raises(ShapeError, match=match):
        op.infer(*inputs)


def test_a_row_outside_the_two_sums_is_refused():
    with pytest.raises(ParameterError, match=r"row.*2.*must be one of \(0, 1\)"):
        ops.BatchNormBackwardSumsRow(row=2)


def test_a_graph_node_names_itself_in_the_error_and_has_no_gradient():
    g = og.Graph()
    x, s = g.input("x", X.shape), g.input("s", (2, 4))
    stats = g.apply(ops.BatchNormStats, {}, [x])
    with pytest.raises(ShapeError, match=r"dx.*sums must be float32\[2, 3\]"):
        g.apply(ops.BatchNormTrainingBackwardDataFromSums, {}, [x, x, stats, s], name="dx")
    sums = g.apply(ops.BatchNormTrainingBackwardSums, {}, [x, stats, x], name="sums")
    dx = g.apply(ops.BatchNormTrainingBackwardDataFromSums, {}, [x, x, stats, sums], name="dx")
    dw = g.apply(ops.BatchNormBackwardSumsRow, {"row": 1}, [sums, x], name="dw")
    for out, name in ((dx, "dx"), (dw, "dw")):
        with pytest.raises(NotDifferentiableError, match=rf"node {name} .*made by the fuse pass"):
            og.grad(out, [x], grad_outputs=[out])
