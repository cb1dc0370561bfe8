"""Softmax, log-softmax and cross-entropy, numerically stable.

Softmax subtracts the max; log-softmax and cross-entropy use log-sum-exp, so
huge logits give finite results (SEMANTICS.md). The backward ops take the
forward *output* ``y`` (softmax or log-softmax values):
``dx = y * (gy - sum(gy * y))`` and ``dx = gy - exp(y) * sum(gy)``.
Cross-entropy takes int64 class indices and averages (``'mean'``) or sums.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ParameterError, ShapeError
from ..op import Op, require_ndim
from ..types import TensorType
from . import _fields as F


def _check_axis(t: TensorType, axis: int) -> None:
    if not -t.ndim <= axis < t.ndim:
        raise ShapeError(f"parameter axis={axis}: out of range for a {t.ndim}-D input {t.shape}")


@attrs.frozen
class _AlongAxis(Op):
    """A softmax-family forward op: ``x`` -> same type, along ``axis``."""

    axis: int = F.axis(1)
    family: ClassVar[str] = "softmax"
    #: the backward op, which takes the forward *output* and its gradient
    backward: ClassVar[type[Op]]

    def infer(self, x):
        _check_axis(x, self.axis)
        return x

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(self.backward, {"axis": self.axis}, [node.output, gy]),)


@attrs.frozen
class _AlongAxisBackward(Op):
    """A softmax-family backward op: ``(y, gy)`` -> ``y``'s type, along ``axis``."""

    axis: int = F.axis(1)
    arity: ClassVar = (2, 2)
    family: ClassVar[str] = "softmax"

    def infer(self, y, gy):
        _check_axis(y, self.axis)
        if y.shape != gy.shape:
            raise ShapeError(f"gradient shape {gy.shape} != output shape {y.shape}")
        return y


@attrs.frozen
class SoftmaxBackward(_AlongAxisBackward):
    """``y * (gy - sum(gy * y, axis))`` from the softmax output y."""

    kind: ClassVar[str] = "softmax_backward"


@attrs.frozen
class Softmax(_AlongAxis):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``."""

    kind: ClassVar[str] = "softmax"
    backward: ClassVar[type[Op]] = SoftmaxBackward


@attrs.frozen
class LogSoftmaxBackward(_AlongAxisBackward):
    """``gy - exp(y) * sum(gy, axis)`` from the log-softmax output y."""

    kind: ClassVar[str] = "log_softmax_backward"


@attrs.frozen
class LogSoftmax(_AlongAxis):
    """``x - max - log(sum(exp(x - max)))`` along ``axis``."""

    kind: ClassVar[str] = "log_softmax"
    backward: ClassVar[type[Op]] = LogSoftmaxBackward


def _reduction(v):
    if v not in ("mean", "sum"):
        raise ParameterError("reduction", v, "must be 'mean' or 'sum'")
    return v


@attrs.frozen
class CrossEntropy(Op):
    """Softmax cross-entropy: logits (N, C), target (N,) int64 -> scalar ()."""

    reduction: str = attrs.field(default="mean", kw_only=True, converter=_reduction)
    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "cross_entropy"
    family: ClassVar[str] = "softmax"

    def infer(self, logits, target):
        require_ndim(self, "logits", logits, 2)
        if target.shape != logits.shape[:1] or target.dtype != "int64":
            raise ShapeError(f"target must be int64 of shape ({logits.shape[0]},), "
                             f"got {target.dtype}{list(target.shape)}")
        return TensorType((), logits.dtype)

    def vjp(self, node, gy, wanted):
        logits, target = node.inputs
        return (node.graph.apply(CrossEntropyBackward, {"reduction": self.reduction},
                                 [logits, target, gy]), None)


@attrs.frozen
class CrossEntropyBackward(Op):
    """``(softmax(logits) - onehot(target)) * gy`` (/ N for 'mean')."""

    reduction: str = attrs.field(default="mean", kw_only=True, converter=_reduction)
    arity: ClassVar = (3, 3)
    kind: ClassVar[str] = "cross_entropy_backward"
    family: ClassVar[str] = "softmax"

    def infer(self, logits, target, gy):
        if gy.shape != ():
            raise ShapeError(f"gradient of a scalar loss must be a scalar, got shape {gy.shape}")
        return logits
