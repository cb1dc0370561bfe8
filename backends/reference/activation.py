"""Reference (oracle) kernels of the modern-convnet activations and their derivatives.

Forward: ``hardtanh`` (ReLU6, ONNX ``Clip``), ``hardsigmoid``, ``hardswish``,
``sigmoid``, ``silu``, ``gelu``. Backward kernels take ``(x, gy)`` and return
``gy * f^(order)(x)`` (``order`` 1 or 2 where the op has the field). Formulas
and sources: ``opgraph/ops/activation.py`` and ``smooth_activation.py``;
rules: SEMANTICS.md, "Activations of modern convnets".

Every kernel takes the array module ``xp`` (numpy or cupy) first and returns
a fresh array of the input's shape and dtype. float16/bfloat16 compute in
float32 and round once (SEMANTICS.md, Numbers). Masks select with ``where``
rather than multiplying, so an infinite output gradient at a blocked position
gives 0, not NaN. A NaN input propagates to the output; in the piecewise
gradients it matches no mask and gives 0 (as ``relu_backward``).
"""

from __future__ import annotations

import math

from opgraph import ops
from opgraph.errors import ParameterError
from opgraph.types import compute_dtype, rounded

from .kernel import reference

_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_K = math.sqrt(2.0 / math.pi)  # GELU tanh approximation (Hendrycks & Gimpel 2016)
_TANH_C = 0.044715


def _in_compute(xp, *arrays):
    dt = compute_dtype(xp, arrays[0].dtype)
    return [a.astype(dt, copy=False) for a in arrays]


def _stored(y, like):
    return y.astype(like.dtype, copy=False)


def _order(order):
    if order not in (1, 2):
        raise ParameterError("order", order, "derivatives of order 1 and 2 are implemented")


def _clip(xp, x, lo, hi):
    """``min(max(x, lo), hi)``; NaN propagates (``maximum``/``minimum`` do)."""
    return xp.minimum(xp.maximum(x, lo), hi)


@reference(ops.Hardtanh)
def hardtanh(xp, x, *, min_val, max_val):
    """``clip(x, min_val, max_val)`` (ReLU6: 0, 6)."""
    (xc,) = _in_compute(xp, x)
    return _stored(_clip(xp, xc, min_val, max_val), x)


@reference(ops.HardtanhBackward)
def hardtanh_backward(xp, x, gy, *, min_val, max_val):
    """``gy`` where ``min_val < x < max_val`` strictly, else 0 (PyTorch ``hardtanh_backward``),
    the bounds rounded to x's storage dtype: ``x`` may be the Hardtanh's stored
    output, whose clipped elements hold the rounded bound (bf16(0.1) =
    0.10009766 > 0.1 would pass the mask otherwise)."""
    xc, g = _in_compute(xp, x, gy)
    lo, hi = (rounded(b, x.dtype.name) for b in (min_val, max_val))  # on the host: no device sync
    return _stored(xp.where((xc > lo) & (xc < hi), g, 0.0), gy)


@reference(ops.Hardsigmoid)
def hardsigmoid(xp, x, *, alpha, beta):
    """``clip(alpha * x + beta, 0, 1)``."""
    (xc,) = _in_compute(xp, x)
    return _stored(_clip(xp, xc * alpha + beta, 0.0, 1.0), x)


@reference(ops.HardsigmoidBackward)
def hardsigmoid_backward(xp, x, gy, *, alpha, beta):
    """``alpha * gy`` where ``0 < alpha * x + beta < 1`` strictly, else 0."""
    xc, g = _in_compute(xp, x, gy)
    t = xc * alpha + beta
    return _stored(xp.where((t > 0) & (t < 1), g * alpha, 0.0), gy)


@reference(ops.Hardswish)
def hardswish(xp, x):
    """``x * clip(x / 6 + 1/2, 0, 1)``."""
    (xc,) = _in_compute(xp, x)
    return _stored(xc * _clip(xp, xc * (1 / 6) + 0.5, 0.0, 1.0), x)


@reference(ops.HardswishBackward)
def hardswish_backward(xp, x, gy, *, order=1):
    """order 1: ``gy`` for ``x >= 3``, ``gy * (x/3 + 1/2)`` for ``-3 < x < 3``, else 0
    (PyTorch ``hardswish_backward``); order 2: ``gy / 3`` for ``-3 < x < 3``, else 0."""
    _order(order)
    xc, g = _in_compute(xp, x, gy)
    inside = (xc > -3) & (xc < 3)
    if order == 2:
        return _stored(xp.where(inside, g * (1 / 3), 0.0), gy)
    return _stored(xp.where(xc >= 3, g, xp.where(inside, g * (xc * (1 / 3) + 0.5), 0.0)), gy)


