"""Data-movement ops: flatten, reshape, concat, slice, explicit padding.

``Concat`` joins along ``axis`` (channels by default); empty inputs are
allowed, mismatched shapes or a bad axis raise. ``Pad`` is explicit spatial
zero padding of an NCHW tensor, inserted by the legalize pass in front of
algorithms without implicit or asymmetric padding.
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs

from ..errors import ParameterError, ShapeError
from ..op import Op, require_ndim, require_same_dtype
from ..types import TensorType
from . import _fields as F


def _axis(op, t: TensorType, axis: int) -> int:
    if not -t.ndim <= axis < t.ndim:
        raise ShapeError(f"parameter axis={axis}: out of range for a {t.ndim}-D input {t.shape}")
    return axis % t.ndim


@attrs.frozen
class Reshape(Op):
    """Reshape to ``shape`` (same number of elements)."""

    shape: tuple = F.shape("shape")
    kind: ClassVar[str] = "reshape"
    family: ClassVar[str] = "tensor"

    def infer(self, x):
        if math.prod(self.shape) != x.size:
            raise ShapeError(f"parameter shape={self.shape}: cannot hold the {x.size} elements of {x.shape}")
        return TensorType(self.shape, x.dtype)

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(Reshape, {"shape": node.inputs[0].shape}, [gy]),)


@attrs.frozen
class Flatten(Op):
    """Merge axes ``start_dim..`` into one (Torch ``nn.View`` of C*H*W)."""

    start_dim: int = F.integer("start_dim", 1, minimum=0)
    kind: ClassVar[str] = "flatten"
    family: ClassVar[str] = "tensor"

    def infer(self, x):
        if self.start_dim >= max(x.ndim, 1):
            raise ShapeError(f"parameter start_dim={self.start_dim}: input has {x.ndim} axes")
        return TensorType((*x.shape[:self.start_dim], math.prod(x.shape[self.start_dim:])), x.dtype)

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(Reshape, {"shape": node.inputs[0].shape}, [gy]),)


@attrs.frozen
class Concat(Op):
    """Join inputs along ``axis``; other axes must match."""

    axis: int = F.axis(1)
    arity: ClassVar = (1, None)
    kind: ClassVar[str] = "concat"
    family: ClassVar[str] = "tensor"

    def infer(self, *xs):
        first = xs[0]
        ax = _axis(self, first, self.axis)
        for t in xs[1:]:
            if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != ax):
                raise ShapeError(f"inputs must match except along axis {self.axis}: {first.shape} vs {t.shape}")
        shape = list(first.shape)
        shape[ax] = sum(t.shape[ax] for t in xs)
        return TensorType(shape, require_same_dtype(self, xs))

    def vjp(self, node, gy, wanted):
        out, start = [], 0
        ax = self.axis % gy.type.ndim
        for v, want in zip(node.inputs, wanted):
            stop = start + v.shape[ax]
            out.append(node.graph.apply(Slice, dict(axis=ax, start=start, stop=stop), [gy]) if want else None)
            start = stop
        return tuple(out)


@attrs.frozen
class Slice(Op):
    """``x[..., start:stop, ...]`` along ``axis`` (unit step)."""

    axis: int = F.axis(1)
    start: int = F.integer("start", minimum=0)
    stop: int = F.integer("stop", minimum=0)
    kind: ClassVar[str] = "slice"
    family: ClassVar[str] = "tensor"

    def infer(self, x):
        ax = _axis(self, x, self.axis)
        if not self.start <= self.stop <= x.shape[ax]:
            raise ShapeError(f"parameters start={self.start}, stop={self.stop}: not within axis {ax} "
                             f"of size {x.shape[ax]}")
        shape = list(x.shape)
        shape[ax] = self.stop - self.start
        return TensorType(shape, x.dtype)

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(SliceBackward, dict(attrs.asdict(self), input_shape=node.inputs[0].shape), [gy]),)


@attrs.frozen
class SliceBackward(Op):
    """Place gy at ``start:stop`` along ``axis`` of zeros of ``input_shape``."""

    axis: int = F.axis(1)
    start: int = F.integer("start", minimum=0)
    stop: int = F.integer("stop", minimum=0)
    input_shape: tuple = F.shape("input_shape")
    kind: ClassVar[str] = "slice_backward"
    family: ClassVar[str] = "tensor"

    def infer(self, gy):
        want = Slice(axis=self.axis, start=self.start, stop=self.stop).infer(TensorType(self.input_shape, gy.dtype))
        if gy.shape != want.shape:
            raise ShapeError(f"gradient shape {gy.shape} != slice shape {want.shape}")
        return TensorType(self.input_shape, gy.dtype)

    def vjp(self, node, v, wanted):
        return (node.graph.apply(Slice, dict(axis=self.axis, start=self.start, stop=self.stop), [v]),)


@attrs.frozen
class Pad(Op):
    """Explicit spatial padding of NCHW x with ``value``: ((top, bottom), (left, right))."""

    padding: tuple = F.padding()
    value: float = F.real("value", 0.0, infinite=True)  # -inf: max-pooling's padding
    kind: ClassVar[str] = "pad"
    family: ClassVar[str] = "tensor"

    def infer(self, x):
        require_ndim(self, "input", x, 4)
        (t, b), (l, r) = self.padding
        n, c, h, w = x.shape
        return TensorType((n, c, h + t + b, w + l + r), x.dtype)

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(PadBackward, {"padding": self.padding}, [gy]),)


@attrs.frozen
class PadBackward(Op):
    """Crop the padding off: inverse shape of ``Pad``; gradient of ``Pad``."""

    padding: tuple = F.padding()
    kind: ClassVar[str] = "pad_backward"
    family: ClassVar[str] = "tensor"

    def infer(self, gy):
        require_ndim(self, "gradient", gy, 4)
        (t, b), (l, r) = self.padding
        n, c, h, w = gy.shape
        if h - t - b < 0 or w - l - r < 0:
            raise ParameterError("padding", self.padding, f"larger than the tensor {gy.shape}")
        return TensorType((n, c, h - t - b, w - l - r), gy.dtype)

    def vjp(self, node, v, wanted):
        return (node.graph.apply(Pad, {"padding": self.padding}, [v]),)
