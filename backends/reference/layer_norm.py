"""Reference (oracle) kernels of layer normalisation (``opgraph/ops/layer_norm.py``).

Statistics (mean, biased variance) of each leading index over the trailing
``len(normalized_shape)`` axes, recomputed from x by every kernel; weight and
bias have ``normalized_shape`` and broadcast from the right. The shared
arithmetic is ``normalization.py``. float16/bfloat16 compute in float32 and
round once; every kernel takes ``xp`` first and returns a fresh array.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.errors import ShapeError
from opgraph.types import compute_dtype

from .kernel import reference
from .normalization import data_gradient, data_gradient_input_grad, moments, normalized


def _axes(x, normalized_shape):
    k = len(normalized_shape)
    if not k or x.ndim < k or tuple(x.shape[x.ndim - k:]) != tuple(normalized_shape):
        raise ShapeError(f"layer_norm: normalized_shape {tuple(normalized_shape)} does not end the "
                         f"input shape {x.shape}")
    return tuple(range(x.ndim - k, x.ndim))


def _xhat(xp, x, normalized_shape, eps):
    """``(x, xhat, rstd, axes)`` in the compute dtype."""
    axes = _axes(x, normalized_shape)
    xc = x.astype(compute_dtype(xp, x.dtype), copy=False)
    mean, var = moments(xc, axes)
    xhat, rstd = normalized(xp, xc, mean, var, eps)
    return xc, xhat, rstd, axes


def _cast(v, dt):
    return None if v is None else v.astype(dt, copy=False)


def _scaled(gy, weight):
    """``gy * weight`` (the gradient w.r.t. xhat; weight None: gy)."""
    return gy if weight is None else gy * _cast(weight, gy.dtype)


@reference(ops.LayerNorm)
def layer_norm(xp, x, weight=None, bias=None, *, normalized_shape, eps):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` per leading index; x's shape and dtype."""
    _, y, _, _ = _xhat(xp, x, normalized_shape, eps)
    if weight is not None:
        y = y * _cast(weight, y.dtype)
    if bias is not None:
        y = y + _cast(bias, y.dtype)
    return y.astype(x.dtype, copy=False)


@reference(ops.LayerNormBackwardData)
def layer_norm_backward_data(xp, gy, x, weight=None, *, normalized_shape, eps):
    """``dx = rstd * (g - <g> - xhat <g xhat>)``, ``g = gy * weight`` (row means); gy's dtype."""
    xc, xhat, rstd, axes = _xhat(xp, x, normalized_shape, eps)
    g = _scaled(gy.astype(xc.dtype, copy=False), weight)
    return data_gradient(g, xhat, rstd, axes).astype(gy.dtype, copy=False)


@reference(ops.LayerNormBackwardScale)
def layer_norm_backward_scale(xp, x, gy, *, normalized_shape, eps):
    """``dweight = sum(gy * xhat)`` over the leading axes -> ``normalized_shape``, x's dtype."""
    _, xhat, _, axes = _xhat(xp, x, normalized_shape, eps)
    lead = tuple(range(x.ndim - len(axes)))
    return (gy.astype(xhat.dtype, copy=False) * xhat).sum(axis=lead).astype(x.dtype, copy=False)


@reference(ops.LayerNormDoubleBackward)
def layer_norm_double_backward(xp, v, gy, x, weight=None, *, normalized_shape, eps):
    """d sum(v * dx) / dx of :func:`layer_norm_backward_data` (``normalization.py``); x's shape, dtype."""
    xc, xhat, rstd, axes = _xhat(xp, x, normalized_shape, eps)
    g = _scaled(gy.astype(xc.dtype, copy=False), weight)
    out = data_gradient_input_grad(v.astype(xc.dtype, copy=False), g, xhat, rstd, axes)
    return out.astype(x.dtype, copy=False)


__all__ = ["layer_norm", "layer_norm_backward_data", "layer_norm_backward_scale",
           "layer_norm_double_backward"]