def _sigmoid_parts(xp, x):
    """``(s, s * (1 - s))`` from ``e = exp(-|x|) <= 1``: no overflow for any x, and
    ``s (1 - s) = e / (1 + e)^2`` keeps its precision where s is near 0 or 1."""
    e = xp.exp(-xp.abs(x))
    inv = 1.0 / (1.0 + e)
    s = xp.where(x >= 0, inv, e * inv)
    return s, e * inv * inv


@reference(ops.Sigmoid)
def sigmoid(xp, x):
    """``1 / (1 + exp(-x))`` for every x without overflow (NaN propagates)."""
    (xc,) = _in_compute(xp, x)
    return _stored(_sigmoid_parts(xp, xc)[0], x)


@reference(ops.SigmoidBackward)
def sigmoid_backward(xp, x, gy, *, order=1):
    """order 1: ``gy * s (1 - s)``; order 2: ``gy * s (1 - s) (1 - 2 s)``."""
    _order(order)
    xc, g = _in_compute(xp, x, gy)
    s, ds = _sigmoid_parts(xp, xc)
    return _stored(g * (ds if order == 1 else ds * (1.0 - 2.0 * s)), gy)


@reference(ops.Silu)
def silu(xp, x):
    """``x * sigmoid(x)``."""
    (xc,) = _in_compute(xp, x)
    return _stored(xc * _sigmoid_parts(xp, xc)[0], x)


@reference(ops.SiluBackward)
def silu_backward(xp, x, gy, *, order=1):
    """order 1: ``gy * (s + x s (1 - s))``; order 2: ``gy * s (1 - s) (2 + x (1 - 2 s))``."""
    _order(order)
    xc, g = _in_compute(xp, x, gy)
    s, ds = _sigmoid_parts(xp, xc)
    d = s + xc * ds if order == 1 else ds * (2.0 + xc * (1.0 - 2.0 * s))
    return _stored(g * d, gy)


def _erf(xp, x):
    """The error function on ``xp``'s arrays (NumPy has none: SciPy's, or CuPy's own)."""
    if xp.__name__.startswith("cupy"):
        from cupyx.scipy.special import erf
    else:
        from scipy.special import erf
    return erf(x)


def _gelu_tanh_parts(xp, x):
    """``(t, du)`` of the tanh approximation: ``t = tanh(u)``, ``du = u'``."""
    t = xp.tanh(_TANH_K * (x + _TANH_C * x * x * x))
    return t, _TANH_K * (1.0 + 3.0 * _TANH_C * x * x)


@reference(ops.Gelu)
def gelu(xp, x, *, approximate="none"):
    """``x * Phi(x)``, ``Phi(x) = (1 + erf(x / sqrt 2)) / 2`` (``'none'``), or
    ``x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2`` (``'tanh'``)."""
    (xc,) = _in_compute(xp, x)
    if approximate == "tanh":
        return _stored(0.5 * xc * (1.0 + _gelu_tanh_parts(xp, xc)[0]), x)
    return _stored(0.5 * xc * (1.0 + _erf(xp, xc * _SQRT_HALF)), x)


@reference(ops.GeluBackward)
def gelu_backward(xp, x, gy, *, approximate="none", order=1):
    """``gy * f^(order)(x)`` of :func:`gelu`. Exact: ``f' = Phi + x phi``,
    ``f'' = phi (2 - x^2)`` (phi the normal density). Tanh form, ``t = tanh(u)``:
    ``f' = (1 + t) / 2 + x (1 - t^2) u' / 2``,
    ``f'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2)`` with ``u'' = 6 c k x``."""
    _order(order)
    xc, g = _in_compute(xp, x, gy)
    if approximate == "tanh":
        t, du = _gelu_tanh_parts(xp, xc)
        sech2 = 1.0 - t * t
        if order == 1:
            d = 0.5 * (1.0 + t) + 0.5 * xc * sech2 * du
        else:
            d = sech2 * (du + 0.5 * xc * (6.0 * _TANH_C * _TANH_K * xc - 2.0 * t * du * du))
        return _stored(g * d, gy)
    phi = _INV_SQRT_2PI * xp.exp(-0.5 * xc * xc)
    if order == 1:
        d = 0.5 * (1.0 + _erf(xp, xc * _SQRT_HALF)) + xc * phi
    else:
        d = phi * (2.0 - xc * xc)
    return _stored(g * d, gy)


__all__ = ["hardtanh", "hardtanh_backward", "hardsigmoid", "hardsigmoid_backward", "hardswish",
           "hardswish_backward", "sigmoid", "sigmoid_backward", "silu", "silu_backward", "gelu",
           "gelu_backward"]
