"""``BatchNormTrainingBackwardDataFromSums`` (the ``bn-backward-sums`` fuse
rule's op): shape inference, the errors naming the node and the input, and
that it is a fused op without a gradient rule."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import NotDifferentiableError, ShapeError
from opgraph.types import TensorType

X = TensorType((2, 3, 4, 4), "float32")
C = TensorType((3,), "float32")
STATS = TensorType((2, 3), "float32")


def test_infers_the_output_gradients_type_with_and_without_weight():
    op = ops.BatchNormTrainingBackwardDataFromSums(eps=1e-3)
    assert op.infer(X, X, STATS, C, C) == X
    assert op.infer(X, X, STATS, C, C, C) == X
    half = TensorType((2, 3, 4, 4), "bfloat16")  # half storage: stats in float32, sums in bf16
    assert op.infer(half, half, STATS, TensorType((3,), "bfloat16"), TensorType((3,), "bfloat16")) == half
    assert op.fused and op.family == "norm" and op.arity == (5, 6)
    assert op.flops((X,) * 5, X) == 6 * X.size


@pytest.mark.parametrize("inputs,match", [
    ((X, X, STATS, TensorType((4,)), C), r"sum_gy_xhat shape \(4,\) != \(C,\) = \(3,\)"),
    ((X, X, STATS, C, TensorType((3, 1))), r"sum_gy shape \(3, 1\) != \(C,\)"),
    ((X, X, STATS, C, C, TensorType((2,))), r"weight shape \(2,\) != \(C,\)"),
    ((TensorType((2, 3, 4, 5)), X, STATS, C, C), r"output gradient shape \(2, 3, 4, 5\) != input shape"),
    ((X, X, TensorType((3, 3)), C, C), r"stats must be float32\[2, 3\]"),
    ((X, X, STATS, TensorType((3,), "float64"), C), "mixed dtypes"),
])
def test_bad_inputs_are_named(inputs, match):
    with pytest.raises(ShapeError, match=match):
        ops.BatchNormTrainingBackwardDataFromSums().infer(*inputs)


def test_a_graph_node_names_itself_in_the_error_and_has_no_gradient():
    g = og.Graph()
    x, s = g.input("x", X.shape), g.input("s", (4,))
    stats = g.apply(ops.BatchNormStats, {}, [x])
    with pytest.raises(ShapeError, match=r"dx.*sum_gy_xhat shape \(4,\)"):
        g.apply(ops.BatchNormTrainingBackwardDataFromSums, {}, [x, x, stats, s, s], name="dx")
    sums = g.input("sums", (3,))
    dx = g.apply(ops.BatchNormTrainingBackwardDataFromSums, {}, [x, x, stats, sums, sums], name="dx")
    with pytest.raises(NotDifferentiableError, match="no gradient rule"):
        og.grad(dx, [x], grad_outputs=[x])
