"""Reference (oracle) max and average pooling, forward and backward.

Layout NCHW. Every rule is ``shared/design/SEMANTICS.md`` (Pooling):

* output extent ``opgraph.params.pool_out_size`` (floor, or ceil then drop a
  last window that would start at or beyond ``in + pad_begin``);
* padding at most half the kernel on each side (``2 * pad <= k``);
* max: padding acts as ``-inf``; a NaN in a window propagates to the output;
  an all ``-inf`` window gives ``-inf`` and a finite gradient;
* max gradient: the whole output gradient goes to one input cell, the first
  maximum in row-major window order, so every window's gradient sums to its
  output gradient;
* average divisor: ``count_include_pad=True`` counts the window's cells inside
  the input plus the explicit padding, never the ceil_mode overhang;
  ``False`` counts in-bounds cells only (PyTorch's ``avg_pool2d`` rule).

Choices made where SEMANTICS.md leaves room (also in the docstrings):

* NaN counts as the maximum: the output of a window holding a NaN is NaN and
  its gradient goes to the first NaN (PyTorch's max_pool2d does the same).
* Padding cells tie with ``-inf`` input cells but never win a tie: the winner
  is the first maximum among *input* cells. Every window holds an input cell
  (pad <= k/2 and the ceil_mode drop rule guarantee it) and the window max is
  always attained by one, so no gradient is ever lost into the padding.

Implementation: the input is padded once (``-inf`` for max, 0 for average,
plus the ceil_mode overhang) and viewed with ``sliding_window_view``; backward
passes scatter with one strided add per kernel offset, which needs no atomic
scatter (``np.add.at``) and runs unchanged on CuPy.
"""

from __future__ import annotations

import attrs

from opgraph import ops
from opgraph.errors import ParameterError, ShapeError
from opgraph.params import pair, padding2d, pool_out_size
from opgraph.types import compute_dtype

from .kernel import reference_node


