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

The graph's ops over saved indices (``opgraph/ops/pool_indices.py``:
``MaxPool2dArgmax``, ``MaxPool2dTake``, ``MaxPool2dBackwardIndices``) run these
functions; with ``relu`` the argmax adds ``MASKED`` (128) to the index of a
window whose winner is not > 0, which the take (``masked``: reads 0) and the
gather (``masked``: routes nothing) honour, or strip (not ``masked``). An
index naming no input cell of its window reads -inf and receives nothing.
"""

from __future__ import annotations

import numpy as np

from opgraph.errors import ParameterError, ShapeError
from opgraph.types import compute_dtype

from .kernel import reference_node
from .pool import PoolGeometry, _crop, _max_argwin, _strided_view, _zeros_buffer, node_geometry
from opgraph import ops
from opgraph.ops.pool_indices import MASKED

#: Windows up to this many cells store their winner in one byte.
MAX_WINDOW_CELLS = 256


def check_window(g: PoolGeometry, relu: bool = False) -> None:
    """Raise ParameterError unless a window index fits a byte (beside the
    ``MASKED`` mark with ``relu``)."""
    cells, most = g.kernel[0] * g.kernel[1], MASKED if relu else MAX_WINDOW_CELLS
    if cells > most:
        raise ParameterError("kernel_size", g.kernel, f"has {cells} cells; a uint8 window index holds "
                             f"at most {most}" + (" beside the ReLU mark" if relu else ""))


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


def max_pool2d_with_indices(xp, x, g: PoolGeometry, relu: bool = False):
    """Max pooling and each window's winner.

    Args:
        x: ``(N, C, H, W)``; g: the node's geometry (window of <= 256 cells,
        128 with ``relu``); relu: add ``MASKED`` to the index of every window
        whose maximum is not > 0 (0, negative or NaN).

    Returns:
        ``(y, idx)``: ``y`` ``(N, C, oh, ow)`` in x's dtype (as ``max_pool2d``),
        ``idx`` the same shape, uint8: the winner's row-major index inside
        its window (module docstring).

    Raises:
        ParameterError: a window of more than 256 cells (128 with ``relu``).
    """
    check_window(g, relu)
    y, idx = _max_argwin(xp, x, g)
    idx = idx.astype(np.uint8)
    if relu:
        idx = idx + xp.where(y > 0, 0, MASKED).astype(np.uint8)
    return y.astype(x.dtype, copy=False), idx


def _window_index(idx, masked: bool, g: PoolGeometry):
    """The window index each byte names: the mark stripped (not ``masked``), or
    marked bytes as they are (``masked``: they then name no cell). A window of
    over 128 cells has no mark: its bytes are indices whole."""
    if masked or g.kernel[0] * g.kernel[1] > MASKED:
        return idx
    return idx & (MASKED - 1)


def max_pool2d_take(xp, x, idx, g: PoolGeometry, masked: bool = False):
    """``x`` at each window's saved winner (``MaxPool2d(x)`` when ``idx`` is x's
    argmax): ``(N, C, oh, ow)`` in x's dtype; an index naming no input cell of
    its window reads -inf, a marked one (``masked``) 0.

    Raises:
        ShapeError: idx is not the pooled shape.
    """
    pooled = tuple(x.shape[:2]) + tuple(g.out)
    if tuple(idx.shape) != pooled:
        raise ShapeError(f"max_pool2d_take: idx {tuple(idx.shape)} is not the pooled shape {pooled}")
    (pt, pb), (pl, pr) = g.buf_pad
    padded = xp.full((*x.shape[:2], x.shape[2] + pt + pb, x.shape[3] + pl + pr), -np.inf, dtype=x.dtype)
    padded[:, :, pt:pt + x.shape[2], pl:pl + x.shape[3]] = x
    names = _window_index(idx, masked, g)
    y = xp.full(pooled, -np.inf, dtype=x.dtype)
    kh, kw = g.kernel
    for p in range(kh):
        for q in range(kw):
            y = xp.where(names == p * kw + q, _strided_view(padded, p, q, g), y)
    if masked:
        y = xp.where(idx >= MASKED, xp.zeros((), dtype=x.dtype), y)
    return y.astype(x.dtype, copy=False)


def max_pool2d_backward_indices(xp, idx, gy, g: PoolGeometry, input_shape, masked: bool = False):
    """Input gradient of max pooling from the saved winners: each window's
    ``gy`` goes to its winner; overlapping windows add up (in float32 for
    half storage, rounded once: SEMANTICS.md, Numbers).

    Args:
        idx: ``(N, C, oh, ow)`` uint8 from :func:`max_pool2d_with_indices`.
        gy: ``(N, C, oh, ow)`` output gradient; g: the node's geometry.
        input_shape: ``(N, C, H, W)``.
        masked: marked windows (``MASKED`` added by ``relu``) route nothing.

    Returns:
        ``input_shape`` in gy's dtype.

    Raises:
        ShapeError: idx and gy differ in shape or are not the pooled shape.
    """
    shape = backward_shape(idx, gy, g, input_shape)
    acc = compute_dtype(xp, gy.dtype)
    grad = gy.astype(acc, copy=False)
    gbuf = _zeros_buffer(xp, shape, g.buf_pad, acc)
    names = _window_index(idx, masked, g)
    kh, kw = g.kernel
    for p in range(kh):
        for q in range(kw):
            _strided_view(gbuf, p, q, g)[...] += xp.where(names == p * kw + q, grad, 0)
    return _crop(gbuf, g.buf_pad, shape).astype(gy.dtype, copy=False)


# ---- the kernels of graph nodes (opgraph/ops/pool_indices.py): the op's fields, the node's extents

@reference_node(ops.MaxPool2dArgmax)
def max_pool2d_argmax_kernel(ctx, op, x):
    """``MaxPool2dArgmax`` node: the index of :func:`max_pool2d_with_indices`. Also the
    ``MaxPool2dArgmaxSlot`` node's: the slot's value is the argmax's (the reference
    computes it; a device step only allocates, and its ``MaxPool2dScan`` fills it)."""
    g = node_geometry(op, x.shape[2:], ctx.out_shape(op, x)[2:])
    return max_pool2d_with_indices(ctx.xp, x, g, op.relu)[1]


max_pool2d_argmax_slot_kernel = reference_node(ops.MaxPool2dArgmaxSlot)(max_pool2d_argmax_kernel)


@reference_node(ops.MaxPool2dScan)
def max_pool2d_scan_kernel(ctx, op, x, slot):
    """``MaxPool2dScan`` node: writes the argmax of x into ``slot`` in place (its
    layout kept) and returns :func:`max_pool2d_take` of x at it: the winner's own
    bits (a +0.0 / -0.0 tie keeps the first), which the maximum's may not be."""
    g = node_geometry(op, x.shape[2:], slot.shape[2:])
    idx = max_pool2d_with_indices(ctx.xp, x, g, op.relu)[1]
    slot[...] = idx
    return max_pool2d_take(ctx.xp, x, idx, g)


@reference_node(ops.MaxPool2dTake)
def max_pool2d_take_kernel(ctx, op, x, idx):
    """``MaxPool2dTake`` node: :func:`max_pool2d_take` with the node's geometry."""
    return max_pool2d_take(ctx.xp, x, idx, node_geometry(op, x.shape[2:], idx.shape[2:]), op.masked)


@reference_node(ops.MaxPool2dBackwardIndices)
def max_pool2d_backward_indices_kernel(ctx, op, idx, gy):
    """``MaxPool2dBackwardIndices`` node: :func:`max_pool2d_backward_indices`."""
    g = node_geometry(op, op.input_shape[2:], gy.shape[2:])
    return max_pool2d_backward_indices(ctx.xp, idx, gy, g, op.input_shape, op.masked)


__all__ = ["MAX_WINDOW_CELLS", "check_window", "backward_shape", "max_pool2d_with_indices", "max_pool2d_take",
           "max_pool2d_backward_indices", "max_pool2d_argmax_kernel", "max_pool2d_argmax_slot_kernel",
           "max_pool2d_scan_kernel", "max_pool2d_take_kernel", "max_pool2d_backward_indices_kernel"]
