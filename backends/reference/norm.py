"""Reference (oracle) kernels of inference batch norm and global average pooling.

Batch norm (Ioffe & Szegedy 2015, Algorithm 2; ONNX ``BatchNormalization``
with ``training_mode=0``), channel axis 1, per-channel vectors of shape (C,)::

    y = (x - mean) / sqrt(var + eps) * scale + bias

and its two gradient kernels (``s = 1 / sqrt(var + eps)``)::

    dL/dx     = gy * scale * s
    dL/dscale = sum over all axes but 1 of gy * (x - mean) * s

Global average pooling (ONNX ``GlobalAveragePool``) averages every (H, W)
plane of an NCHW tensor to (N, C, 1, 1); its gradient spreads ``gy / (H*W)``.

float16 computes in float32 and casts back (SEMANTICS.md, Numbers); every
kernel returns a fresh array.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.errors import ShapeError
from opgraph.types import compute_dtype

from .kernel import reference


def _channel(v, ndim, dt):
    """A (C,) vector as (1, C, 1, ...) in dtype ``dt``, to broadcast over axis 1."""
    return v.astype(dt, copy=False).reshape((1, -1) + (1,) * (ndim - 2))


def _check(what, x, **vectors):
    if x.ndim < 2:
        raise ShapeError(f"{what}: x must be (N, C, ...), got shape {x.shape}")
    for name, v in vectors.items():
        if tuple(v.shape) != (x.shape[1],):
            raise ShapeError(f"{what}: {name} must have shape ({x.shape[1]},), got {v.shape}")


@reference(ops.BatchNorm)
def batch_norm(xp, x, scale, bias, mean, var, *, eps):
    """Inference batch norm over axis 1.

    Args:
        x: (N, C, ...); scale, bias, mean, var: (C,).
        eps: added to var before the square root (ONNX default 1e-5).

    Returns:
        x's shape and dtype.

    Raises:
        ShapeError: a vector is not (C,), or x has no channel axis.
    """
    _check("batch_norm", x, scale=scale, bias=bias, mean=mean, var=var)
    dt = compute_dtype(xp, x.dtype)
    ch = lambda v: _channel(v, x.ndim, dt)  # noqa: E731
    # Python scalars are weak under NumPy 2 promotion: eps keeps the dtype.
    y = (x.astype(dt, copy=False) - ch(mean)) / xp.sqrt(ch(var) + eps)
    return (y * ch(scale) + ch(bias)).astype(x.dtype, copy=False)


@reference(ops.BatchNormBackwardData)
def batch_norm_backward_data(xp, gy, scale, var, *, eps):
    """``dL/dx = gy * scale / sqrt(var + eps)`` (per channel, axis 1).

    Shapes: gy (N, C, ...), scale and var (C,); returns gy's shape and dtype.
    """
    _check("batch_norm_backward_data", gy, scale=scale, var=var)
    dt = compute_dtype(xp, gy.dtype)
    factor = scale.astype(dt, copy=False) / xp.sqrt(var.astype(dt, copy=False) + eps)
    return (gy.astype(dt, copy=False) * _channel(factor, gy.ndim, dt)).astype(gy.dtype, copy=False)


@reference(ops.BatchNormBackwardScale)
def batch_norm_backward_scale(xp, x, mean, var, gy, *, eps):
    """``dL/dscale = sum(gy * (x - mean) / sqrt(var + eps))`` over every axis but 1.

    Shapes: x and gy (N, C, ...), mean and var (C,); returns (C,) in x's
    dtype (zeros for a batch of 0).
    """
    _check("batch_norm_backward_scale", x, mean=mean, var=var)
    if tuple(gy.shape) != tuple(x.shape):
        raise ShapeError(f"batch_norm_backward_scale: gy shape {gy.shape} != x shape {x.shape}")
    dt = compute_dtype(xp, x.dtype)
    centred = x.astype(dt, copy=False) - _channel(mean, x.ndim, dt)
    axes = (0,) + tuple(range(2, x.ndim))
    total = (gy.astype(dt, copy=False) * centred).sum(axis=axes)
    return (total / xp.sqrt(var.astype(dt, copy=False) + eps)).astype(x.dtype, copy=False)


@reference(ops.GlobalAvgPool2d)
def global_avg_pool2d(xp, x):
    """Mean of every (H, W) plane: (N, C, H, W) -> (N, C, 1, 1), x's dtype.

    Raises:
        ShapeError: x not 4-D.
    """
    if x.ndim != 4:
        raise ShapeError(f"global_avg_pool2d: x must be 4-D NCHW, got shape {x.shape}")
    return x.mean(axis=(2, 3), keepdims=True, dtype=compute_dtype(xp, x.dtype)).astype(x.dtype, copy=False)


@reference(ops.GlobalAvgPool2dBackward)
def global_avg_pool2d_backward(xp, gy, *, input_shape):
    """Gradient of :func:`global_avg_pool2d`: ``gy / (H*W)`` at every cell of
    ``input_shape`` (N, C, H, W); gy is (N, C, 1, 1).

    Raises:
        ShapeError: gy is not (N, C, 1, 1) of ``input_shape``.
    """
    n, c, h, w = (int(v) for v in input_shape)
    if tuple(gy.shape) != (n, c, 1, 1):
        raise ShapeError(f"global_avg_pool2d_backward: gy shape {gy.shape} != ({n}, {c}, 1, 1)")
    dt = compute_dtype(xp, gy.dtype)
    spread = gy.astype(dt, copy=False) / (h * w)
    return xp.broadcast_to(spread.astype(gy.dtype, copy=False), (n, c, h, w)).copy()


__all__ = ["batch_norm", "batch_norm_backward_data", "batch_norm_backward_scale",
           "global_avg_pool2d", "global_avg_pool2d_backward"]
