"""CuPy kernels of max pooling that saves each window's winner as a 1-byte index.

The oracle and the motivation: ``reference/pool_indices.py``. Two kernels,
built on :mod:`.pool`'s (same thread layout, geometry arguments, index
width, ``specialize`` variant, bfloat16 through its bits with the
``LD``/``ST`` macros, float16 computed in float32):

* :func:`max_pool2d_with_indices`: one thread per output cell scans its
  window as ``MaxPool2d``'s kernel does (first in-bounds cell, then a
  strictly greater value or the first NaN replaces it: SEMANTICS.md's
  first-maximum rule, padding never winning) and stores the window's maximum
  and its winner's row-major window index ``(h - h0) * kw + (w - w0)`` as a
  uint8: reads x once, writes y and idx once;
* :func:`max_pool2d_backward_indices`: one thread per input cell gathers
  ``gy`` of every window covering it whose saved index names it (no atomics,
  deterministic, overlapping windows summed in float32): reads idx and gy,
  writes gx, once each; x is not read.

NCHW and NHWC (a channels-last view) run without a transpose; outputs come
back in the input's layout (idx in x's, gx in idx's).

The graph's ops over saved indices (``opgraph/ops/pool_indices.py``) run
here as ``cuda`` node kernels (:func:`max_pool2d_argmax_kernel`,
:func:`max_pool2d_take_kernel`, :func:`max_pool2d_backward_indices_kernel`;
the one scan writing the pooled value and the winners,
:func:`max_pool2d_scan_kernel`, into the buffer that
:func:`max_pool2d_argmax_slot_kernel` allocates),
with a third kernel, :func:`max_pool2d_take` (x at each saved winner, one
read per output element); the argmax's ``relu`` adds ``MASKED`` (128) to the
index of a window whose winner is not > 0, and ``masked`` take and gather
honour it. With the ``vector`` option (an autotune variant) channels-last
bfloat16 and float32 operands take :mod:`.pool_vector`'s kernels, 16 bytes
of channels per thread, where they qualify.
"""

from __future__ import annotations

from opgraph.errors import ShapeError
from opgraph.ops.pool_indices import MASKED
from opgraph.types import storage_order

from ..reference.pool import PoolGeometry, node_geometry
from ..reference.pool_indices import backward_shape, check_window
from . import pool_vector
from .pool import (_DECOMPOSE, _MAX, _WINDOWS, _computable, _finish, _geo, _out, _pixels, _prepare, _run,
                   _specialize, _storage, _tile, _vector)
from .storage import bits, empty_in_layout, in_layout, logical, physical

#: Forward: the maximum as ``MaxPool2d``, its winner's window index as a byte
#: (``relu``: plus MASKED where the winner is not > 0).
_INDEX = "idx[t] = (unsigned char)((win / W - h0) * kw + (win % W - w0));"
_MAX_IDX = {False: _MAX.replace("STORE", _INDEX),
            True: _MAX.replace("STORE", _INDEX + f"\n    if (!(best > (CT)0)) idx[t] |= {MASKED};")}
#: The argmax alone: the scan without the maximum's store.
_ARGMAX = {relu: body.replace("ST(y[t], best);", "") for relu, body in _MAX_IDX.items()}

#: Take: (a, b) = (oh, ow); byte k names window cell (k / kw, k % kw).
_TAKE = _DECOMPOSE + """
    const int byte = (int)idx[t], k = byte & INDEX_BITS;
    const IDX h = a * sh - pt + k / kw, w = b * sw - pl + k % kw;
    CT v = (CT)-__uint_as_float(0x7f800000u);  // -inf (NVRTC has no INFINITY)
    if (MASK_TEST) v = (CT)0;
    else if (k < kh * kw && h >= 0 && h < H && w >= 0 && w < W) v = LD(x[xc + h * xh + w * xw]);
    ST(y[t], v);
"""

#: Backward: (a, b) is the input cell; in window (oh, ow) it sits at row
#: a + pt - oh * sh, column b + pl - ow * sw.
#: ``INDEX_BITS``: 0xff (masked: a marked byte names no cell) or 0x7f (the mark stripped).
_IDX_BWD = _WINDOWS + """
    for (IDX oh = oh0; oh <= oh1; ++oh)
        for (IDX ow = ow0; ow <= ow1; ++ow) {
            const IDX o = oc + oh * oh_ + ow * ow_;
            if ((IDX)(idx[o] & INDEX_BITS) == (hp - oh * sh) * kw + (wp - ow * sw)) acc += LD(gy[o]);
        }
    ST(gx[xc + a * xh + b * xw], acc);
"""


