"""Local response norm (across channels) on the reference kernels: the window
rule for odd and even sizes, the alpha/size scaling, and the exact backward."""

import numpy as np
import pytest

from opgraph.backends.reference import lrn
from opgraph.errors import ParameterError, ShapeError

from central_differences import numgrad


def loop_lrn(x, size, alpha, beta, k):
    """Direct per-channel loop of SEMANTICS.md: window c - floor((size-1)/2) ..
    c + ceil((size-1)/2), both ends included, clipped."""
    c_count = x.shape[1]
    y = np.empty_like(x, dtype=np.float64)
    down, up = (size - 1) // 2, -((-(size - 1)) // 2)
    for c in range(c_count):
        lo, hi = max(0, c - down), min(c_count - 1, c + up)
        s = sum(x[:, j].astype(np.float64) ** 2 for j in range(lo, hi + 1))
        y[:, c] = x[:, c] / (k + alpha / size * s) ** beta
    return y


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 9])
@pytest.mark.parametrize("channels", [1, 4, 7])
def test_matches_direct_loop(size, channels):
    x = np.random.default_rng(size * 10 + channels).standard_normal((2, channels, 3, 2)) * 3
    kw = dict(size=size, alpha=0.5, beta=0.75, k=2.0)   # large alpha: the window matters
    np.testing.assert_allclose(lrn.local_response_norm(np, x, **kw), loop_lrn(x, **kw), rtol=1e-13)


def test_window_and_scaling_by_hand():
    # C=3, one pixel, x = (1, 2, 3); alpha=3, beta=1, k=1.
    x = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1)
    # size 3 (centred): sums 1+4, 1+4+9, 4+9; alpha/size = 1
    y = lrn.local_response_norm(np, x, size=3, alpha=3.0, beta=1.0, k=1.0)
    np.testing.assert_allclose(y.ravel(), [1 / 6, 2 / 15, 3 / 14], rtol=1e-15)
    # size 2 (ONNX): window c .. c+1; sums 1+4, 4+9, 9; alpha/size = 1.5
    y = lrn.local_response_norm(np, x, size=2, alpha=3.0, beta=1.0, k=1.0)
    np.testing.assert_allclose(y.ravel(), [1 / 8.5, 2 / 20.5, 3 / 14.5], rtol=1e-15)
    # size 4: window c-1 .. c+2; the divisor stays size even where clipped
    y = lrn.local_response_norm(np, x, size=4, alpha=4.0, beta=1.0, k=1.0)
    np.testing.assert_allclose(y.ravel(), [1 / 15, 2 / 15, 3 / 14], rtol=1e-15)


def test_one_channel_closed_form():
    x = np.random.default_rng(0).standard_normal((3, 1, 2, 2))
    y = lrn.local_response_norm(np, x, size=5, alpha=1e-4, beta=0.75, k=1.0)
    np.testing.assert_allclose(y, x / (1.0 + 1e-4 / 5 * x * x) ** 0.75, rtol=1e-14)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_backward_finite_differences(size):
    rng = np.random.default_rng(size)
    x = rng.standard_normal((2, 6, 2, 2))
    gy = rng.standard_normal(x.shape)
    kw = dict(size=size, alpha=0.7, beta=0.75, k=1.5)
    want = numgrad(lambda v: lrn.local_response_norm(np, v, **kw), x, gy)
    np.testing.assert_allclose(lrn.local_response_norm_backward(np, x, gy, **kw), want,
                               rtol=1e-6, atol=1e-8)


def test_two_dimensional_input_and_batch_zero():
    x = np.random.default_rng(1).standard_normal((4, 5))
    kw = dict(size=3, alpha=0.5, beta=0.75, k=1.0)
    np.testing.assert_allclose(lrn.local_response_norm(np, x, **kw), loop_lrn(x, **kw), rtol=1e-13)
    e = np.zeros((0, 5, 3, 3))
    assert lrn.local_response_norm(np, e, **kw).shape == e.shape
    assert lrn.local_response_norm_backward(np, e, e, **kw).shape == e.shape


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_dtype_is_kept(dtype):
    x = np.random.default_rng(2).standard_normal((2, 5, 3, 3))
    kw = dict(size=5, alpha=1e-2, beta=0.75, k=2.0)
    y = lrn.local_response_norm(np, x.astype(dtype), **kw)
    assert y.dtype == dtype
    np.testing.assert_allclose(y, loop_lrn(x.astype(dtype), **kw), rtol=2e-3 if dtype == np.float16 else 1e-6)
    assert lrn.local_response_norm_backward(np, x.astype(dtype), x.astype(dtype), **kw).dtype == dtype


def test_bad_input_raises():
    with pytest.raises(ParameterError, match="size"):
        lrn.local_response_norm(np, np.zeros((1, 3, 2, 2)), size=0, alpha=1e-4, beta=0.75, k=1.0)
    with pytest.raises(ShapeError):
        lrn.local_response_norm(np, np.zeros(3), size=3, alpha=1e-4, beta=0.75, k=1.0)
    with pytest.raises(ShapeError):
        lrn.local_response_norm_backward(np, np.zeros((1, 3, 2, 2)), np.zeros((1, 3, 2, 1)),
                                         size=3, alpha=1e-4, beta=0.75, k=1.0)
