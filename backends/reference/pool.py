"""Reference (oracle) max and average pooling, forward and backward.

Arrays are NCHW-shaped (stored NCHW or channels-last). Every rule is
``shared/design/SEMANTICS.md`` (Pooling):

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

Implementation: one vectorised pass per kernel offset. A window's cell at
kernel offset ``(p, q)`` is, over all windows at once, the strided view
``padded[..., p::s_h, q::s_w]`` of the input padded by ``-inf`` (max) or 0
(average) plus the ceil_mode overhang. The forward passes combine the kh*kw
views with ``maximum`` / ``add``; the max backward finds each window's winner
offset by offset (the first view equal to the window max, in row-major order)
and both backward passes scatter with one strided add per offset, which needs
no atomic scatter (``np.add.at``) and runs unchanged on CuPy. On NumPy the
tensor is walked in blocks of about ``_BLOCK_BYTES`` so that the kh*kw passes
stay in the CPU cache. Results keep the operand's storage order (NCHW or
channels-last). Measured on AlexNet's 3x3/2 pools, float32 (128, 64, 55, 55)
on a 2-core CPU: the former whole-tensor ``sliding_window_view`` copy with
an argmax over the window axis ran the forward at 0.17 GB/s and the backward
at 0.24 GB/s; this loop at about 5 and 2 GB/s.
"""

from __future__ import annotations

import attrs
import numpy as np

from opgraph import ops
from opgraph.errors import ParameterError, ShapeError
from opgraph.params import pair, padding2d, pool_out_size
from opgraph.types import compute_dtype, storage_order

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


# ---- the offset loop (module docstring): blocks, padded copies, winners

#: Input bytes of one NumPy block: the kh*kw passes over it then hit the CPU
#: cache, while the per-offset Python calls (microseconds each) stay a small
#: share of the time. 0.5 to 4 MiB ran alike on AlexNet's 3x3/2 pools.
_BLOCK_BYTES = 1 << 20


def _offsets(g: PoolGeometry) -> list[tuple[int, int]]:
    """Kernel offsets ``(p, q)`` in row-major window order (window index ``p*kw + q``)."""
    return [(p, q) for p in range(g.kernel[0]) for q in range(g.kernel[1])]


