"""Mean over axes (ONNX ``ReduceMean``, ``torch.mean(x, dim, keepdim)``) and its gradient.

``Mean(axes, keepdim)``: the arithmetic mean over ``axes`` (canonical: sorted,
distinct, non-negative; the builder resolves negative and absent ``dim``).
With ``keepdim`` the reduced axes stay with extent 1, else they are dropped
(ONNX ``keepdims``, default 1 there, 0 in PyTorch). A reduced axis of extent
0 is an error (the mean of nothing; PyTorch gives NaN); other zero extents
(an empty batch) give an empty result.

``MeanBackward(axes, keepdim, input_shape)`` spreads ``gy / count`` over the
input shape (count = product of the reduced extents); the two are each
other's adjoints, so second derivatives stay in these two ops.
"""

from __future__ import annotations

from numbers import Integral
from typing import ClassVar

import attrs

from ..errors import ParameterError, ShapeError
from ..op import Op
from ..types import TensorType
from . import _fields as F


def _axes(value):
    """Canonical axes: a sorted tuple of distinct ints >= 0."""
    try:
        items = tuple(value)
    except TypeError:
        raise ParameterError("axes", value, "must be a sequence of ints") from None
    if not all(isinstance(a, Integral) and not isinstance(a, bool) and a >= 0 for a in items):
        raise ParameterError("axes", value, "entries must be ints >= 0 (the builder resolves negative dims)")
    if len(set(items)) != len(items):
        raise ParameterError("axes", value, "must not repeat an axis")
    return tuple(sorted(int(a) for a in items))


def reduced_shape(shape: tuple, axes: tuple, keepdim: bool) -> tuple:
    """``shape`` with ``axes`` set to 1 (``keepdim``) or removed."""
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _check_axes(op, shape: tuple) -> None:
    bad = [a for a in op.axes if a >= len(shape)]
    if bad:
        raise ShapeError(f"parameter axes={op.axes}: axis {bad[0]} is out of range for a "
                         f"{len(shape)}-D input {shape}")
    empty = [a for a in op.axes if shape[a] == 0]
    if empty:
        raise ShapeError(f"parameter axes={op.axes}: axis {empty[0]} of input {shape} is empty "
                         f"(the mean of no values)")


@attrs.frozen
class Mean(Op):
    """Mean of x over ``axes``: x -> ``reduced_shape(x.shape, axes, keepdim)``."""

    axes: tuple = attrs.field(kw_only=True, converter=_axes)
    keepdim: bool = F.flag("keepdim", False)
    family: ClassVar[str] = "reduce"
    kind: ClassVar[str] = "mean"

    def infer(self, x):
        _check_axes(self, x.shape)
        return TensorType(reduced_shape(x.shape, self.axes, self.keepdim), x.dtype)

    def flops(self, types, out) -> int:
        return types[0].size  # one add per input element (the division per output is ignored)

    def vjp(self, node, gy, wanted):
        params = dict(axes=self.axes, keepdim=self.keepdim, input_shape=node.inputs[0].shape)
        return (node.graph.apply(MeanBackward, params, [gy]),)


@attrs.frozen
class MeanBackward(Op):
    """dL/dx of ``Mean``: gy (the reduced shape) spread as ``gy / count`` over ``input_shape``."""

    axes: tuple = attrs.field(kw_only=True, converter=_axes)
    keepdim: bool = F.flag("keepdim", False)
    input_shape: tuple = F.shape("input_shape")
    family: ClassVar[str] = "reduce"
    kind: ClassVar[str] = "mean_backward"

    def infer(self, gy):
        _check_axes(self, self.input_shape)
        want = reduced_shape(self.input_shape, self.axes, self.keepdim)
        if gy.shape != want:
            raise ShapeError(f"output gradient shape {gy.shape} != reduced shape {want} of "
                             f"input_shape={self.input_shape}")
        return TensorType(self.input_shape, gy.dtype)

    def flops(self, types, out) -> int:
        return out.size

    def vjp(self, node, v, wanted):
        return (node.graph.apply(Mean, dict(axes=self.axes, keepdim=self.keepdim), [v]),)
