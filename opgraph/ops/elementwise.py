"""Element-wise ops: ReLU, threshold, add, bias add, dropout, zeros.

ReLU is ``max(x, 0)`` with NaN propagating and gradient 0 at exactly 0
(SEMANTICS.md). ``Threshold`` follows ``torch.nn.functional.threshold``:
``y = x if x > threshold else value`` (convnet-benchmarks' ``nn.Threshold(0,
1e-6)`` after fc6/fc7). Dropout is the identity at inference; in training
kept elements are scaled by ``1/(1-p)`` and the others are 0. The keep mask is
counter-based: element ``k`` (row-major index of the logical NCHW shape) is
kept when the top 24 bits of the ``k+1``-th SplitMix64 output seeded with
``seed`` are at least ``ceil(p * 2^24)`` (``backends/reference/dropout.py``
has the constants), so every backend and layout draws the same mask with no
host random draw, the mask depends only on (seed, shape), and the gradient is
the same dropout applied to the output gradient.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from ..op import Op, require_same_dtype
from ..types import TensorType
from . import _fields as F


@attrs.frozen
class Relu(Op):
    """``max(x, 0)``, any shape."""

    kind: ClassVar[str] = "relu"
    family: ClassVar[str] = "relu"

    def infer(self, x):
        return x

    def vjp(self, node, gy, wanted):
        # The mask is read from the output (y > 0 exactly where x > 0, NaN
        # included), so the pre-activation has no other reader than this ReLU
        # and a conv + bias + ReLU chain can be fused in training too.
        return (node.graph.apply(ReluBackward, {}, [node.output, gy]),)


def _same_shape(op, a: TensorType, b: TensorType, what: str) -> TensorType:
    if a.shape != b.shape:
        raise ShapeError(f"{what} shapes differ: {a.shape} vs {b.shape}")
    return TensorType(a.shape, require_same_dtype(op, (a, b)))


@attrs.frozen
class ReluBackward(Op):
    """``gy * (y > 0)``: (y, gy) -> shape of y, where y is the ReLU's output
    (or its input: the mask is the same)."""

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "relu_backward"
    family: ClassVar[str] = "relu"

    def infer(self, x, gy):
        return _same_shape(self, x, gy, "input and output gradient")

    def vjp(self, node, v, wanted):
        x, _ = node.inputs  # zero derivative in x almost everywhere
        return (None, node.graph.apply(ReluBackward, {}, [x, v]) if wanted[1] else None)


@attrs.frozen
class Threshold(Op):
    """``x if x > threshold else value`` (torch.nn.functional.threshold)."""

    threshold: float = F.real("threshold")
    value: float = F.real("value")
    kind: ClassVar[str] = "threshold"
    family: ClassVar[str] = "relu"

    def infer(self, x):
        return x

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(ThresholdBackward, {"threshold": self.threshold},
                                 [node.inputs[0], gy]),)


@attrs.frozen
class ThresholdBackward(Op):
    """``gy * (x > threshold)``: (x, gy) -> shape of x."""

    threshold: float = F.real("threshold")
    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "threshold_backward"
    family: ClassVar[str] = "relu"

    def infer(self, x, gy):
        return _same_shape(self, x, gy, "input and output gradient")

    def vjp(self, node, v, wanted):
        x, _ = node.inputs
        return (None, node.graph.apply(ThresholdBackward, {"threshold": self.threshold}, [x, v])
                if wanted[1] else None)


@attrs.frozen
class Add(Op):
    """``a + b`` of equal shapes."""

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "add"
    family: ClassVar[str] = "elementwise"

    def infer(self, a, b):
        return _same_shape(self, a, b, "operand")

    def vjp(self, node, gy, wanted):
        return (gy, gy)


@attrs.frozen
class BiasAdd(Op):
    """``x + b`` with b (C,) broadcast along axis 1 of x (N, C, ...)."""

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "bias_add"
    family: ClassVar[str] = "bias"

    def infer(self, x, b):
        if x.ndim < 2 or b.shape != (x.shape[1],):
            raise ShapeError(f"bias shape {b.shape} does not match channels of input {x.shape}")
        return TensorType(x.shape, require_same_dtype(self, (x, b)))

    def vjp(self, node, gy, wanted):
        return (gy, node.graph.apply(BiasAddBackward, {}, [gy]) if wanted[1] else None)


@attrs.frozen
class BiasAddBackward(Op):
    """Sum of gy over every axis but 1: (N, C, ...) -> (C,)."""

    kind: ClassVar[str] = "bias_add_backward"
    family: ClassVar[str] = "bias"

    def infer(self, gy):
        if gy.ndim < 2:
            raise ShapeError(f"output gradient must have a channel axis, got shape {gy.shape}")
        return TensorType((gy.shape[1],), gy.dtype)

    def vjp(self, node, v, wanted):
        (gy,) = node.inputs
        zeros = node.graph.apply(Zeros, {"type": gy.type}, [])
        return (node.graph.apply(BiasAdd, {}, [zeros, v]),)


@attrs.frozen
class Dropout(Op):
    """Inverted dropout with probability ``p`` of zeroing; the seeded counter-based
    mask of the module docstring."""

    p: float = F.real("p", 0.5, lo=0.0, hi=1.0)
    training: bool = F.flag("training", False)
    seed: int = F.integer("seed", 0, minimum=0)
    kind: ClassVar[str] = "dropout"
    family: ClassVar[str] = "elementwise"

    def infer(self, x):
        return x

    def vjp(self, node, gy, wanted):
        if not self.training:
            return (gy,)
        return (node.graph.apply(Dropout, attrs.asdict(self), [gy]),)


@attrs.frozen
class Zeros(Op):
    """A tensor of zeros of ``type`` (no inputs)."""

    type: TensorType = attrs.field(kw_only=True)
    arity: ClassVar = (0, 0)
    kind: ClassVar[str] = "zeros"
    family: ClassVar[str] = "tensor"

    def infer(self):
        return self.type

    def vjp(self, node, gy, wanted):
        return ()