@attrs.frozen
class PoolGeometry:
    """Sizes of one pooling (all canonical): ``kernel``, ``stride``, ``padding``
    ``((top, bottom), (left, right))``, the input extent ``in_hw`` and the
    pooled extent ``out``."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]]
    in_hw: tuple[int, int]
    out: tuple[int, int]

    @property
    def buf_pad(self) -> tuple:
        """``((top, bottom), (left, right))`` padding of the working buffer: the
        explicit top/left padding, and at the bottom/right exactly what the
        last window reaches (explicit padding plus any ceil_mode overhang)."""
        return tuple((p[0], max((o - 1) * s + k - p[0] - n, 0))
                     for n, k, s, p, o in zip(self.in_hw, self.kernel, self.stride, self.padding, self.out))


def node_geometry(op, in_hw, pooled_hw) -> PoolGeometry:
    """The geometry of a pooling node: the op's own fields (canonical since the
    op was built) and the extents its type inference checked; nothing is
    re-interpreted or recomputed.

    Args:
        op: any pooling op (``kernel_size``, ``stride``, ``padding`` fields).
        in_hw: the unpooled (input) extent; pooled_hw: the pooled extent (the
            node's output, or the output gradient's for a backward op).
    """
    return PoolGeometry(op.kernel_size, op.stride, op.padding, tuple(in_hw), tuple(pooled_hw))


def geometry(in_hw, kernel_size, stride, padding, ceil_mode):
    """``(k, s, pad, out)``: canonical kernel, stride and padding of a pooling
    called outside a graph, and its output extent (SEMANTICS.md rules; the
    CUDA kernels use it too). A graph node's geometry is :func:`node_geometry`.

    Raises:
        ParameterError: a bad kernel, stride or padding (naming it), or padding
            over half the kernel.
        ShapeError: the kernel does not fit the padded input (output < 1).
    """
    k = pair("kernel_size", kernel_size, minimum=1)
    s = pair("stride", k if stride is None else stride, minimum=1)
    pad = padding2d(padding, in_hw=tuple(in_hw), kernel=k, stride=s)
    for (pb, pe), kk in zip(pad, k):
        if 2 * pb > kk or 2 * pe > kk:
            raise ParameterError("padding", padding, f"must be at most half the kernel {k} on each side")
    out = tuple(pool_out_size(n, kk, ss, p, bool(ceil_mode)) for n, kk, ss, p in zip(in_hw, k, s, pad))
    if min(out) < 1:
        raise ShapeError(f"pooling kernel {k} with padding {pad} does not fit input {tuple(in_hw)} "
                         f"(output {out})")
    return k, s, pad, out


def _checked(what: str, x, kernel_size, stride, padding, ceil_mode) -> PoolGeometry:
    """:func:`geometry` of the arrays of a call outside a graph, as a :class:`PoolGeometry`."""
    if x.ndim != 4:
        raise ShapeError(f"{what}: x must be 4-D NCHW, got shape {x.shape}")
    k, s, pad, out = geometry(x.shape[2:], kernel_size, stride, padding, ceil_mode)
    return PoolGeometry(k, s, pad, tuple(x.shape[2:]), out)


def _windows(xp, x, g: PoolGeometry, fill):
    """View ``(N, C, oh, ow, kh*kw)`` of the pooling windows of ``x``.

    ``x`` is padded with ``fill`` by ``g.buf_pad``; the window axis is flattened
    in row-major (kernel row, kernel column) order. The result is a copy.
    """
    (pt, pb), (pl, pr) = g.buf_pad
    (k, s, out) = g.kernel, g.stride, g.out
    buf = xp.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    view = xp.lib.stride_tricks.sliding_window_view(buf, k, axis=(2, 3))
    view = view[:, :, : (out[0] - 1) * s[0] + 1 : s[0], : (out[1] - 1) * s[1] + 1 : s[1]]
    return view.reshape(view.shape[:4] + (k[0] * k[1],))


def _max_argwin(xp, x, g: PoolGeometry):
    """Window maxima and the in-window flat index of the winning input cell."""
    win = _windows(xp, x, g, -xp.inf)
    # Which window cells lie inside the input: padding cells must lose ties.
    inside = _windows(xp, xp.ones((1, 1) + x.shape[2:], dtype=bool), g, False)
    nan = xp.isnan(win)
    has_nan = nan.any(axis=-1, keepdims=True)
    top = win.max(axis=-1, keepdims=True)  # NaN-propagating; windows are never empty
    # The winner: first NaN if any, else the first in-bounds cell equal to the max.
    hit = xp.where(has_nan, nan, (win == top) & inside)
    idx = xp.argmax(hit, axis=-1)
    return top[..., 0], idx


def max_pool2d(xp, x, *, kernel_size, stride, padding, ceil_mode):
    """Max pooling of an NCHW tensor.

    Args:
        xp: array module (numpy or cupy).
        x: ``(N, C, H, W)`` float array; computed in its own dtype.
        kernel_size, stride: ``(h, w)`` pairs (ints accepted; stride None means
            the kernel).
        padding: ``((top, bottom), (left, right))`` (any form accepted by
            ``opgraph.params.padding2d``, ``'same'`` included); acts as -inf.
        ceil_mode: round the output extent up, then drop a window starting at
            or beyond ``in + pad_begin``.

    Returns:
        ``(N, C, oh, ow)``; a window holding a NaN gives NaN, an all -inf
        window gives -inf.

    Raises:
        ParameterError: bad kernel/stride/padding, or padding above half the
            kernel.
        ShapeError: x not 4-D, or the kernel does not fit the padded input.

    Source: SEMANTICS.md (Pooling); PyTorch ``max_pool2d`` sizes and NaN rule.
    """
    return _max_argwin(xp, x, _checked("max_pool2d", x, kernel_size, stride, padding, ceil_mode))[0]


def max_pool2d_backward(xp, x, gy, *, kernel_size, stride, padding, ceil_mode):
    """Input gradient of :func:`max_pool2d`.

    The whole ``gy`` of each window goes to one input cell: the first NaN of
    the window if it holds one, else the first maximum among the window's
    input cells in row-major order (padding never wins a tie with a -inf input
    cell). Gradients of overlapping windows add up.

    Args:
        x: the forward input ``(N, C, H, W)``.
        gy: ``(N, C, oh, ow)`` output gradient.
        kernel_size, stride, padding, ceil_mode: as :func:`max_pool2d`.

    Returns:
        ``(N, C, H, W)`` in gy's dtype (half precision summed in float32 and
        rounded once).

    Raises:
        ShapeError: gy's shape is not the forward output's.
    """
    g = _checked("max_pool2d", x, kernel_size, stride, padding, ceil_mode)
    if tuple(gy.shape) != tuple(x.shape[:2]) + g.out:
        raise ShapeError(f"max_pool2d_backward: gy has shape {gy.shape}, expected {x.shape[:2] + g.out}")
    return _max_backward(xp, x, gy, g)


def _max_backward(xp, x, gy, g: PoolGeometry):
    _, idx = _max_argwin(xp, x, g)
    # overlapping windows add up: in the compute dtype (half storage sums in
    # float32), rounded once at the end (SEMANTICS.md, Numbers)
    acc = compute_dtype(xp, gy.dtype)
    grad = gy.astype(acc, copy=False)
    gbuf = _zeros_buffer(xp, x.shape, g.buf_pad, acc)
    k = g.kernel
    for p in range(k[0]):
        for q in range(k[1]):
            _strided_view(gbuf, p, q, g)[...] += xp.where(idx == p * k[1] + q, grad, 0)
    return _crop(gbuf, g.buf_pad, x.shape).astype(gy.dtype, copy=False)


def max_pool2d_backward_relu(xp, x, gy, *, kernel_size, stride, padding, ceil_mode):
    """Input gradient of ``max_pool2d(relu_output)`` through the ReLU: the
    ``MaxPool2dBackwardRelu`` op, ``relu_backward(x, max_pool2d_backward(x, gy))``
    (computed exactly so: this is the oracle of the fused kernels).

    Args:
        x: ``(N, C, H, W)`` the ReLU's output, pooled in the forward.
        gy: ``(N, C, oh, ow)`` output gradient of the pooling.
        kernel_size, stride, padding, ceil_mode: as :func:`max_pool2d`.

    Returns:
        ``(N, C, H, W)`` in gy's dtype: 0 wherever ``x > 0`` is false (0, negative, NaN).

    Raises:
        ShapeError: gy's shape is not the pooled shape of x.
    """
    from .elementwise import relu_backward
    return relu_backward(xp, x, max_pool2d_backward(xp, x, gy, kernel_size=kernel_size, stride=stride,
                                                    padding=padding, ceil_mode=ceil_mode))


def max_pool2d_select(xp, x, v, *, kernel_size, stride, padding, ceil_mode):
    """``v`` read at each window's winning cell of ``x``: the adjoint of
    :func:`max_pool2d_backward` in its gradient argument (used for second
    derivatives). The winner is the one :func:`max_pool2d_backward` routes
    to, so ``sum(select(x, v) * gy) == sum(v * max_pool2d_backward(x, gy))``.

    Args:
        x: ``(N, C, H, W)`` forward input; v: same shape.
        kernel_size, stride, padding, ceil_mode: as :func:`max_pool2d`.

    Returns:
        ``(N, C, oh, ow)`` in v's dtype.

    Raises:
        ShapeError: v's shape differs from x's.
    """
    if tuple(v.shape) != tuple(x.shape):
        raise ShapeError(f"max_pool2d_select: v has shape {v.shape}, x has {x.shape}")
    return _select(xp, x, v, _checked("max_pool2d", x, kernel_size, stride, padding, ceil_mode))


def _select(xp, x, v, g: PoolGeometry):
    _, idx = _max_argwin(xp, x, g)
    # Winners are always input cells, so the padding fill of v is never read.
    win = _windows(xp, v, g, 0)
    return xp.take_along_axis(win, idx[..., None], axis=-1)[..., 0]


def _zeros_buffer(xp, shape, buf_pad, dtype):
    (pt, pb), (pl, pr) = buf_pad
    return xp.zeros((shape[0], shape[1], shape[2] + pt + pb, shape[3] + pl + pr), dtype=dtype)


def _strided_view(buf, p, q, g: PoolGeometry):
    """Cells at kernel offset (p, q) of every window, as an ``(N, C, oh, ow)`` view."""
    s, out = g.stride, g.out
    return buf[:, :, p : p + (out[0] - 1) * s[0] + 1 : s[0], q : q + (out[1] - 1) * s[1] + 1 : s[1]]


def _crop(buf, buf_pad, shape):
    (pt, _), (pl, _) = buf_pad
    return buf[:, :, pt : pt + shape[2], pl : pl + shape[3]].copy()


def _divisor(xp, g: PoolGeometry, count_include_pad, dtype):
    """``(oh, ow)`` cell counts of each window (SEMANTICS.md average divisor).

    Along each axis the window ``[start, start + k)`` (``start = i*s - pad_begin``
    in input coordinates) is clipped to ``[-pad_begin, in + pad_end)`` when
    counting padding (never the ceil_mode overhang) or to ``[0, in)`` when not.
    The count factorises over the two axes.
    """
    counts = []
    for n, kk, ss, (pb, pe), o in zip(g.in_hw, g.kernel, g.stride, g.padding, g.out):
        start = xp.arange(o) * ss - pb
        lo, hi = (-pb, n + pe) if count_include_pad else (0, n)
        counts.append(xp.minimum(start + kk, hi) - xp.maximum(start, lo))
    return (counts[0][:, None] * counts[1][None, :]).astype(dtype)


def avg_pool2d(xp, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad):
    """Average pooling of an NCHW tensor.

    Args:
        x: ``(N, C, H, W)`` float array (fp16 accumulates in fp32).
        kernel_size, stride, padding, ceil_mode: as :func:`max_pool2d`;
            padding cells hold 0.
        count_include_pad: divisor counts input plus explicit padding cells
            (True) or input cells only (False); the ceil_mode overhang is
            never counted.

    Returns:
        ``(N, C, oh, ow)`` in x's dtype.

    Raises:
        ParameterError, ShapeError: as :func:`max_pool2d`.

    Source: SEMANTICS.md (Pooling); PyTorch ``avg_pool2d`` divisor rule.
    """
    g = _checked("avg_pool2d", x, kernel_size, stride, padding, ceil_mode)
    return _avg(xp, x, g, count_include_pad)


def _avg(xp, x, g: PoolGeometry, count_include_pad):
    acc = compute_dtype(xp, x.dtype)
    win = _windows(xp, x.astype(acc, copy=False), g, 0)
    return (win.sum(axis=-1) / _divisor(xp, g, count_include_pad, acc)).astype(x.dtype, copy=False)


def avg_pool2d_backward(xp, gy, *, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, input_shape):
    """Input gradient of :func:`avg_pool2d`: each input cell receives
    ``gy / divisor`` from every window covering it.

    Args:
        gy: ``(N, C, oh, ow)`` output gradient.
        input_shape: the forward input's NCHW shape (the output extent does
            not determine it).
        Others: as :func:`avg_pool2d`.

    Returns:
        ``(N, C, H, W)`` in gy's dtype.

    Raises:
        ShapeError: gy's shape is not the forward output's for input_shape.
    """
    shape = tuple(int(v) for v in input_shape)
    if len(shape) != 4:
        raise ParameterError("input_shape", input_shape, "must be an NCHW 4-tuple")
    k, s, pad, out = geometry(shape[2:], kernel_size, stride, padding, ceil_mode)
    if tuple(gy.shape) != shape[:2] + out:
        raise ShapeError(f"avg_pool2d_backward: gy has shape {gy.shape}, expected {shape[:2] + out}")
    return _avg_backward(xp, gy, PoolGeometry(k, s, pad, shape[2:], out), count_include_pad, shape)


def _avg_backward(xp, gy, g: PoolGeometry, count_include_pad, shape):
    acc = compute_dtype(xp, gy.dtype)
    share = gy.astype(acc, copy=False) / _divisor(xp, g, count_include_pad, acc)
    gbuf = _zeros_buffer(xp, shape, g.buf_pad, acc)
    for p in range(g.kernel[0]):
        for q in range(g.kernel[1]):
            _strided_view(gbuf, p, q, g)[...] += share
    return _crop(gbuf, g.buf_pad, shape).astype(gy.dtype, copy=False)


# ---- the kernels of graph nodes: the op's canonical fields, the node's extents

@reference_node(ops.MaxPool2d)
def max_pool2d_kernel(ctx, op, x):
    """``MaxPool2d`` node: :func:`max_pool2d` with the node's geometry."""
    return _max_argwin(ctx.xp, x, node_geometry(op, x.shape[2:], ctx.out_shape(op, x)[2:]))[0]


