"""A ReLU gradient that also writes its per-channel sums: the bias gradient from its producer.

A convolution's bias gradient is ``BiasAddBackward(g)``, the sum of ``g`` over every axis but
the channel's, and ``g`` is most often a ReLU's gradient, ``g = ReluBackward(y, gy)``, which the
backward-data and backward-filter convolutions read too. Computed apart, the sums read ``g``
once more and cost a launch (GoogLeNet bf16 on the H200: 58 bias gradients, 0.406 ms, 48 % of
the copy bandwidth, most of them a few microseconds at the launch floor). The fuse pass's
``relu-bias-sums`` rule (``passes/fuse_relu_bias_sums.py``) writes instead

* ``sums = ReluBackwardSumsSlot(y, gy)``: the bias gradient's buffer, ``(C,)`` in gy's dtype; its
  step only allocates (``Op.filled_by_reader``); its value is ``BiasAddBackward(ReluBackward(y, gy))``;
* ``g = ReluBackwardSums(y, gy, sums)``: ``ReluBackward(y, gy)``, and it fills ``sums`` with the
  per-channel sums of what it wrote (``Op.fills``), in float32 rounded once to the storage
  dtype, as ``BiasAddBackward`` sums (SEMANTICS.md). Its rules may write ``g`` into gy's buffer
  where gy dies there, as ``ReluBackward``'s do (``Rule.inplace`` = input 1, never the slot).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from ..op import Op
from ..types import TensorType
from .elementwise import BiasAdd, BiasAddBackward, ReluBackward, Zeros


def _sums_type(op, y: TensorType, gy: TensorType) -> TensorType:
    if y.shape != gy.shape or gy.ndim < 2:
        raise ShapeError(f"{op.name}: y {y.shape} and gy {gy.shape} must have one shape with a channel axis")
    return BiasAddBackward().infer(gy)


@attrs.frozen
class ReluBackwardSumsSlot(Op):
    """The buffer of ``BiasAddBackward(ReluBackward(y, gy))``: (y, gy) of shape (N, C, ...) ->
    (C,) in gy's dtype. Its step only allocates; the one :class:`ReluBackwardSums` reading it
    fills it. Its value, for the reference kernels and the checks, is those sums.

    Raises:
        ShapeError: y and gy of different shapes, or without a channel axis.
    """

    arity: ClassVar = (2, 2)
    fused: ClassVar[bool] = True
    family: ClassVar[str] = "relu"
    filled_by_reader: ClassVar[bool] = True
    kind: ClassVar[str] = "relu_backward_sums_slot"

    def infer(self, y, gy):
        return _sums_type(self, y, gy)

    def bytes_moved(self, types, out) -> int:
        """Nothing: the step allocates."""
        return 0

    def vjp(self, node, v, wanted):
        # the sums of ReluBackward(y, gy) in gy: ReluBackward(y, v broadcast over the channel axis)
        y, gy = node.inputs
        if not wanted[1]:
            return (None, None)
        zeros = node.graph.apply(Zeros, {"type": gy.type}, [])
        return (None, node.graph.apply(ReluBackward, {}, [y, node.graph.apply(BiasAdd, {}, [zeros, v])]))


@attrs.frozen
class ReluBackwardSums(Op):
    """``ReluBackward(y, gy)``: (y, gy, sums) -> shape of y in gy's dtype, that also fills
    ``sums`` (input 2, a :class:`ReluBackwardSumsSlot` of the same y and gy) with the
    per-channel sums of its output (float32 sums rounded once, ``BiasAddBackward``'s).

    Raises:
        ShapeError: y and gy of different shapes or without a channel axis, or sums not
        ``(C,)`` in gy's dtype.
    """

    arity: ClassVar = (3, 3)
    fused: ClassVar[bool] = True
    family: ClassVar[str] = "relu"
    fills: ClassVar = (2,)
    kind: ClassVar[str] = "relu_backward_sums"

    def infer(self, y, gy, sums):
        want = _sums_type(self, y, gy)
        if (sums.shape, sums.dtype) != (want.shape, want.dtype):
            raise ShapeError(f"{self.name}: sums {sums.shape} {sums.dtype} must be {want.shape} {want.dtype}")
        return ReluBackward().infer(y, gy)

    def filled_slot(self, position: int):
        """Input 2: the sums' slot, reading y and gy (inputs 0 and 1)."""
        return ReluBackwardSumsSlot(), (0, 1)

    def bytes_moved(self, types, out) -> int:
        """y and gy read, the gradient and its sums written."""
        y, gy, sums = types
        return y.nbytes + gy.nbytes + out.nbytes + sums.nbytes

    def vjp(self, node, v, wanted):
        y = node.inputs[0]
        return (None, node.graph.apply(ReluBackward, {}, [y, v]) if wanted[1] else None, None)


__all__ = ["ReluBackwardSumsSlot", "ReluBackwardSums"]
