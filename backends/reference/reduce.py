"""Reference (oracle) kernels of ``Mean`` (ONNX ``ReduceMean``) and its gradient.

Means of float16/bfloat16 accumulate in float32 and round once. Every kernel
takes the array module ``xp`` first and returns a fresh array.
"""

from __future__ import annotations

import math

from opgraph import ops
from opgraph.errors import ShapeError
from opgraph.types import compute_dtype

from .kernel import reference


def _reduced(shape, axes, keepdim):
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


@reference(ops.Mean)
def mean(xp, x, *, axes, keepdim):
    """Mean of x over ``axes`` (distinct, non-negative); reduced axes kept with
    extent 1 when ``keepdim``, else dropped. x's dtype.

    Raises:
        ShapeError: an axis out of range.
    """
    axes = tuple(axes)
    if any(a >= x.ndim for a in axes):
        raise ShapeError(f"mean: axes {axes} out of range for shape {x.shape}")
    out = x.mean(axis=axes, keepdims=keepdim, dtype=compute_dtype(xp, x.dtype))
    return xp.asarray(out).astype(x.dtype, copy=True)


@reference(ops.MeanBackward)
def mean_backward(xp, gy, *, axes, keepdim, input_shape):
    """Gradient of :func:`mean`: ``gy / count`` at every cell of ``input_shape``
    (count = product of the reduced extents).

    Raises:
        ShapeError: gy is not the reduced shape of ``input_shape``.
    """
    shape = tuple(int(s) for s in input_shape)
    want = _reduced(shape, axes, keepdim)
    if tuple(gy.shape) != want:
        raise ShapeError(f"mean_backward: gy shape {gy.shape} != reduced shape {want} of {shape}")
    spread = gy.astype(compute_dtype(xp, gy.dtype), copy=False) / math.prod(shape[a] for a in axes)
    kept = spread.reshape(_reduced(shape, axes, True))
    return xp.broadcast_to(kept.astype(gy.dtype, copy=False), shape).copy()


__all__ = ["mean", "mean_backward"]
