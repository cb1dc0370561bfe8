"""Linear and matmul on the reference kernels against einsum in float64."""

import numpy as np
import pytest

from opgraph.backends.reference import linear
from opgraph.errors import ShapeError


def test_linear_matches_einsum():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((5, 7)), rng.standard_normal((3, 7)), rng.standard_normal(3)
    want = np.einsum("ni,oi->no", x, w) + b
    np.testing.assert_allclose(linear.linear(np, x, w, b), want, rtol=1e-13)
    np.testing.assert_allclose(linear.linear(np, x, w), want - b, rtol=1e-12, atol=1e-14)


def test_zero_in_features_gives_the_bias():
    b = np.array([1.0, -2.0, 3.0])
    y = linear.linear(np, np.zeros((4, 0)), np.zeros((3, 0)), b)
    np.testing.assert_array_equal(y, np.tile(b, (4, 1)))


def test_batch_size_zero():
    assert linear.linear(np, np.zeros((0, 4)), np.ones((3, 4)), np.ones(3)).shape == (0, 3)
    assert linear.matmul(np, np.zeros((0, 4)), np.ones((4, 2)), transpose_a=False,
                         transpose_b=False).shape == (0, 2)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_transposes(ta, tb):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    a_in = a.T.copy() if ta else a
    b_in = b.T.copy() if tb else b
    got = linear.matmul(np, a_in, b_in, transpose_a=ta, transpose_b=tb)
    np.testing.assert_allclose(got, np.einsum("ik,kj->ij", a, b), rtol=1e-13)


def test_fp16_multiplies_in_fp32():
    x = np.full((1, 4096), 0.1, dtype=np.float16)
    w = np.ones((1, 4096), dtype=np.float16)
    y = linear.linear(np, x, w)
    assert y.dtype == np.float16
    np.testing.assert_allclose(float(y[0, 0]), 4096 * float(np.float16(0.1)), rtol=1e-3)


def test_shape_errors():
    with pytest.raises(ShapeError):
        linear.linear(np, np.zeros((2, 3)), np.zeros((4, 5)))
    with pytest.raises(ShapeError):
        linear.linear(np, np.zeros((2, 3)), np.zeros((4, 3)), np.zeros(3))
    with pytest.raises(ShapeError):
        linear.matmul(np, np.zeros((2, 3)), np.zeros((2, 3)), transpose_a=False, transpose_b=False)
