"""SEMANTICS.md rules of the modern-convnet activations on the reference kernels:
ReLU6 / hardtanh bounds, hardsigmoid's alpha/beta (ONNX's 0.2 default),
hardswish at +-3, sigmoid without overflow, NaN, half storage computed in
float32; every derivative kernel against central differences."""

import ml_dtypes
import numpy as np
import pytest

from opgraph.backends.reference import activation as act

from central_differences import numgrad

SPECIAL = np.array([-np.inf, -1e4, -7.0, -3.0, -0.5, 0.0, 0.5, 3.0, 6.0, 7.0, 1e4, np.inf, np.nan])


def test_relu6_values_and_gradient_at_the_bounds():
    """clip(x, 0, 6); gradient 1 strictly inside (0, 6), 0 at 0 and 6, outside, and at NaN."""
    y = act.hardtanh(np, SPECIAL, min_val=0.0, max_val=6.0)
    np.testing.assert_array_equal(y, [0, 0, 0, 0, 0, 0, 0.5, 3, 6, 6, 6, 6, np.nan])
    gy = np.full(SPECIAL.shape, np.inf)  # an infinite gradient at a blocked position gives 0, not NaN
    g = act.hardtanh_backward(np, SPECIAL, gy, min_val=0.0, max_val=6.0)
    np.testing.assert_array_equal(g, np.where((SPECIAL > 0) & (SPECIAL < 6), np.inf, 0.0))
    assert g[5] == 0 and g[8] == 0 and g[-1] == 0


def test_hardsigmoid_reads_alpha_and_beta():
    """PyTorch's 1/6 and ONNX's default 0.2 give different values; the gradient is
    alpha strictly inside 0 < alpha x + beta < 1 and 0 at the corners."""
    x = np.array([-3.0, -2.5, 0.0, 2.0, 2.5, 3.0])
    np.testing.assert_allclose(act.hardsigmoid(np, x, alpha=1 / 6, beta=0.5),
                               np.clip(x / 6 + 0.5, 0, 1), rtol=1e-15)
    np.testing.assert_allclose(act.hardsigmoid(np, x, alpha=0.2, beta=0.5), [0, 0, 0.5, 0.9, 1, 1],
                               rtol=1e-15)
    g = act.hardsigmoid_backward(np, x, np.ones_like(x), alpha=0.2, beta=0.5)
    np.testing.assert_array_equal(g, [0, 0, 0.2, 0.2, 0, 0])  # 0.2 * 2.5 + 0.5 = 1 is a corner
    g = act.hardsigmoid_backward(np, x, np.ones_like(x), alpha=1 / 6, beta=0.5)
    np.testing.assert_array_equal(g, [0, 1 / 6, 1 / 6, 1 / 6, 1 / 6, 0])