def _index_bits(masked: bool, g: PoolGeometry) -> str:
    """The bits of a saved byte that name the window cell: all of them when
    ``masked`` (a marked byte then names none) or when the window has over 128
    cells (no mark), else the 7 below the mark."""
    return "0xff" if masked or g.kernel[0] * g.kernel[1] > MASKED else hex(MASKED - 1)


def _in_order(a, cl: bool):
    """``a`` (logical ``(N, C, H, W)``) as the C-contiguous buffer the scalar kernels index in
    storage order ``cl`` (NHWC when True), without a copy; None when its memory is not laid out
    so."""
    buf = a.transpose(0, 2, 3, 1) if cl else a
    return buf if buf.flags.c_contiguous else None


def _indexed_scan(xp, x, g: PoolGeometry, specialize: bool, relu: bool, keep_max: bool, what: str,
                  slot=None):
    """``(y or None, idx, cl, dtype)``: the window scan writing each winner's index
    (``relu``: marked where it is not > 0), and the maximum with ``keep_max``. ``slot``: a uint8
    array of the pooled shape the indices go into (then ``idx`` is its buffer): written by the
    kernel itself where its memory is dense in the scan's storage order (x's), else through a
    temporary copied in (what :func:`scan_workspace` declares)."""
    check_window(g, relu)
    buf, cl, dtype = _prepare(xp, x, what)
    n, c = x.shape[:2]
    y = _out(xp, buf, n, c, g.out, cl) if keep_max else None
    direct = None if slot is None else _in_order(slot, cl)
    idx = direct if direct is not None else _out(xp, buf, n, c, g.out, cl, xp.uint8)
    if idx.size:
        outs = [*([y.ravel()] if keep_max else []), idx.ravel()]
        _run(("maxpool_idx" if keep_max else "maxpool_argmax") + ("_relu" if relu else ""), "raw T x", [buf.ravel()],
             "raw T y, raw uint8 idx" if keep_max else "raw uint8 idx", outs,
             (_MAX_IDX if keep_max else _ARGMAX)[relu], _geo(c, g, cl, g.out), size=idx.size,
             arrays=(buf, idx), storage=_storage(dtype), specialize=specialize)
    if slot is not None and direct is None:
        slot[...] = logical(idx, cl)  # one copy kernel (a transpose where the orders differ)
    return y, idx, cl, dtype


def max_pool2d_with_indices(xp, x, g: PoolGeometry, specialize: bool = False, relu: bool = False):
    """``(y, idx)``: max pooling of ``(N, C, H, W)`` x (x's dtype and layout)
    and each window's winner, uint8 ``(N, C, oh, ow)`` in x's layout
    (``relu``: plus ``MASKED`` where the winner is not > 0).

    Raises:
        ParameterError: a window of more than 256 cells (128 with ``relu``).
        ShapeError: x not 4-D.
    """
    y, idx, cl, dtype = _indexed_scan(xp, x, g, specialize, relu, True, "max_pool2d_with_indices")
    return _finish(xp, y, cl, dtype), logical(idx, cl)


def max_pool2d_scan(xp, x, slot, g: PoolGeometry, specialize: bool = False, relu: bool = False):
    """:func:`max_pool2d_with_indices` writing its indices into ``slot`` (uint8, the pooled shape,
    any layout) instead of a new array: returns the pooled maximum (x's dtype and layout). The
    kernel stores into ``slot`` itself where it is dense in x's storage order (what the argmax
    slot's step allocates for x's layout); otherwise, and for float16 (computed in float32),
    the temporaries are those of :func:`scan_workspace`.

    Raises:
        ParameterError: a window of more than 256 cells (128 with ``relu``).
        ShapeError: x not 4-D.
    """
    y, _, cl, dtype = _indexed_scan(xp, x, g, specialize, relu, True, "max_pool2d_scan", slot)
    return _finish(xp, y, cl, dtype)


def _scan_order(t) -> bool:
    """Whether the scalar kernels index a value of type ``t`` in NHWC order: stored channels-last
    with more than one channel and one pixel (``storage.physical``; ``is_channels_last`` counts
    the others as NCHW, the same memory)."""
    _, c, h, w = t.shape
    return t.layout == "NHWC" and c > 1 and h * w > 1


def scan_workspace(op, in_types, options) -> int:
    """Scratch bytes of one ``MaxPool2dScan`` call (``Rule.workspace``; ``in_types`` x and the slot,
    as they run): float16 x converted to float32 and the float32 maxima rounded into y (4 bytes
    per element of each), and the winners' temporary when the slot is not dense in x's storage
    order (its uint8 bytes: an NCHW slot beside channels-last x, or one of several pixels beside
    a one-pixel x). The vector path writes the slot in place and allocates y only, so the bound
    holds for every option. Not counted, as for every kernel (``Rule.contiguous_inputs``): the
    dense copy of an x that is a view neither NCHW- nor NHWC-dense."""
    x, slot = in_types[:2]
    total = 4 * (x.size + slot.size) if x.dtype == "float16" else 0
    one_order = slot.shape[1] == 1 or slot.shape[2] * slot.shape[3] == 1  # both orders are one memory
    if not one_order and _scan_order(x) != (slot.layout == "NHWC"):
        total += slot.size
    return total