def _block_extent(xp, shape, itemsize: int, nhwc: bool) -> tuple[int, int]:
    """``(bn, bc)``: images and channels of one block of an ``(N, C, H, W)`` tensor
    of ``itemsize``-byte elements.

    Whole images while one fits ``_BLOCK_BYTES``, else channel slices of one
    image; never channel slices of channels-last memory (each pixel's channels
    read piecemeal ran the forward 2x slower than whole images). On an array
    module other than NumPy (CuPy: no CPU cache to fit, a launch per pass) one
    block holds it all.
    """
    n, c, h, w = shape
    if xp is not np:
        return max(n, 1), max(c, 1)
    image = max(c * h * w * itemsize, 1)
    if image <= _BLOCK_BYTES or nhwc:
        return max(1, min(n, _BLOCK_BYTES // image)), max(c, 1)
    return 1, max(1, _BLOCK_BYTES // max(h * w * itemsize, 1))


def _nhwc(a) -> bool:
    """Whether ``a``'s channel axis is the fastest in memory (``storage_order``:
    packed channels-last, or a strided view of such a buffer)."""
    return storage_order(a) == "NHWC"


def _empty(xp, shape, dtype, nhwc: bool):
    """Uninitialised NCHW-shaped array, stored channels-last when asked: results
    keep their operand's storage order, so an NHWC plan pays no transpose."""
    if not nhwc:
        return xp.empty(shape, dtype=dtype)
    n, c, h, w = shape
    return xp.empty((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)


class _Blocking:
    """How an ``(N, C, H, W)`` tensor of ``itemsize``-byte elements is walked:
    blocks of ``extent`` (:func:`_block_extent`), and working buffers in the
    operand's storage order (``nhwc``): element-wise passes over operands of
    mixed orders ran several times slower."""

    def __init__(self, xp, shape, itemsize: int, nhwc: bool):
        self.xp, self.shape, self.nhwc = xp, tuple(shape), nhwc
        self.extent = _block_extent(xp, shape, itemsize, nhwc)

    def __iter__(self):
        """``(n_slice, c_slice)`` of every block, in order."""
        bn, bc = self.extent
        for n0 in range(0, self.shape[0], bn):
            for c0 in range(0, self.shape[1], bc):
                yield slice(n0, n0 + bn), slice(c0, c0 + bc)

    def scratch(self, hw, dtype):
        """A reusable ``(bn, bc) + hw`` buffer; :func:`_cut` fits it to a block."""
        return _empty(self.xp, self.extent + tuple(hw), dtype, self.nhwc)


def _cut(buf, block):
    """``buf`` (a scratch buffer) cut to ``block``'s images and channels: the last blocks may be smaller."""
    return buf[: block.shape[0], : block.shape[1]]


def _padded_hw(hw, buf_pad) -> tuple[int, int]:
    """``(H + pad_top + pad_bottom, W + pad_left + pad_right)`` of the working buffer."""
    (pt, pb), (pl, pr) = buf_pad
    return hw[0] + pt + pb, hw[1] + pl + pr


def _interior(buf, g: PoolGeometry):
    """The input cells of a padded ``(bn, bc, Hp, Wp)`` buffer, ``(bn, bc, H, W)``."""
    (pt, _), (pl, _) = g.buf_pad
    return buf[:, :, pt : pt + g.in_hw[0], pl : pl + g.in_hw[1]]


class _Padded:
    """Blocks of ``a`` ``(N, C, H, W)`` in ``dtype`` inside a border of ``fill``
    (``g.buf_pad``: explicit padding plus ceil_mode overhang).

    One buffer of a block's padded size is reused, its border written once;
    without border or cast a block is a view of ``a`` (nothing copied).
    """

    def __init__(self, blocking: _Blocking, a, g: PoolGeometry, dtype, fill):
        self.xp, self.a, self.g = blocking.xp, a, g
        self.buf = None
        if any(sum(g.buf_pad, ())) or np.dtype(a.dtype) != np.dtype(dtype):
            self.buf = blocking.scratch(_padded_hw(a.shape[2:], g.buf_pad), dtype)
            self.buf.fill(fill)

    def load(self, ns, cs):
        """The padded block ``a[ns, cs]``, ``(bn, bc, Hp, Wp)``."""
        block = self.a[ns, cs]
        if self.buf is None:
            return block
        buf = _cut(self.buf, block)
        self.xp.copyto(_interior(buf, self.g), block)
        return buf


class _Accumulator:
    """Sums into ``out`` ``(N, C, H, W)``, block by block, of contributions
    that may land in the padding: :meth:`begin` gives a zeroed padded buffer
    in ``dtype``, :meth:`finish` stores its interior into ``out`` (rounded once
    to out's dtype: SEMANTICS.md, Numbers). Without padding or cast the block
    of ``out`` itself is summed into."""

    def __init__(self, blocking: _Blocking, out, g: PoolGeometry, dtype):
        self.xp, self.out, self.g = blocking.xp, out, g
        self.buf = None
        if any(sum(g.buf_pad, ())) or np.dtype(out.dtype) != np.dtype(dtype):
            self.buf = blocking.scratch(_padded_hw(out.shape[2:], g.buf_pad), dtype)

    def begin(self, ns, cs):
        """A zeroed ``(bn, bc, Hp, Wp)`` buffer for the block ``out[ns, cs]``."""
        block = self.out[ns, cs]
        acc = block if self.buf is None else _cut(self.buf, block)
        acc.fill(0)
        return acc

    def finish(self, ns, cs, acc) -> None:
        """Store the block's sums ``acc`` (from :meth:`begin`) into ``out[ns, cs]``."""
        if self.buf is not None:
            self.xp.copyto(self.out[ns, cs], _interior(acc, self.g), casting="unsafe")


def _axis_inside(xp, n: int, s: int, pad_begin: int, o: int, p: int):
    """``(o,)`` bool: whether the windows' cell at kernel offset ``p`` along one
    axis (input position ``i*s - pad_begin + p``) lies in ``[0, n)``; None when
    all do (the usual case, decided without building the array)."""
    first, last = p - pad_begin, (o - 1) * s + p - pad_begin
    if first >= 0 and last < n:
        return None
    pos = xp.arange(o) * s + (p - pad_begin)
    return (pos >= 0) & (pos < n)


def _input_masks(xp, g: PoolGeometry) -> dict:
    """``{(p, q): (oh, ow) bool or None}``: which windows' cell at offset
    ``(p, q)`` is an input cell (None: every window's is). Padding cells must
    never win a tie with a ``-inf`` input cell (module docstring)."""
    (n_h, n_w), (s_h, s_w), (o_h, o_w) = g.in_hw, g.stride, g.out
    masks = {}
    for p, q in _offsets(g):
        rows = _axis_inside(xp, n_h, s_h, g.padding[0][0], o_h, p)
        cols = _axis_inside(xp, n_w, s_w, g.padding[1][0], o_w, q)
        if rows is None and cols is None:
            masks[p, q] = None
            continue
        rows = xp.ones(o_h, dtype=bool) if rows is None else rows
        cols = xp.ones(o_w, dtype=bool) if cols is None else cols
        masks[p, q] = rows[:, None] & cols[None, :]
    return masks


def _max_into(xp, buf, g: PoolGeometry, out) -> None:
    """``out`` ``(bn, bc, oh, ow)`` = the maximum of each window of the padded
    block ``buf``, one ``maximum`` per kernel offset (NaN-propagating, exact)."""
    offsets = _offsets(g)
    xp.copyto(out, _strided_view(buf, *offsets[0], g))
    for p, q in offsets[1:]:
        xp.maximum(out, _strided_view(buf, p, q, g), out=out)


class _MaxBlocks:
    """The blocks of a max pooling of ``x`` (:meth:`__iter__`), and which of
    their cells may win (:meth:`hit`). ``itemsize``: the largest element of
    the caller's other working buffers, which size the blocks too."""

    def __init__(self, xp, x, g: PoolGeometry, itemsize: int = 0):
        self.xp, self.g = xp, g
        self.blocking = _Blocking(xp, x.shape, max(x.itemsize, itemsize), _nhwc(x))
        self.padded = _Padded(self.blocking, x, g, x.dtype, -np.inf)
        self.top = self.blocking.scratch(g.out, x.dtype)
        self.masks = _input_masks(xp, g)

    def __iter__(self):
        """Yield ``(ns, cs, buf, top, nan)`` per block: its slices, the
        ``-inf``-padded block, its window maxima (a reused buffer), and
        whether one of them is NaN."""
        for ns, cs in self.blocking:
            buf = self.padded.load(ns, cs)
            top = _cut(self.top, buf)
            _max_into(self.xp, buf, self.g, top)
            yield ns, cs, buf, top, bool(self.xp.isnan(top).any())

    def hit(self, buf, top, p, q, nan: bool):
        """``(bn, bc, oh, ow)`` bool: windows of a block whose cell at offset
        ``(p, q)`` may win: equal to the window maximum ``top``, or a NaN (only
        then is ``top`` NaN, as ``maximum`` propagates it; looked for only when
        the block holds one), and an input cell (:func:`_input_masks`)."""
        view = _strided_view(buf, p, q, self.g)
        hit = view == top
        if nan:
            hit |= self.xp.isnan(view)
        if self.masks[p, q] is not None:
            hit &= self.masks[p, q]
        return hit


def _max_pool(xp, x, g: PoolGeometry):
    """Window maxima ``(N, C, oh, ow)`` of ``x``, in x's dtype and storage order."""
    blocking = _Blocking(xp, x.shape, x.itemsize, _nhwc(x))
    padded = _Padded(blocking, x, g, x.dtype, -np.inf)
    y = _empty(xp, x.shape[:2] + tuple(g.out), x.dtype, blocking.nhwc)
    for ns, cs in blocking:
        _max_into(xp, padded.load(ns, cs), g, y[ns, cs])
    return y


def _max_argwin(xp, x, g: PoolGeometry):
    """Window maxima and each window's winner: its row-major index ``p*kw + q``
    inside the window (uint8 up to 256 cells), the first NaN if the window
    holds one, else the first maximum among its input cells.

    The offset of index ``o`` among ``K`` marks its hits with ``K - o``; the
    largest mark of a window is its first hit (branch-free: no argmax over a
    window axis, no masked writes). Every window has a hit (an input cell
    always attains the maximum), so no mark stays 0.
    """
    blocks = _MaxBlocks(xp, x, g)
    offsets = _offsets(g)
    cells = len(offsets)
    mark_type = np.min_scalar_type(cells)
    y = _empty(xp, x.shape[:2] + tuple(g.out), x.dtype, blocks.blocking.nhwc)
    idx = _empty(xp, y.shape, np.min_scalar_type(cells - 1), blocks.blocking.nhwc)
    first_buf, mark_buf = (blocks.blocking.scratch(g.out, mark_type) for _ in range(2))
    for ns, cs, buf, top, nan in blocks:
        xp.copyto(y[ns, cs], top)
        first, mark = _cut(first_buf, top), _cut(mark_buf, top)
        first.fill(0)
        for o, (p, q) in enumerate(offsets):
            xp.multiply(blocks.hit(buf, top, p, q, nan), mark_type.type(cells - o), out=mark)
            xp.maximum(first, mark, out=first)
        xp.subtract(cells, first, out=idx[ns, cs], casting="unsafe")
    return y, idx


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
    return _max_pool(xp, x, _checked("max_pool2d", x, kernel_size, stride, padding, ceil_mode))


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


def _max_backward(xp, x, gy, g: PoolGeometry, relu: bool = False):
    """``(N, C, H, W)`` gradient, in gy's dtype and storage order: each
    window's ``gy`` added at its winner.

    Offset by offset in row-major order, the windows whose cell there hits
    (:meth:`_MaxBlocks.hit`) pass what is left of their ``gy`` to that cell
    and keep nothing, so a later tie adds 0: exactly routing to the first hit
    (module docstring). Overlapping windows add up in the compute dtype (half
    storage sums in float32: SEMANTICS.md, Numbers), rounded once at the end.

    ``relu``: ``relu_backward(x, gradient)`` instead, computed by routing only
    the ``gy`` of windows whose maximum is ``> 0``. A cell's gradient is the
    sum of the ``gy`` of the windows it wins, and their maximum is its value,
    so it keeps all of them where ``x > 0`` and gets +0 where that is false
    (0, negative, NaN), as the ReLU's ``where`` gives: the same bits.
    """
    acc = compute_dtype(xp, gy.dtype)
    blocks = _MaxBlocks(xp, x, g, np.dtype(acc).itemsize)
    gx = _empty(xp, x.shape, gy.dtype, _nhwc(gy))
    sums = _Accumulator(blocks.blocking, gx, g, acc)
    left_buf, routed_buf = (blocks.blocking.scratch(g.out, acc) for _ in range(2))
    offsets = _offsets(g)
    for ns, cs, buf, top, nan in blocks:
        left, routed = _cut(left_buf, top), _cut(routed_buf, top)
        xp.copyto(left, gy[ns, cs])
        finite = bool(xp.isfinite(left).all())
        if relu:
            _keep(xp, left, top > 0, finite)
        gbuf = sums.begin(ns, cs)
        for o, (p, q) in enumerate(offsets):
            hit = blocks.hit(buf, top, p, q, nan)
            _route(xp, _strided_view(gbuf, p, q, g), left, routed, hit, finite, o + 1 == len(offsets))
        sums.finish(ns, cs, gbuf)
    return gx


def _keep(xp, values, mask, finite: bool) -> None:
    """Zero ``values`` where ``mask`` is false: by a product when ``values``
    are finite (exact, branch-free; see :func:`_route`), else masked."""
    if finite:
        xp.multiply(values, mask, out=values)
    else:
        xp.copyto(values, 0, where=~mask)


def _route(xp, cells, left, routed, hit, finite: bool, last: bool) -> None:
    """Add ``left`` into ``cells`` where ``hit`` and zero it there (nothing is
    left to route once a window's winner has it); all ``(bn, bc, oh, ow)``.

    A finite ``left`` goes through ``left * hit`` and ``left - that``: exact
    (``v*1 = v``, ``v*0 = ±0`` adds nothing, ``v - v = 0``) and branch-free,
    several times faster than a masked ``where``/``copyto`` on the random
    masks of real data. A NaN or inf in ``gy`` (``inf * 0`` is NaN) takes the
    masked form, so such a value reaches its winner and no other cell.
    """
    if finite:
        xp.multiply(left, hit, out=routed)
        xp.add(cells, routed, out=cells)
        if not last:
            xp.subtract(left, routed, out=left)
        return
    xp.add(cells, xp.where(hit, left, 0), out=cells)
    if not last:
        xp.copyto(left, 0, where=hit)


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
    """``(N, C, oh, ow)``: ``v`` at each window's winner. The offsets are
    visited last to first, each copying where it hits, so the first hit (the
    winner) is written last. Winners are input cells: v's padding is never read."""
    blocks = _MaxBlocks(xp, x, g, v.itemsize)
    values = _Padded(blocks.blocking, v, g, v.dtype, 0)
    out = _empty(xp, x.shape[:2] + tuple(g.out), v.dtype, blocks.blocking.nhwc)
    offsets = _offsets(g)
    for ns, cs, buf, top, nan in blocks:
        vbuf, chosen = values.load(ns, cs), out[ns, cs]
        for p, q in reversed(offsets):
            xp.copyto(chosen, _strided_view(vbuf, p, q, g), where=blocks.hit(buf, top, p, q, nan))
    return out


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
    """``(N, C, oh, ow)`` window means in x's dtype and storage order: the
    window sums, one ``add`` per offset in row-major order, in the compute
    dtype (float32 for half storage), divided by :func:`_divisor`."""
    acc = compute_dtype(xp, x.dtype)
    blocking = _Blocking(xp, x.shape, max(x.itemsize, np.dtype(acc).itemsize), _nhwc(x))
    padded = _Padded(blocking, x, g, acc, 0)
    divisor = _divisor(xp, g, count_include_pad, acc)
    y = _empty(xp, x.shape[:2] + tuple(g.out), x.dtype, blocking.nhwc)
    # half storage sums in a float32 buffer, rounded once into y
    sums_buf = None if np.dtype(acc) == np.dtype(x.dtype) else blocking.scratch(g.out, acc)
    offsets = _offsets(g)
    for ns, cs in blocking:
        buf, block = padded.load(ns, cs), y[ns, cs]
        sums = block if sums_buf is None else _cut(sums_buf, block)
        xp.copyto(sums, _strided_view(buf, *offsets[0], g))
        for p, q in offsets[1:]:
            xp.add(sums, _strided_view(buf, p, q, g), out=sums)
        xp.divide(sums, divisor, out=sums)
        if sums_buf is not None:
            xp.copyto(block, sums, casting="unsafe")
    return y


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
    """``shape`` gradient, in gy's dtype and storage order: every window's
    ``gy / divisor`` added to each of its cells, one strided add per offset,
    in the compute dtype (rounded once)."""
    acc = compute_dtype(xp, gy.dtype)
    blocking = _Blocking(xp, shape, max(gy.itemsize, np.dtype(acc).itemsize), _nhwc(gy))
    divisor = _divisor(xp, g, count_include_pad, acc)
    gx = _empty(xp, shape, gy.dtype, blocking.nhwc)
    sums = _Accumulator(blocking, gx, g, acc)
    share_buf = blocking.scratch(g.out, acc)
    for ns, cs in blocking:
        block = gy[ns, cs]
        share = _cut(share_buf, block)
        xp.divide(block, divisor, out=share)
        gbuf = sums.begin(ns, cs)
        for p, q in _offsets(g):
            cells = _strided_view(gbuf, p, q, g)
            xp.add(cells, share, out=cells)
        sums.finish(ns, cs, gbuf)
    return gx


# ---- the kernels of graph nodes: the op's canonical fields, the node's extents

@reference_node(ops.MaxPool2d)
def max_pool2d_kernel(ctx, op, x):
    """``MaxPool2d`` node: :func:`max_pool2d` with the node's geometry."""
    return _max_pool(ctx.xp, x, node_geometry(op, x.shape[2:], ctx.out_shape(op, x)[2:]))


@reference_node(ops.MaxPool2dBackward)
def max_pool2d_backward_kernel(ctx, op, x, gy):
    """``MaxPool2dBackward`` node: :func:`max_pool2d_backward` with the node's geometry."""
    return _max_backward(ctx.xp, x, gy, node_geometry(op, x.shape[2:], gy.shape[2:]))


@reference_node(ops.MaxPool2dBackwardRelu)
def max_pool2d_backward_relu_kernel(ctx, op, x, gy):
    """``MaxPool2dBackwardRelu`` node: :func:`max_pool2d_backward_relu` with the
    node's geometry, the ReLU applied while routing (``_max_backward(relu=True)``:
    the same values, bit for bit, without a masked pass over the whole input)."""
    g = node_geometry(op, x.shape[2:], gy.shape[2:])
    return _max_backward(ctx.xp, x, gy, g, relu=True)


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
