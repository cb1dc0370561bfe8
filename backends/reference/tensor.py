"""Reference (oracle) data-movement kernels: flatten, reshape, concat, slice, pad.

Every kernel takes the array module ``xp`` first and returns a fresh,
contiguous array, never a view of an input, so an executor may reuse or
overwrite any buffer (in-place ReLU, buffer sharing) without aliasing bugs.

``pad`` / ``pad_backward`` act on the two spatial axes of an NCHW tensor with
canonical padding ``((top, bottom), (left, right))``; they are the explicit
padding nodes the legalize pass inserts (ARCHITECTURE.md, Passes).
"""

from __future__ import annotations

import math

from opgraph import ops
from opgraph.errors import ParameterError, ShapeError
from opgraph.types import is_channels_last

from .kernel import reference

#: NCHW axis -> axis of the (N, H, W, C) buffer behind a channels-last view.
_NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}


def _axis(ndim, axis, name="axis"):
    if isinstance(axis, bool) or int(axis) != axis or not -ndim <= axis < ndim:
        raise ParameterError(name, axis, f"out of range for {ndim}-D input")
    return int(axis) % ndim


@reference(ops.Flatten)
def flatten(xp, x, *, start_dim):
    """Merge axes ``start_dim..`` into one: ``(d0, .., d_{s-1}, prod(rest))``.

    Works with zero-size axes (the merged extent is computed, not inferred
    with -1). Raises ParameterError for a bad start_dim.
    """
    if x.ndim == 0:
        raise ShapeError("flatten: x must have at least one axis")
    s = _axis(x.ndim, start_dim, "start_dim")
    return xp.reshape(x, tuple(x.shape[:s]) + (math.prod(x.shape[s:]),)).copy()


@reference(ops.Reshape)
def reshape(xp, x, *, shape):
    """``x`` with a new shape of the same size (one -1 entry allowed where
    numpy can infer it). Raises ShapeError if the sizes differ."""
    shape = tuple(int(v) for v in shape)
    known = math.prod(v for v in shape if v != -1)
    if (-1 not in shape and known != x.size) or shape.count(-1) > 1:
        raise ShapeError(f"reshape: cannot reshape {x.shape} ({x.size} elements) to {shape}")
    try:
        return xp.reshape(x, shape).copy()
    except ValueError as e:
        raise ShapeError(f"reshape: cannot reshape {x.shape} to {shape}: {e}") from None


@reference(ops.Concat)
def concat(xp, *xs, axis):
    """Concatenate along ``axis`` (1, channels, for NCHW); zero-size inputs
    are allowed.

    Raises:
        ShapeError: no input, differing ranks or differing extents off the
            axis (naming the input). ParameterError: bad axis.
    """
    if not xs:
        raise ShapeError("concat: needs at least one input")
    ax = _axis(xs[0].ndim, axis)
    ref = xs[0].shape
    for i, a in enumerate(xs):
        if a.ndim != len(ref) or any(a.shape[d] != ref[d] for d in range(a.ndim) if d != ax):
            raise ShapeError(f"concat: input {i} has shape {a.shape}, input 0 has {ref}; "
                             f"they may differ only on axis {ax}")
    if all(is_channels_last(a) for a in xs):  # keep channels-last storage (the layout pass's choice)
        buffers = [a.transpose(0, 2, 3, 1) for a in xs]
        return xp.concatenate(buffers, axis=_NHWC_AXIS[ax]).transpose(0, 3, 1, 2)
    return xp.concatenate(xs, axis=ax)


def _slice_index(ndim, axis, start, stop):
    ax = _axis(ndim, axis)
    return ax, (slice(None),) * ax + (slice(start, stop),)


@reference(ops.Slice)
def slice_(xp, x, *, axis, start, stop):
    """``x[..., start:stop, ...]`` on ``axis`` (Python slice rules, step 1:
    negative indices count from the end, out-of-range ends clip).

    Raises ParameterError for a bad axis.
    """
    _, idx = _slice_index(x.ndim, axis, start, stop)
    return x[idx].copy(order="K")  # keeps x's memory order (NCHW or channels-last)


take_slice = slice_


@reference(ops.SliceBackward)
def slice_backward(xp, gy, *, axis, start, stop, input_shape):
    """Gradient of :func:`slice_`: zeros of ``input_shape`` with ``gy``
    written at the slice.

    Raises:
        ShapeError: gy's shape is not the slice's shape.
    """
    shape = tuple(int(v) for v in input_shape)
    ax, idx = _slice_index(len(shape), axis, start, stop)
    if is_channels_last(gy) and len(shape) == 4:  # the gradient keeps gy's storage order
        out = xp.zeros((shape[0], shape[2], shape[3], shape[1]), dtype=gy.dtype).transpose(0, 3, 1, 2)
    else:
        out = xp.zeros(shape, dtype=gy.dtype)
    if tuple(out[idx].shape) != tuple(gy.shape):
        raise ShapeError(f"slice_backward: gy has shape {gy.shape}, the slice {start}:{stop} on "
                         f"axis {ax} of {shape} has {out[idx].shape}")
    out[idx] = gy
    return out


@reference(ops.Pad)
def pad(xp, x, *, padding, value):
    """Constant spatial padding of an NCHW tensor.

    Args:
        x: ``(N, C, H, W)``.
        padding: ``((top, bottom), (left, right))``, the canonical form of
            the ``Pad`` op's field (read as is: the op canonicalised it).
        value: fill value (0 for convolution, -inf for max pooling).

    Returns:
        ``(N, C, H + top + bottom, W + left + right)`` in x's dtype.

    Raises:
        ShapeError: x not 4-D.
    """
    (t, b), (l, r) = padding
    if x.ndim != 4:
        raise ShapeError(f"pad: x must be 4-D NCHW, got shape {x.shape}")
    return xp.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=value)


@reference(ops.PadBackward)
def pad_backward(xp, gy, *, padding):
    """Gradient of :func:`pad`: ``gy`` cropped by ``padding`` (canonical, as :func:`pad`).

    Raises:
        ShapeError: gy not 4-D or smaller than the padding.
    """
    (t, b), (l, r) = padding
    if gy.ndim != 4 or gy.shape[2] < t + b or gy.shape[3] < l + r:
        raise ShapeError(f"pad_backward: gy of shape {gy.shape} cannot be cropped by {padding}")
    h, w = gy.shape[2], gy.shape[3]
    return gy[:, :, t : h - b, l : w - r].copy(order="K")


__all__ = ["flatten", "reshape", "concat", "slice_", "take_slice", "slice_backward", "pad",
           "pad_backward"]