def max_pool2d_argmax(xp, x, g: PoolGeometry, specialize: bool = False, relu: bool = False):
    """The ``idx`` of :func:`max_pool2d_with_indices` alone (the maximum is not
    stored): uint8 ``(N, C, oh, ow)`` in x's layout.

    Raises:
        ParameterError: a window of more than 256 cells (128 with ``relu``).
        ShapeError: x not 4-D.
    """
    _, idx, cl, _ = _indexed_scan(xp, x, g, specialize, relu, False, "max_pool2d_argmax")
    return logical(idx, cl)


def max_pool2d_take(xp, x, idx, g: PoolGeometry, specialize: bool = False, masked: bool = False):
    """``x`` (``(N, C, H, W)``) at each window's saved winner ``idx`` (uint8,
    the pooled shape): the pooled shape in x's dtype and layout; an index
    naming no input cell of its window reads -inf, a marked one 0 with
    ``masked`` (``opgraph/ops/pool_indices.py``).

    Raises:
        ShapeError: idx is not the pooled shape, or x not 4-D.
    """
    pooled = tuple(x.shape[:2]) + tuple(g.out)
    if tuple(idx.shape) != pooled:
        raise ShapeError(f"max_pool2d_take: idx {tuple(idx.shape)} is not the pooled shape {pooled}")
    buf, cl, dtype = _prepare(xp, x, "max_pool2d_take")
    ib = in_layout(xp, idx, cl)
    y = _out(xp, buf, x.shape[0], x.shape[1], g.out, cl)
    if y.size:
        body = _TAKE.replace("MASK_TEST", f"byte & {MASKED}" if masked else "false").replace(
            "INDEX_BITS", _index_bits(False, g))
        _run("maxpool_take" + ("_masked" if masked else ""), "raw T x, raw uint8 idx", [buf.ravel(), ib.ravel()],
             "raw T y", [y.ravel()], body, _geo(x.shape[1], g, cl, g.out), size=y.size, arrays=(buf, y),
             storage=_storage(dtype), specialize=specialize)
    return _finish(xp, y, cl, dtype)


def max_pool2d_backward_indices(xp, idx, gy, g: PoolGeometry, input_shape, specialize: bool = False,
                                masked: bool = False, channels_last: bool | None = None):
    """Input gradient of max pooling from the saved winners: ``input_shape``
    in gy's dtype (``masked``: marked windows route nothing), stored NHWC when
    ``channels_last``, NCHW when False, in idx's storage order when None (a
    node's kernel says: a 1 x 1 pooled idx has no order of its own).

    Raises:
        ShapeError: idx and gy differ in shape or are not the pooled shape.
    """
    shape = backward_shape(idx, gy, g, input_shape)
    ib, cl = physical(xp, idx)  # copied only when neither NCHW- nor NHWC-dense
    if channels_last is not None and channels_last != cl:
        ib, cl = in_layout(xp, idx, channels_last), channels_last
    gb = _computable(xp, in_layout(xp, bits(xp, gy), cl))
    gx = _out(xp, gb, shape[0], shape[1], shape[2:], cl)
    if gx.size:
        _run("maxpool_idx_bwd", "raw T gy, raw uint8 idx", [gb.ravel(), ib.ravel()], "raw T gx", [gx.ravel()],
             _IDX_BWD.replace("INDEX_BITS", _index_bits(masked, g)), _geo(shape[1], g, cl, shape[2:]), size=gx.size,
             arrays=(gb, gx), storage=_storage(gy.dtype), specialize=specialize)
    return _finish(xp, gx, cl, gy.dtype)


# ---- node kernels (ctx, op, *arrays): the op's fields, the node's extents, the variant's options

def max_pool2d_argmax_kernel(ctx, op, x):
    """``MaxPool2dArgmax`` node: the vector scan (``pool_vector``, option
    ``vector``, ``pixels``, ``tile``) where x qualifies, else :func:`max_pool2d_argmax`."""
    g = node_geometry(op, x.shape[2:], ctx.out_shape(op, x)[2:])
    if _vector(ctx) and pool_vector.applies(g, x, max_cells=MASKED) is None:
        return pool_vector.max_pool2d_argmax(ctx.xp, x, g, op.relu, _pixels(ctx), _tile(ctx))
    return max_pool2d_argmax(ctx.xp, x, g, _specialize(ctx), op.relu)