@reference_node(ops.MaxPool2dBackward)
def max_pool2d_backward_kernel(ctx, op, x, gy):
    """``MaxPool2dBackward`` node: :func:`max_pool2d_backward` with the node's geometry."""
    return _max_backward(ctx.xp, x, gy, node_geometry(op, x.shape[2:], gy.shape[2:]))


@reference_node(ops.MaxPool2dBackwardRelu)
def max_pool2d_backward_relu_kernel(ctx, op, x, gy):
    """``MaxPool2dBackwardRelu`` node: :func:`max_pool2d_backward_relu` with the node's geometry."""
    from .elementwise import relu_backward
    g = node_geometry(op, x.shape[2:], gy.shape[2:])
    return relu_backward(ctx.xp, x, _max_backward(ctx.xp, x, gy, g))


@reference_node(ops.MaxPool2dSelect)
def max_pool2d_select_kernel(ctx, op, x, v):
    """``MaxPool2dSelect`` node: :func:`max_pool2d_select` with the node's geometry."""
    return _select(ctx.xp, x, v, node_geometry(op, x.shape[2:], ctx.out_shape(op, x, v)[2:]))


@reference_node(ops.AvgPool2d)
def avg_pool2d_kernel(ctx, op, x):
    """``AvgPool2d`` node: :func:`avg_pool2d` with the node's geometry."""
    g = node_geometry(op, x.shape[2:], ctx.out_shape(op, x)[2:])
    return _avg(ctx.xp, x, g, op.count_include_pad)


@reference_node(ops.AvgPool2dBackward)
def avg_pool2d_backward_kernel(ctx, op, gy):
    """``AvgPool2dBackward`` node: :func:`avg_pool2d_backward` with the node's geometry."""
    g = node_geometry(op, op.input_shape[2:], gy.shape[2:])
    return _avg_backward(ctx.xp, gy, g, op.count_include_pad, op.input_shape)


__all__ = ["PoolGeometry", "node_geometry", "geometry", "max_pool2d", "max_pool2d_backward",
           "max_pool2d_backward_relu", "max_pool2d_select", "avg_pool2d", "avg_pool2d_backward",
           "max_pool2d_kernel", "max_pool2d_backward_kernel", "max_pool2d_backward_relu_kernel",
           "max_pool2d_select_kernel", "avg_pool2d_kernel", "avg_pool2d_backward_kernel"]
