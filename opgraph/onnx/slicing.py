"""ONNX converters of ``Slice`` and ``Split`` (channel splits of ShuffleNet
and friends) onto opgraph's unit-step ``Slice`` op, one per sliced axis.

Semantics (ONNX operator spec):

* ``Slice``: for each ``axes[i]`` (default ``0 .. len(starts) - 1``; negative
  counts from the end), ``starts[i]`` and ``ends[i]`` have the axis extent
  ``dim`` added when negative, then are clamped to ``[0, dim]`` for a positive
  step and to ``[0, dim - 1]`` / ``[-1, dim - 1]`` for a negative one; ``steps``
  default 1, 0 is invalid. Version 1 takes ``starts``, ``ends``, ``axes`` as
  attributes; from 10 on they are inputs, which must be import-time constants
  here (ShuffleNet's are computed from ``Shape``, and fold). A computed input
  may be sliced with step 1 only (opgraph has no strided slice); an
  import-time one with any step.
* ``Split``: along ``axis`` (default 0) into ``split`` sizes (an attribute
  before 13, an optional input from 13), which must sum to the extent; without
  ``split``, into as many equal parts as the node has outputs (before 18), or
  ``num_outputs`` parts of ``ceil(dim / num_outputs)`` with a smaller last one
  (18).
"""

from __future__ import annotations

import math

import numpy as np

from ..ops import Slice
from .registry import converter


def _list(ctx, i: int, attr: str, what: str, required: bool) -> list[int] | None:
    """Integers from attribute ``attr`` (version 1) or input ``i`` (10 and later)."""
    if ctx.version < 10:
        value = ctx.attr(attr)
    else:
        value = ctx.require_static(i, what) if ctx.has_input(i) else None
    if value is None:
        if required:
            raise ctx.error(f"{what} are required")
        return None
    arr = np.asarray(value)
    if arr.ndim > 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ctx.error(f"{what} must be a 1-D integer tensor, got {arr.dtype}{list(arr.shape)}")
    return [int(v) for v in arr.reshape(-1)]


def _bounds(start: int, end: int, step: int, dim: int) -> slice:
    """The spec's clamping of one axis, as a Python slice of that axis."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(max(0, min(dim, start)), max(0, min(dim, end)), step)
    start, end = max(0, min(dim - 1, start)), max(-1, min(dim - 1, end))
    return slice(start, None if end < 0 else end, step)  # end -1: down to index 0 included


def _resolved(ctx, shape) -> dict[int, slice]:
    """axis -> clamped slice of every axis the node slices."""
    rank = len(shape)
    starts = _list(ctx, 1, "starts", "starts", True)
    ends = _list(ctx, 2, "ends", "ends", True)
    axes = _list(ctx, 3, "axes", "axes", False)
    steps = _list(ctx, 4, "steps", "steps", False) if ctx.version >= 10 else None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
        raise ctx.error(f"axes {axes} are repeated or out of range for a {rank}-D input")
    if 0 in steps:
        raise ctx.error(f"steps {steps}: a step of 0 is invalid")
    return {a % rank: _bounds(s, e, st, shape[a % rank]) for s, e, a, st in zip(starts, ends, axes, steps)}


@converter("Slice", {1, 10, 11, 13})
def slice_(ctx):
    shape = ctx.shape(0)
    cuts = _resolved(ctx, shape)
    if ctx.foldable(0):
        return ctx.static(0)[tuple(cuts.get(a, slice(None)) for a in range(len(shape)))]
    y = ctx.input(0)
    todo = [(a, s) for a, s in sorted(cuts.items()) if s.indices(shape[a]) != (0, shape[a], 1)]
    for k, (axis, s) in enumerate(todo):
        start, stop, step = s.indices(shape[axis])
        if step != 1:
            raise ctx.error(f"step {step} on axis {axis} of a computed tensor is not supported "
                            "(opgraph slices with step 1 only)")
        params = dict(axis=axis, start=start, stop=max(start, stop))
        y = ctx.apply(Slice, params, [y], None if k == len(todo) - 1 else f"axis{axis}")
    return y


def _sizes(ctx, dim: int, outputs: int) -> list[int]:
    """The chunk sizes of a Split along an axis of extent ``dim``."""
    if ctx.version < 13:
        split = ctx.attr("split")
        split = None if split is None else [int(v) for v in split]
    else:
        split = [int(v) for v in np.asarray(ctx.require_static(1, "split")).reshape(-1)] \
            if ctx.has_input(1) else None
    num = ctx.attr("num_outputs") if ctx.version >= 18 else None
    if split is not None:
        if num is not None:
            raise ctx.error("split and num_outputs are both given; the spec allows one of them")
        if len(split) != outputs or any(v < 0 for v in split) or sum(split) != dim:
            raise ctx.error(f"split {split} must give {outputs} sizes >= 0 summing to the extent {dim}")
        return split
    if ctx.version >= 18:
        if num is None or int(num) != outputs:
            raise ctx.error(f"num_outputs={num} must be given and equal the {outputs} outputs")
        chunk = math.ceil(dim / outputs)
        sizes = [chunk] * (outputs - 1) + [dim - chunk * (outputs - 1)]
        if sizes[-1] < 0:
            raise ctx.error(f"num_outputs={num} cannot split an extent of {dim} into chunks of {chunk}")
        return sizes
    if dim % outputs:
        raise ctx.error(f"an extent of {dim} does not split into {outputs} equal parts")
    return [dim // outputs] * outputs


@converter("Split", {2, 11, 13, 18})
def split(ctx):
    shape = ctx.shape(0)
    rank = len(shape)
    axis = int(ctx.attr("axis", 0))
    if not -rank <= axis < rank:
        raise ctx.error(f"attribute axis={axis} is out of range for a {rank}-D input")
    axis %= rank
    sizes = _sizes(ctx, shape[axis], len(ctx.node.output))
    bounds = np.cumsum([0, *sizes]).tolist()
    if ctx.foldable(0):
        return np.split(ctx.static(0), bounds[1:-1], axis=axis)
    x = ctx.input(0)
    return [ctx.apply(Slice, dict(axis=axis, start=lo, stop=hi), [x], str(i))
            for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:]))]


__all__ = ["slice_", "split"]
