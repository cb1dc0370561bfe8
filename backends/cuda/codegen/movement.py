"""Data-movement ops on the GPU: concat, slice, pad, their gradients, reshapes, transposes, zeros,
constants.

Each function mirrors its reference in ``backends/reference/shape.py`` and
``tensor.py`` (same arrays, the op's fields as keywords) and moves bytes with
one generated strided copy per input (:func:`.copies.copy_into`), written in
the output's memory order. A 4-D output is stored in ``layout`` (the layout
pass's choice for the node; by default its first input's), so no transpose
follows. A reshape of a C-ordered array is a view (no kernel: its rule
declares no fresh output); of a channels-last one, a copy into C order first;
a 4-D reshape stored channels-last, one copy into that order. Copies between
the two orders (a flatten of an NHWC activation, its gradient) are transposes:
``copies`` runs its tiled kernel for them.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from opgraph.errors import ShapeError
from opgraph.types import numpy_dtype, storage_order

from .. import storage
from .copies import copy_into
from .launch import empty


def layout_of(a, asked: str | None = None) -> str | None:
    """``asked`` if given, else ``'NHWC'`` for a 4-D ``a`` stored channels-last
    (packed, or a strided view such as a channel slice of an NHWC buffer:
    :func:`~opgraph.types.storage_order`), else None."""
    if asked is not None:
        return asked
    return "NHWC" if storage_order(a) == "NHWC" else None


def _axis(ndim: int, axis: int) -> int:
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} out of range for a {ndim}-D value")
    return axis % ndim


def concat(xp, *xs, axis, layout=None):
    """Join ``xs`` along ``axis``: each input copied into its slice of the output."""
    ax = _axis(xs[0].ndim, axis)
    shape = list(xs[0].shape)
    shape[ax] = sum(x.shape[ax] for x in xs)
    out = empty(xp, shape, xs[0].dtype, layout_of(xs[0], layout))
    start = 0
    for x in xs:
        stop = start + x.shape[ax]
        copy_into(xp, out[(slice(None),) * ax + (slice(start, stop),)], x)
        start = stop
    return out


def slice_(xp, x, *, axis, start, stop, layout=None):
    """``x[..., start:stop, ...]`` on ``axis``, a new array."""
    ax = _axis(x.ndim, axis)
    src = x[(slice(None),) * ax + (slice(start, stop),)]
    return copy_into(xp, empty(xp, src.shape, x.dtype, layout_of(x, layout)), src)


def slice_backward(xp, gy, *, axis, start, stop, input_shape, layout=None):
    """Zeros of ``input_shape`` with ``gy`` at ``start:stop`` on ``axis``: one pass."""
    ax = _axis(len(input_shape), axis)
    lo = [0] * len(input_shape)
    lo[ax] = start
    out = empty(xp, input_shape, gy.dtype, layout_of(gy, layout))
    return copy_into(xp, out, gy, lo=lo, fill=0.0)


def pad(xp, x, *, padding, value, layout=None):
    """Spatial padding of an NCHW-shaped ``x`` with ``value``: one pass."""
    (t, b), (l, r) = padding
    n, c, h, w = x.shape
    out = empty(xp, (n, c, h + t + b, w + l + r), x.dtype, layout_of(x, layout))
    return copy_into(xp, out, x, lo=(0, 0, t, l), fill=value)


def pad_backward(xp, gy, *, padding, layout=None):
    """``gy`` cropped by ``padding``."""
    (t, b), (l, r) = padding
    src = gy[:, :, t:gy.shape[2] - b, l:gy.shape[3] - r]
    return copy_into(xp, empty(xp, src.shape, gy.dtype, layout_of(gy, layout)), src)


def reshape(xp, x, *, shape, layout=None):
    """``x`` with ``shape`` (same size), in logical order: a view of a C-ordered
    ``x``, else a C-ordered copy first. A 4-D result the layout pass stores
    channels-last (``layout`` ``'NHWC'``: the gradient of a classifier's
    ``Flatten``, ``(N, C*H*W) -> (N, C, H, W)``) is written so by one
    generated (tiled, transposing) copy; returned as a C-ordered view, the
    executor converted it with CuPy's own copy, at a sixth of the copy
    bandwidth on the H200 (OverFeat bf16: 24 us for 18.9 MB). With one
    channel or one pixel (``(N, C) -> (N, C, 1, 1)`` after a global pool)
    both orders are the same memory: the view, no copy."""
    shape = tuple(shape)
    if math.prod(shape) != x.size:
        raise ShapeError(f"reshape: {x.shape} ({x.size} elements) cannot become {shape}")
    if _reshape_is_view(x, shape, layout):
        return x if x.shape == shape else x.reshape(shape)
    if _into_nhwc(shape, layout):
        src = x if x.shape == shape else reshape(xp, x, shape=shape)
        return copy_into(xp, empty(xp, shape, x.dtype, "NHWC"), src)
    return copy_into(xp, empty(xp, x.shape, x.dtype), x).reshape(shape)


def _into_nhwc(shape, layout) -> bool:
    """Whether a reshape's result is to be stored channels-last, which C order
    is not: with one channel or one pixel (the gradient of a Flatten after a
    global pool) both orders are the same memory, so C order is kept."""
    return layout == "NHWC" and len(shape) == 4 and shape[1] > 1 and shape[2] * shape[3] > 1


def _reshape_is_view(x, shape, layout) -> bool:
    """Whether :func:`reshape` returns a view of ``x`` (no kernel): ``x`` already
    stored as the result is to be, or a C-ordered ``x`` reshaped into C order."""
    if _into_nhwc(shape, layout):
        return x.shape == shape and storage_order(x) == "NHWC"
    return bool(x.flags.c_contiguous)


def flatten(xp, x, *, start_dim, layout=None):
    """Axes ``start_dim..`` merged into one (:func:`reshape`, into ``layout``: a 4-D
    result, of a 5-D value or of ``start_dim=3``, may be stored channels-last)."""
    return reshape(xp, x, shape=(*x.shape[:start_dim], math.prod(x.shape[start_dim:])), layout=layout)


def transpose(xp, x, *, perm, layout=None):
    """``x.transpose(perm)``: the view itself when it is stored as the output
    is to be (``layout``, the layout pass's choice for a 4-D output; C order
    otherwise): ConvNeXt's ``permute(0, 2, 3, 1)`` of an NHWC activation is
    the C-ordered (N, H, W, C) buffer, and its permute back of that is NHWC
    (``passes/layout.py``: no copy, no launch). Else one strided copy into
    that order (a 4-D output stored channels-last is written so, not copied
    into C order for the executor to transpose again)."""
    src = x.transpose(tuple(perm))
    if _stored_as(src, layout):
        return src
    nhwc = layout == "NHWC" and src.ndim == 4
    return copy_into(xp, empty(xp, src.shape, x.dtype, "NHWC" if nhwc else None), src)


def _stored_as(a, layout) -> bool:
    """Whether ``a`` is dense in the order an output stored in ``layout`` is
    written: the NCHW-shaped view of a packed (N, H, W, C) buffer for a 4-D
    ``'NHWC'`` one, C order otherwise."""
    if layout == "NHWC" and a.ndim == 4:
        return bool(a.transpose(0, 2, 3, 1).flags.c_contiguous)
    return bool(a.flags.c_contiguous)


def stand_in(t):
    """A zero-byte NumPy array with the shape of TensorType ``t`` and the
    strides of its storage (packed NHWC for a 4-D value so stored, C order
    otherwise): the view decisions below, made from types, read its flags."""
    nhwc = t.layout == "NHWC" and len(t.shape) == 4
    shape = (t.shape[0], *t.shape[2:], t.shape[1]) if nhwc else tuple(t.shape)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    a = as_strided(np.zeros(1, np.uint8), shape, strides, writeable=False)
    return a.transpose(0, 3, 1, 2) if nhwc else a


def transpose_view(op, in_types, out_type) -> int | None:
    """0 when :func:`transpose` of an input of ``in_types[0]`` returns a view of
    it for an output of ``out_type`` (``Rule.output_view``), else None."""
    return 0 if _stored_as(stand_in(in_types[0]).transpose(tuple(op.perm)), out_type.layout) else None


def reshape_view(op, in_types, out_type) -> int | None:
    """0 when :func:`reshape` (``Reshape`` or ``Flatten``) returns a view of its input
    for these types, else None."""
    return 0 if _reshape_is_view(stand_in(in_types[0]), tuple(out_type.shape), out_type.layout) else None


def zeros(xp, *, type, layout=None):
    """Zeros of a TensorType, stored in ``layout`` (default: the type's): a
    memset (capturable; bfloat16 as zero bits)."""
    dt = numpy_dtype(type.dtype)
    if (layout or type.layout) == "NHWC" and len(type.shape) == 4:
        n, c, h, w = type.shape
        return storage.zeros(xp, (n, h, w, c), dt).transpose(0, 3, 1, 2)
    return storage.zeros(xp, type.shape, dt)


#: (device, id of a Constant's array) -> (that array, its device copy): each
#: constant crosses to the device once, in its first (uncaptured) run.
_ON_DEVICE: dict[tuple[int, int], tuple] = {}


def constant(xp, *, value):
    """A ``Constant``'s array on the device, as a fresh array: uploaded once per
    array and device (the op holds it, read-only), then one device-to-device
    copy per call, so that a step has no host-to-device transfer and can be
    captured in a CUDA graph (EfficientNet's stochastic-depth masks are
    constants read every step)."""
    key = (xp.cuda.runtime.getDevice(), id(value))
    hit = _ON_DEVICE.get(key)
    if hit is None or hit[0] is not value:  # an id reused by another array
        hit = _ON_DEVICE[key] = (value, xp.asarray(value))
    return hit[1].copy()


__all__ = ["layout_of", "concat", "slice_", "slice_backward", "pad", "pad_backward", "reshape",
           "flatten", "transpose", "zeros", "constant", "stand_in", "transpose_view", "reshape_view"]
