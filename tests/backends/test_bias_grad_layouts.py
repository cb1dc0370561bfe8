"""The CUDA bias gradient's code written against ``xp`` (channels-last
``method='gemv'``, NCHW under ``BIAS_GRAD_SUM_BELOW`` elements): run on NumPy
against a float64 sum, in both layouts and several shapes. The default
column-sum kernel runs through a stand-in in test_cuda_colsum_launch.py, the
row and column kernels of a larger NCHW gradient in test_bf16_kernel_sources.py."""

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
def test_both_layouts_match_the_float64_sum(shape):
    assert np.prod(shape) < cuda_colsum.BIAS_GRAD_SUM_BELOW  # NCHW: the CuPy/NumPy sum
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
