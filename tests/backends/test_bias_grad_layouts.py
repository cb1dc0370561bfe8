"""The CUDA bias-gradient kernel's matrix-product formulation is written against
``xp``: run it on NumPy against a float64 sum, in both layouts and several
shapes (channels-last: ``method='gemv'``; the default column-sum kernel runs
through a stand-in in test_cuda_colsum_launch.py)."""

import numpy as np
import pytest

from opgraph.backends.cuda import colsum as cuda_colsum
from opgraph.backends.cuda.colsum import bias_add_backward
from opgraph.errors import ShapeError


def _channels_last(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("shape", [
    (2, 3, 8, 16),
    (1, 5, 1, 257),
    (3, 7, 5, 5),
    (4, 16, 20, 30),
])
@pytest.mark.parametrize("sum_below", [0, 2 ** 40])  # NCHW: products, CuPy/NumPy sum
def test_both_layouts_match_the_float64_sum(shape, sum_below, monkeypatch):
    monkeypatch.setattr(cuda_colsum, "BIAS_GRAD_SUM_BELOW", sum_below)
    g = np.random.default_rng(0).standard_normal(shape)
    want = g.sum(axis=(0, 2, 3))
    np.testing.assert_allclose(bias_add_backward(np, g), want, rtol=1e-12)
    got = bias_add_backward(np, _channels_last(g), method="gemv")
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got.shape == (shape[1],)


def test_other_ranks_empty_and_bad_input():
    g = np.random.default_rng(1).standard_normal((3, 4, 5))
    np.testing.assert_allclose(bias_add_backward(np, g), g.sum(axis=(0, 2)), rtol=1e-12)
    np.testing.assert_array_equal(bias_add_backward(np, np.zeros((0, 4, 2, 2))), np.zeros(4))
    with pytest.raises(ShapeError, match="channel axis"):
        bias_add_backward(np, np.zeros(3))