def test_hardswish_and_its_derivatives_at_plus_minus_three():
    """PyTorch's hardswish_backward: 0 at and below -3, 1 at and above 3, x/3 + 1/2
    strictly between; the second derivative 1/3 strictly between."""
    x = np.array([-4.0, -3.0, -1.5, 0.0, 1.5, 3.0, 4.0])
    np.testing.assert_allclose(act.hardswish(np, x), x * np.clip(x + 3, 0, 6) / 6, rtol=1e-15)
    ones = np.ones_like(x)
    np.testing.assert_allclose(act.hardswish_backward(np, x, ones), [0, 0, 0, 0.5, 1, 1, 1], rtol=1e-15)
    np.testing.assert_allclose(act.hardswish_backward(np, x, ones, order=2), [0, 0, 1 / 3, 1 / 3, 1 / 3, 0, 0],
                               rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_sigmoid_and_silu_do_not_overflow(dtype):
    """exp(-|x|) only: no overflow or NaN, exact 0 / 1 limits, finite derivatives."""
    x = np.array([-1e4, -800.0, -100.0, -20.0, 0.0, 20.0, 100.0, 800.0, 1e4]).astype(dtype)
    x = x[np.isfinite(x)]
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is right
        s = act.sigmoid(np, x)
        d = act.sigmoid_backward(np, x, np.ones_like(x))
        d2 = act.sigmoid_backward(np, x, np.ones_like(x), order=2)
        y = act.silu(np, x)
        dy = act.silu_backward(np, x, np.ones_like(x))
    assert s.dtype == dtype and s[0] == 0 and s[-1] == 1 and s[len(x) // 2] == 0.5
    assert np.all(np.isfinite(d)) and np.all(np.isfinite(d2)) and np.all(np.isfinite(y))
    assert y[-1] == x[-1] and y[0] == 0 and dy[-1] == 1 and dy[0] == 0


def test_nan_propagates_through_every_forward_kernel():
    x = np.array([np.nan, 1.0])
    for fn, kw in [(act.hardtanh, dict(min_val=0.0, max_val=6.0)), (act.hardsigmoid, dict(alpha=0.2, beta=0.5)),
                   (act.hardswish, {}), (act.sigmoid, {}), (act.silu, {}), (act.gelu, {}),
                   (act.gelu, dict(approximate="tanh"))]:
        y = fn(np, x, **kw)
        assert np.isnan(y[0]) and np.isfinite(y[1]), fn.__name__


KERNELS = {  # name -> (forward, backward, params, orders)
    "hardtanh": (act.hardtanh, act.hardtanh_backward, dict(min_val=-1.5, max_val=2.0), (1,)),
    "hardsigmoid": (act.hardsigmoid, act.hardsigmoid_backward, dict(alpha=0.2, beta=0.5), (1,)),
    "hardswish": (act.hardswish, act.hardswish_backward, {}, (1, 2)),
    "sigmoid": (act.sigmoid, act.sigmoid_backward, {}, (1, 2)),
    "silu": (act.silu, act.silu_backward, {}, (1, 2)),
    "gelu": (act.gelu, act.gelu_backward, dict(approximate="none"), (1, 2)),
    "gelu_tanh": (act.gelu, act.gelu_backward, dict(approximate="tanh"), (1, 2)),
}


def _away_from_kinks(x):
    for k in (-3.0, -1.5, -1.0, 0.0, 1.0, 2.0, 2.5, 3.0):
        x = np.where(np.abs(x - k) < 1e-3, k + 0.1, x)
    return x


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_derivative_kernels_against_central_differences(name):
    """order 1 is the derivative of the forward kernel, order 2 that of order 1."""
    forward, backward, params, orders = KERNELS[name]
    rng = np.random.default_rng(0)
    x = _away_from_kinks(3 * rng.standard_normal((3, 7)))
    gy = rng.standard_normal(x.shape)
    np.testing.assert_allclose(backward(np, x, gy, **params),
                               numgrad(lambda v: forward(np, v, **params), x, gy), atol=1e-7)
    if 2 in orders:
        first = lambda v: backward(np, v, np.ones_like(v), **params)  # noqa: E731  f'(x)
        np.testing.assert_allclose(backward(np, x, gy, order=2, **params), numgrad(first, x, gy), atol=1e-7)


@pytest.mark.parametrize("storage", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_half_storage_computes_in_float32_and_rounds_once(name, storage):
    forward, backward, params, orders = KERNELS[name]
    rng = np.random.default_rng(1)
    x = (3 * rng.standard_normal(64)).astype(storage)
    gy = rng.standard_normal(64).astype(storage)
    y = forward(np, x, **params)
    assert y.dtype == storage
    np.testing.assert_array_equal(y, forward(np, x.astype(np.float32), **params).astype(storage))
    for order in orders:
        kw = dict(params, **({"order": order} if len(orders) > 1 else {}))
        g = backward(np, x, gy, **kw)
        assert g.dtype == storage
        want = backward(np, x.astype(np.float32), gy.astype(np.float32), **kw).astype(storage)
        np.testing.assert_array_equal(g, want)
