"""Reference (oracle) broadcasting kernels: add, multiply, sum-to, broadcast-to.

Broadcasting is NumPy's rule (right-aligned shapes, extent 1 stretches),
which is also ONNX's multidirectional broadcasting (ONNX docs/Broadcasting.md).
``sum_to`` is the adjoint of ``broadcast_to``: it sums a broadcast gradient
back to the operand's shape, summing leading axes away and keeping the axes
where the target has extent 1.

Every kernel takes the array module ``xp`` first and returns a fresh array
(never a view of an input). Reductions of float16 accumulate in float32
(SEMANTICS.md, Numbers).
"""

from __future__ import annotations

import numpy as np

from opgraph import ops
from opgraph.errors import ShapeError
from opgraph.types import compute_dtype

from .kernel import reference


def _broadcast(what, *shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{what}: shapes {', '.join(map(str, shapes))} do not broadcast") from None


@reference(ops.BroadcastAdd)
def broadcast_add(xp, a, b):
    """``a + b`` with NumPy broadcasting.

    Shapes: a, b broadcastable; returns ``broadcast(a.shape, b.shape)`` in
    the promoted dtype (equal dtypes in a well-typed graph).

    Raises:
        ShapeError: the shapes do not broadcast.
    """
    _broadcast("broadcast_add", a.shape, b.shape)
    return a + b


@reference(ops.Mul)
def mul(xp, a, b):
    """``a * b`` with NumPy broadcasting (ONNX ``Mul``).

    Shapes: a, b broadcastable; returns ``broadcast(a.shape, b.shape)``.
    NaN and inf follow IEEE multiplication (``0 * inf`` is NaN).

    Raises:
        ShapeError: the shapes do not broadcast.
    """
    _broadcast("mul", a.shape, b.shape)
    return a * b


def _sum_axes(x_shape, shape, what):
    """Axes of ``x_shape`` to sum so that the result has ``shape``."""
    shape, lead = tuple(shape), len(x_shape) - len(shape)
    if lead < 0 or _broadcast(what, shape, x_shape) != tuple(x_shape):
        raise ShapeError(f"{what}: shape {shape} does not broadcast to {tuple(x_shape)}")
    return tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and x_shape[lead + i] != 1)


@reference(ops.SumTo)
def sum_to(xp, x, *, shape):
    """Sum ``x`` down to ``shape``, the inverse of broadcasting ``shape`` to x.

    ``out = x.sum(leading axes and axes where shape is 1).reshape(shape)``;
    a zero-size axis sums to 0. float16 accumulates in float32; the result
    has x's dtype.

    Raises:
        ShapeError: ``shape`` does not broadcast to ``x.shape``.
    """
    axes = _sum_axes(x.shape, shape, "sum_to")
    out = x.sum(axis=axes, dtype=compute_dtype(xp, x.dtype), keepdims=True)
    return xp.reshape(out, tuple(shape)).astype(x.dtype, copy=True)


@reference(ops.BroadcastTo)
def broadcast_to(xp, x, *, shape):
    """``x`` broadcast to ``shape`` and materialised (a fresh contiguous array).

    Raises:
        ShapeError: x's shape does not broadcast to ``shape``.
    """
    shape = tuple(int(s) for s in shape)
    if x.ndim > len(shape) or _broadcast("broadcast_to", x.shape, shape) != shape:
        raise ShapeError(f"broadcast_to: shape {tuple(x.shape)} does not broadcast to {shape}")
    return xp.broadcast_to(x, shape).copy()


__all__ = ["broadcast_add", "mul", "sum_to", "broadcast_to"]
