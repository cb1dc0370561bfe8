"""Max pooling that saves each window's winner as a 1-byte window index (the oracle).

Today's max-pool gradient recomputes every window's argmax from ``x``: the
backward reads ``x`` (the unpooled tensor) again, writes a 4-byte cell index
per window and reads it back. Saving the winner in the forward, as its
row-major position inside the window (``p * kw + q`` for kernel row ``p`` and
column ``q``: one byte while the window has at most 256 cells), lets the
backward read that byte and ``gy`` and write ``gx``, each once.

The winner is the one ``reference.pool.max_pool2d_backward`` routes to
(SEMANTICS.md, Pooling): the first NaN of the window if it holds one, else
the first maximum among the window's input cells in row-major order (padding
cells, -inf, never win a tie), so :func:`max_pool2d_backward_indices` equals
``max_pool2d_backward`` exactly. These functions take a node's
:class:`~.pool.PoolGeometry` (``pool.node_geometry``); pooling has no
dilation in opgraph (``MaxPool2d``'s fields).
"""

from __future__ import annotations

import numpy as np

from opgraph.errors import ParameterError, ShapeError
from opgraph.types import compute_dtype

from .pool import PoolGeometry, _crop, _max_argwin, _strided_view, _zeros_buffer

#: Windows up to this many cells store their winner in one byte.
MAX_WINDOW_CELLS = 256


def check_window(g: PoolGeometry) -> None:
    """Raise ParameterError unless a window index fits a byte."""
    cells = g.kernel[0] * g.kernel[1]
    if cells > MAX_WINDOW_CELLS:
        raise ParameterError("kernel_size", g.kernel, f"has {cells} cells; a uint8 window index holds "
                             f"at most {MAX_WINDOW_CELLS}")


def backward_shape(idx, gy, g: PoolGeometry, input_shape) -> tuple:
    """``input_shape`` as ints, after checking that ``idx`` and ``gy`` are both
    its pooled shape under ``g`` (the backward kernels' one check).

    Raises:
        ShapeError: they are not (naming both shapes and the expected one).
    """
    shape = tuple(int(v) for v in input_shape)
    if tuple(idx.shape) != tuple(gy.shape) or tuple(gy.shape) != shape[:2] + tuple(g.out):
        raise ShapeError(f"max_pool2d_backward_indices: idx {tuple(idx.shape)} and gy {tuple(gy.shape)} "
                         f"must both be {shape[:2] + tuple(g.out)}")
    return shape


def max_pool2d_with_indices(xp, x, g: PoolGeometry):
    """Max pooling and each window's winner.

    Args:
        x: ``(N, C, H, W)``; g: the node's geometry (window of <= 256 cells).

    Returns:
        ``(y, idx)``: ``y`` ``(N, C, oh, ow)`` in x's dtype (as ``max_pool2d``),
        ``idx`` the same shape, uint8: the winner's row-major index inside
        its window (module docstring).

    Raises:
        ParameterError: a window of more than 256 cells.
    """
    check_window(g)
    y, idx = _max_argwin(xp, x, g)
    return y.astype(x.dtype, copy=False), idx.astype(np.uint8)


def max_pool2d_backward_indices(xp, idx, gy, g: PoolGeometry, input_shape):
    """Input gradient of max pooling from the saved winners: each window's
    ``gy`` goes to its winner; overlapping windows add up (in float32 for
    half storage, rounded once: SEMANTICS.md, Numbers).

    Args:
        idx: ``(N, C, oh, ow)`` uint8 from :func:`max_pool2d_with_indices`.
        gy: ``(N, C, oh, ow)`` output gradient; g: the node's geometry.
        input_shape: ``(N, C, H, W)``.

    Returns:
        ``input_shape`` in gy's dtype.

    Raises:
        ShapeError: idx and gy differ in shape or are not the pooled shape.
    """
    shape = backward_shape(idx, gy, g, input_shape)
    acc = compute_dtype(xp, gy.dtype)
    grad = gy.astype(acc, copy=False)
    gbuf = _zeros_buffer(xp, shape, g.buf_pad, acc)
    kh, kw = g.kernel
    for p in range(kh):
        for q in range(kw):
            _strided_view(gbuf, p, q, g)[...] += xp.where(idx == p * kw + q, grad, 0)
    return _crop(gbuf, g.buf_pad, shape).astype(gy.dtype, copy=False)


__all__ = ["MAX_WINDOW_CELLS", "check_window", "backward_shape", "max_pool2d_with_indices", "max_pool2d_backward_indices"]
