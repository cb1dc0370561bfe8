"""Max and average pooling and their backward ops (all abstract).

Semantics (SEMANTICS.md, "Pooling"): padding at most half the kernel on each
side; output size as convolution (dilation 1), with ``ceil_mode`` rounding up
and dropping a last window that would start at or beyond ``in + pad_begin``.
Max: padding acts as -inf, NaN propagates, the gradient of tied maxima goes
to the first maximum in row-major window order. Average: the divisor counts
input and explicit padding cells with ``count_include_pad`` (never the
ceil-mode overhang), in-bounds cells only without it.

Second derivatives: ``MaxPool2dBackward`` is linear in ``gy`` with routing
fixed by ``x``; its adjoint is ``MaxPool2dSelect(x, v)`` (read ``v`` at each
window's argmax of ``x``), and the adjoint of that is ``MaxPool2dBackward``.
``AvgPool2dBackward`` and ``AvgPool2d`` are each other's adjoints.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ParameterError, ShapeError
from ..op import Op, require_ndim, require_same_dtype
from ..params import pool_out_size
from ..types import TensorType
from . import _fields as F


@attrs.frozen
class _PoolOp(Op):
    family: ClassVar[str] = "pool"
    kernel_size: tuple = F.spatial("kernel_size")
    stride: tuple = F.spatial("stride")
    padding: tuple = F.padding()
    ceil_mode: bool = F.flag("ceil_mode")

    def __attrs_post_init__(self):
        for k, (pb, pe) in zip(self.kernel_size, self.padding):
            if pb > k // 2 or pe > k // 2:
                raise ParameterError("padding", self.padding,
                                     f"must be at most half the kernel size {self.kernel_size} on each side")

    def pool_params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in attrs.fields(type(self))
                if f.name != "input_shape"}

    def output_shape(self, x_shape) -> tuple[int, ...]:
        out = tuple(pool_out_size(n, k, s, p, self.ceil_mode) for n, k, s, p in
                    zip(x_shape[2:], self.kernel_size, self.stride, self.padding))
        if min(out) < 1:
            raise ShapeError(f"kernel_size {self.kernel_size} is larger than the padded input "
                             f"{tuple(n + p[0] + p[1] for n, p in zip(x_shape[2:], self.padding))}")
        return (*x_shape[:2], *out)

    def _check_gy(self, x_shape, gy: TensorType) -> None:
        want = self.output_shape(x_shape)
        if gy.shape != want:
            raise ShapeError(f"output gradient shape {gy.shape} != pooled shape {want}")


@attrs.frozen
class MaxPool2d(_PoolOp):
    """Max pooling: x (N, C, H, W) -> (N, C, Ho, Wo)."""

    kind: ClassVar[str] = "max_pool2d"

    def infer(self, x):
        require_ndim(self, "input", x, 4)
        return x.with_shape(self.output_shape(x.shape))

    def vjp(self, node, gy, wanted):
        (x,) = node.inputs
        return (node.graph.apply(MaxPool2dBackward, self.pool_params(), [x, gy]),)


@attrs.frozen
class MaxPool2dBackward(_PoolOp):
    """dL/dx of max pooling: (x, gy) -> shape of x (first-max tie rule)."""

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "max_pool2d_backward"

    def infer(self, x, gy):
        require_ndim(self, "input", x, 4)
        self._check_gy(x.shape, gy)
        return TensorType(x.shape, require_same_dtype(self, (x, gy)))

    def vjp(self, node, v, wanted):
        x, _ = node.inputs
        sel = node.graph.apply(MaxPool2dSelect, self.pool_params(), [x, v]) if wanted[1] else None
        return (None, sel)  # piecewise constant in x


@attrs.frozen
class MaxPool2dSelect(_PoolOp):
    """``v`` read at each window's (first) argmax of ``x``: (x, v) -> pooled shape.

    The adjoint of ``MaxPool2dBackward`` in its gradient argument.
    """

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "max_pool2d_select"

    def infer(self, x, v):
        require_ndim(self, "input", x, 4)
        if v.shape != x.shape:
            raise ShapeError(f"selected tensor shape {v.shape} != input shape {x.shape}")
        return TensorType(self.output_shape(x.shape), require_same_dtype(self, (x, v)))

    def vjp(self, node, g, wanted):
        x, _ = node.inputs
        back = node.graph.apply(MaxPool2dBackward, self.pool_params(), [x, g]) if wanted[1] else None
        return (None, back)


@attrs.frozen
class MaxPool2dBackwardRelu(_PoolOp):
    """``ReluBackward(x, MaxPool2dBackward(x, gy))`` as one node: (x, gy) -> shape of x.

    Made by the fuse pass (``passes/fuse.py``) where a ReLU's output is pooled:
    its gradient is ``gy`` routed to each window's winner (the first-max rule
    of ``MaxPool2dBackward``), then masked by ``x > 0``. The winner of a
    window holds the window's maximum, so the mask is one test per window
    (a window whose maximum is not above 0, or is NaN, routes nothing) and the
    separate ReLU-backward pass over the pooled activation (a read of x, a read
    and a write of the gradient) disappears.
    """

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "max_pool2d_backward_relu"
    fused: ClassVar[bool] = True

    def infer(self, x, gy):
        return MaxPool2dBackward(**self.pool_params()).infer(x, gy)

    def vjp(self, node, v, wanted):
        from .elementwise import ReluBackward
        x, _ = node.inputs  # linear in gy: the adjoint masks v, then selects
        if not wanted[1]:
            return (None, None)
        masked = node.graph.apply(ReluBackward, {}, [x, v])
        return (None, node.graph.apply(MaxPool2dSelect, self.pool_params(), [x, masked]))


@attrs.frozen
class AvgPool2d(_PoolOp):
    """Average pooling: x (N, C, H, W) -> (N, C, Ho, Wo)."""

    count_include_pad: bool = F.flag("count_include_pad", True)
    kind: ClassVar[str] = "avg_pool2d"

    def infer(self, x):
        require_ndim(self, "input", x, 4)
        return x.with_shape(self.output_shape(x.shape))

    def vjp(self, node, gy, wanted):
        (x,) = node.inputs
        return (node.graph.apply(AvgPool2dBackward, dict(self.pool_params(), input_shape=x.shape), [gy]),)


@attrs.frozen
class AvgPool2dBackward(_PoolOp):
    """dL/dx of average pooling: gy -> ``input_shape``."""

    count_include_pad: bool = F.flag("count_include_pad", True)
    input_shape: tuple = F.shape("input_shape")
    kind: ClassVar[str] = "avg_pool2d_backward"

    def infer(self, gy):
        if len(self.input_shape) != 4:
            raise ShapeError(f"parameter input_shape={self.input_shape}: must be NCHW (4 entries)")
        self._check_gy(self.input_shape, gy)
        return TensorType(self.input_shape, gy.dtype)

    def vjp(self, node, v, wanted):
        return (node.graph.apply(AvgPool2d, self.pool_params(), [v]),)
