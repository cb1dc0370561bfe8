"""Fused convolutions (made by the fuse pass, never by a builder): a forward
convolution with its epilogue, and backward-data with the ReLU gradient that
follows it.

Forward (``Conv2dBiasActivation``; ``Conv2dBiasRelu`` is its commonest case):

    y = act(conv(x, w) + b [+ r])

with ``b`` (O,) over channels, ``r`` an optional residual addend of y's shape
(the ResNet block's shortcut, added before the block's ReLU) and ``act`` one
of :data:`ACTIVATIONS`: ``'none'``, ``'relu'`` (``max(v, 0)``) or ``'relu6'``
(``Hardtanh(0, 6)``, MobileNet's ``min(max(v, 0), 6)``). This is cuDNN's
conv-bias-activation (the legacy ``cudnnConvolutionBiasActivationForward``
takes the same residual ``z``; the frontend builds it as one graph:
``conv_fprop -> bias -> add -> relu``). Its gradient reads the fused *output*
only: ReLU's and ReLU6's masks are the same on the output as on the
pre-activation (``0 < y`` iff ``0 < v``; ``0 < y < 6`` iff ``0 < v < 6``, NaN
in neither), so the pre-activation is never stored.

Backward-data with ReLU (``Conv2dBackwardDataRelu``): ``gx * (y > 0)`` where
``gx = Conv2dBackwardData(gy, w)`` and ``y`` is the output of the ReLU that
read this convolution's input (the gradient of ``conv(relu(...))`` flowing
on through the ReLU); cuDNN builds ``conv_dgrad -> relu_backward`` as one
graph.

Semantics: SEMANTICS.md (Convolution; ReLU, ReLU6/Hardtanh: gradient 0 at the
bounds and for NaN). Every other algorithm applies the epilogue on its fresh
output (``backends/reference/conv_epilogue.py``).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ParameterError, ShapeError
from ..op import require_same_dtype
from ..types import TensorType
from . import _fields as F
from .activation import Hardtanh, HardtanhBackward
from .conv import Conv2d, Conv2dBackwardData, _ConvOp, conv_cotangents, dgrad_cotangents
from .elementwise import BiasAddBackward, Relu, ReluBackward

#: activation -> its clip bounds ``(lower, upper)`` (None: unbounded): the one
#: place ReLU6's 6 is written for the fused ops, their kernels and the fuse pass.
ACTIVATIONS = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0)}


#: The steps an epilogue is made of, applied in order to a convolution's output
#: (:func:`epilogue_steps`), and the extra input each reads (inputs after the
#: first two, in this order): named as the cuDNN frontend's graph ops.
EPILOGUE_STEPS = {"bias": "b", "add": "r", "relu": None, "relu6": None, "drelu": "y"}


def activation_of(op) -> str | None:
    """The :data:`ACTIVATIONS` name of an abstract activation op (``Relu``, or
    ``Hardtanh(0, 6)``), or None for any other op."""
    if isinstance(op, Relu):
        return "relu"
    if isinstance(op, Hardtanh) and (op.min_val, op.max_val) == ACTIVATIONS["relu6"]:
        return "relu6"
    return None


@attrs.frozen
class _ConvEpilogue(_ConvOp):
    """``act(conv(x, w) + b [+ r])``; subclasses give ``activation`` and
    ``residual`` (fields, or constants of a special case)."""

    activation: ClassVar[str]
    residual: ClassVar[bool]
    arity: ClassVar = (3, 4)
    direction: ClassVar[str] = "fwd"
    fused: ClassVar[bool] = True

    def infer(self, x: TensorType, w: TensorType, b: TensorType, r: TensorType | None = None) -> TensorType:
        if (r is not None) != self.residual:
            raise ShapeError(f"{self.name}: residual={self.residual} takes {4 if self.residual else 3} "
                             f"inputs, got {3 if r is None else 4}")
        y = Conv2d(**self.conv_params()).infer(x, w, b)
        if r is not None:
            if r.shape != y.shape:
                raise ShapeError(f"{self.name}: residual shape {r.shape} != output shape {y.shape}")
            require_same_dtype(self, (y, r))
        return y

    def flops(self, types, out) -> int:
        """The convolution's (the epilogue is memory-bound, as ``Conv2d`` counts no bias)."""
        return 2 * self.macs(types[0].shape, types[1].shape)

    def vjp(self, node, gy, wanted):
        g = node.graph
        g_pre = _activation_gradient(g, self.activation, node.output, gy)
        x, w, *_ = node.inputs
        gx, gw = conv_cotangents(g, self.conv_params(), x, w, g_pre, wanted[:2])
        gb = g.apply(BiasAddBackward, {}, [g_pre]) if wanted[2] else None
        if not self.residual:
            return (gx, gw, gb)
        return (gx, gw, gb, g_pre if wanted[3] else None)


def _activation_gradient(graph, activation: str, y, gy):
    """``gy`` masked by ``activation``'s derivative, read off its output ``y``."""
    if activation == "relu":
        return graph.apply(ReluBackward, {}, [y, gy])
    if activation == "relu6":
        lo, hi = ACTIVATIONS["relu6"]
        return graph.apply(HardtanhBackward, {"min_val": lo, "max_val": hi}, [y, gy])
    return gy