def max_pool2d_argmax_slot_kernel(ctx, op, x):
    """``MaxPool2dArgmaxSlot`` node: a new uninitialised uint8 array of the pooled
    shape ``(N, C, OH, OW)`` in the node's layout (``ctx.out_type``; without one,
    x's storage order), which the node's ``MaxPool2dScan`` reader fills. NHWC: the
    ``(N, C, OH, OW)`` view of a dense ``(N, OH, OW, C)`` buffer, as
    ``pool_vector.max_pool2d_argmax`` returns its indices, so the vector scan
    writes it in place (:func:`pool_vector.indices_apply`: CuPy's pool aligns it).
    No kernel runs (capturable: an allocation from the current pool)."""
    layout = ctx.out_type.layout if ctx.out_type is not None else storage_order(x)
    return empty_in_layout(ctx.xp, ctx.out_shape(op, x), ctx.xp.uint8, layout == "NHWC")


def max_pool2d_scan_kernel(ctx, op, x, slot):
    """``MaxPool2dScan`` node: ``MaxPool2d(x)`` returned (x's dtype; channels-last
    from the vector path, x's layout from the scalar one) and
    ``MaxPool2dArgmax(x; relu)`` written into ``slot`` in place. The vector
    scan (``pool_vector.max_pool2d_scan``, options ``vector``, ``pixels``,
    ``tile``) where x qualifies and the slot is dense channels-last uint8
    (:func:`pool_vector.indices_apply`, as the slot kernel allocates NHWC);
    else the scalar scan :func:`max_pool2d_scan`, which writes the slot
    itself where it is dense in x's storage order (an NCHW slot beside NCHW
    x, float16 or float64, an unaligned x) and declares what it allocates
    otherwise (:func:`scan_workspace`, the rule's workspace).

    Raises:
        ShapeError: slot not the pooled shape, or x not 4-D.
        ParameterError: a window of more than 128 cells with ``relu`` (256 without)."""
    pooled = tuple(x.shape[:2]) + tuple(slot.shape[2:])
    if tuple(slot.shape) != pooled or slot.dtype != ctx.xp.uint8:
        raise ShapeError(f"max_pool2d_scan: slot {slot.dtype} {tuple(slot.shape)} is not uint8 {pooled}")
    g = node_geometry(op, x.shape[2:], slot.shape[2:])
    if _vector(ctx) and pool_vector.applies(g, x, max_cells=MASKED) is None and pool_vector.indices_apply(slot):
        return pool_vector.max_pool2d_scan(ctx.xp, x, slot, g, op.relu, _pixels(ctx), _tile(ctx))
    return max_pool2d_scan(ctx.xp, x, slot, g, _specialize(ctx), op.relu)


def max_pool2d_take_kernel(ctx, op, x, idx):
    """``MaxPool2dTake`` node: the vector take (option ``tile``: from a
    shared-memory tile of x) where x and idx qualify, else :func:`max_pool2d_take`."""
    g = node_geometry(op, x.shape[2:], idx.shape[2:])
    if _vector(ctx) and pool_vector.applies(g, x, max_cells=MASKED) is None and pool_vector.indices_apply(idx):
        return pool_vector.max_pool2d_take(ctx.xp, x, idx, g, op.masked, _tile(ctx))
    return max_pool2d_take(ctx.xp, x, idx, g, _specialize(ctx), op.masked)


def max_pool2d_backward_indices_kernel(ctx, op, idx, gy):
    """``MaxPool2dBackwardIndices`` node: the vector gather (option ``tile``:
    from shared-memory tiles) where idx and gy qualify, else
    :func:`max_pool2d_backward_indices`."""
    shape = tuple(op.input_shape)
    g = node_geometry(op, shape[2:], gy.shape[2:])
    if _vector(ctx) and pool_vector.applies(g, gy, max_cells=MASKED) is None and pool_vector.indices_apply(idx):
        return pool_vector.max_pool2d_backward_indices(ctx.xp, idx, gy, g, shape, op.masked, _tile(ctx))
    layout = ctx.out_type.layout if ctx.out_type is not None else None
    nhwc = None if layout is None else layout == "NHWC"
    return max_pool2d_backward_indices(ctx.xp, idx, gy, g, shape, _specialize(ctx), op.masked, nhwc)


__all__ = ["max_pool2d_with_indices", "max_pool2d_scan", "scan_workspace", "max_pool2d_argmax", "max_pool2d_take",
           "max_pool2d_backward_indices",
           "max_pool2d_argmax_kernel", "max_pool2d_argmax_slot_kernel", "max_pool2d_scan_kernel",
           "max_pool2d_take_kernel", "max_pool2d_backward_indices_kernel"]
