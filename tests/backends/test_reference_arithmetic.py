"""Div and Neg on the reference kernels (ONNX ``Div``, ``Neg``): broadcasting, IEEE
division, integer truncation toward zero as ``onnx.reference``, half storage."""

import ml_dtypes
import numpy as np
import pytest

from opgraph.backends.reference import arithmetic as ar
from opgraph.errors import ShapeError


def test_div_broadcasts_and_follows_ieee():
    a = np.array([[1.0, -1.0, 0.0], [6.0, 3.0, 1.5]])
    b = np.array([[0.0], [3.0]])
    with np.errstate(divide="ignore", invalid="ignore"):
        y = ar.div(np, a, b)
    np.testing.assert_array_equal(y, [[np.inf, -np.inf, np.nan], [2.0, 1.0, 0.5]])
    with pytest.raises(ShapeError, match="do not broadcast"):
        ar.div(np, np.ones((2, 3)), np.ones((2, 2)))


def test_integer_div_truncates_toward_zero_as_onnx():
    onnx_reference = pytest.importorskip("onnx.reference")
    from onnx import helper, TensorProto

    a = np.array([7, -7, 7, -7, 6, 0], np.int64)
    b = np.array([2, 2, -2, -2, 3, 5], np.int64)
    node = helper.make_node("Div", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "div", [helper.make_tensor_value_info(n, TensorProto.INT64, [6])
                                               for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [6])])
    (want,) = onnx_reference.ReferenceEvaluator(helper.make_model(graph)).run(None, {"a": a, "b": b})
    got = ar.div(np, a, b)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [3, -3, -3, 3, 2, 0])


@pytest.mark.parametrize("storage", [np.float16, ml_dtypes.bfloat16])
def test_half_division_rounds_the_float32_quotient_once(storage):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(100).astype(storage), (1 + rng.random(100)).astype(storage)
    y = ar.div(np, a, b)
    assert y.dtype == storage
    np.testing.assert_array_equal(y, (a.astype(np.float32) / b.astype(np.float32)).astype(storage))


def test_neg():
    x = np.array([1.0, -0.0, np.inf, np.nan])
    y = ar.neg(np, x)
    np.testing.assert_array_equal(y, [-1.0, 0.0, -np.inf, np.nan])
    assert not np.signbit(y[1])  # -(-0.0) is +0.0