@attrs.frozen
class Conv2dBiasActivation(_ConvEpilogue):
    """``act(conv(x, w) + b [+ r])`` as one node: x (N, C, H, W), w (O, C/groups,
    kH, kW), b (O,), r (N, O, Ho, Wo) when ``residual``.

    Made by the fuse pass (:func:`fused_conv_forward`). ``activation='relu'``
    without a residual is ``Conv2dBiasRelu`` (one op per computation, so one
    autotune cache entry and one report name).

    Raises:
        ParameterError: an activation not in :data:`ACTIVATIONS`, or the
            combination ``Conv2dBiasRelu`` names.
    """

    activation: str = F.choice("activation", tuple(ACTIVATIONS), "none")
    residual: bool = F.flag("residual", False)
    kind: ClassVar[str] = "conv2d_bias_activation"

    def __attrs_post_init__(self):
        if (self.activation, self.residual) == ("relu", False):
            raise ParameterError("activation", self.activation,
                                 "without a residual is Conv2dBiasRelu (use fused_conv_forward)")


@attrs.frozen
class Conv2dBiasRelu(_ConvEpilogue):
    """``relu(conv(x, w) + b)`` as one node: x (N, C, H, W), w (O, C/groups, kH, kW), b (O,).

    Made by the fuse pass from a ``Conv2d`` whose output only its ``Relu``
    reads, for a backend with a fused kernel (cuDNN's conv-bias-activation
    graph): it saves one write and one read of the convolution output.
    """

    activation: ClassVar[str] = "relu"
    residual: ClassVar[bool] = False
    arity: ClassVar = (3, 3)
    kind: ClassVar[str] = "conv2d_bias_relu"


def fused_conv_forward(conv_params: dict, activation: str, residual: bool) -> _ConvEpilogue:
    """The fused forward op of a convolution with ``conv_params`` (stride,
    padding, dilation, groups), its bias, ``activation`` and an optional
    residual addend: ``Conv2dBiasRelu`` for ReLU alone, else
    ``Conv2dBiasActivation``."""
    if (activation, residual) == ("relu", False):
        return Conv2dBiasRelu(**conv_params)
    return Conv2dBiasActivation(**conv_params, activation=activation, residual=residual)


@attrs.frozen
class Conv2dBackwardDataRelu(_ConvOp):
    """``Conv2dBackwardData(gy, w) * (y > 0)`` as one node: gy (N, O, Ho, Wo),
    w (O, C/groups, kH, kW), y (N, C, H, W) the output of the ReLU whose
    output the convolution read -> (N, C, H, W) = ``input_shape``.

    Made by the fuse pass from ``ReluBackward(y, Conv2dBackwardData(gy, w))``
    when the backward-data output has no other reader: cuDNN's
    ``conv_dgrad -> relu_backward`` graph saves one write and one read of it.
    """

    input_shape: tuple = F.shape("input_shape")
    arity: ClassVar = (3, 3)
    kind: ClassVar[str] = "conv2d_backward_data_relu"
    direction: ClassVar[str] = "dgrad"
    fused: ClassVar[bool] = True

    def unfused(self) -> Conv2dBackwardData:
        """The backward-data op it fuses."""
        return Conv2dBackwardData(**self.conv_params(), input_shape=self.input_shape)

    def infer(self, gy: TensorType, w: TensorType, y: TensorType) -> TensorType:
        gx = self.unfused().infer(gy, w)
        if y.shape != gx.shape:
            raise ShapeError(f"{self.name}: ReLU output shape {y.shape} != input gradient shape {gx.shape}")
        require_same_dtype(self, (gx, y))
        return gx

    def flops(self, types, out) -> int:
        return self.unfused().flops(types[:2], out)

    def vjp(self, node, v, wanted):
        gy, w, y = node.inputs
        if not (wanted[0] or wanted[1]):
            return (None, None, None)
        g = node.graph
        masked = g.apply(ReluBackward, {}, [y, v])  # the mask is linear in v: mask the cotangent
        d_gy, d_w = dgrad_cotangents(g, self.conv_params(), gy, w, masked, wanted[:2])
        return (d_gy, d_w, None)  # the mask's derivative in y is zero almost everywhere


def epilogue_steps(op, n_inputs: int) -> tuple[str, ...]:
    """The epilogue of a conv-family node as :data:`EPILOGUE_STEPS`: a fused
    forward op's ``('bias', ['add',] [activation])``, backward-data with ReLU's
    ``('drelu',)``, ``('bias',)`` for a ``Conv2d`` with ``n_inputs == 3``,
    else none."""
    if isinstance(op, _ConvEpilogue):
        return ("bias",) + (("add",) if op.residual else ()) + \
            ((op.activation,) if op.activation != "none" else ())
    if isinstance(op, Conv2dBackwardDataRelu):
        return ("drelu",)
    return ("bias",) if op.direction == "fwd" and n_inputs > 2 else ()
