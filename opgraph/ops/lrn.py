"""Local response normalisation across channels (AlexNet / Caffe / cuDNN form).

``y = x / (k + alpha/size * sum_window x^2)^beta``; the window of channel c
covers ``c - floor((size-1)/2) .. c + ceil((size-1)/2)`` clipped to valid
channels. For even sizes this follows ONNX's LRN (the extra channel is on the
high side). Source: Krizhevsky et al. 2012, sec. 3.3; ONNX operator LRN.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from ..op import Op, require_same_dtype
from ..types import TensorType
from . import _fields as F


@attrs.frozen
class _LrnOp(Op):
    family: ClassVar[str] = "lrn"
    size: int = F.integer("size", minimum=1)
    alpha: float = F.real("alpha", 1e-4)
    beta: float = F.real("beta", 0.75)
    k: float = F.real("k", 1.0)

    def _check(self, x: TensorType) -> None:
        if x.ndim < 3:
            raise ShapeError(f"input must be (N, C, ...) with spatial axes, got shape {x.shape}")


@attrs.frozen
class LocalResponseNorm(_LrnOp):
    """LRN across channels: x (N, C, H, W) -> same shape."""

    kind: ClassVar[str] = "local_response_norm"

    def infer(self, x):
        self._check(x)
        return x

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(LocalResponseNormBackward, attrs.asdict(self), [node.inputs[0], gy]),)


@attrs.frozen
class LocalResponseNormBackward(_LrnOp):
    """dL/dx of LRN: (x, gy) -> shape of x."""

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "local_response_norm_backward"

    def infer(self, x, gy):
        self._check(x)
        if gy.shape != x.shape:
            raise ShapeError(f"output gradient shape {gy.shape} != input shape {x.shape}")
        return TensorType(x.shape, require_same_dtype(self, (x, gy)))
