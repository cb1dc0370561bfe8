"""2-D convolution and its two backward ops (all abstract).

Semantics (SEMANTICS.md, "Convolution"): cross-correlation,
``y[n,o,i,j] = sum_{c,p,q} x[n, g*C/G + c, i*s_h + p*d_h - pad_top,
j*s_w + q*d_w - pad_left] * w[o,c,p,q]``, zeros outside the input; layouts
NCHW / OIHW; output size ``floor((in + pb + pe - d*(k-1) - 1)/s) + 1``.

The backward ops are convolutions too, so their gradients are written with
the same three ops (second derivatives work):

* ``Conv2dBackwardData(gy, w)`` = dL/dx, carries ``input_shape`` because a
  stride that does not tile the input makes it ambiguous;
* ``Conv2dBackwardFilter(x, gy)`` = dL/dw, carries ``weight_shape``.

Adjoint identities used by the gradient rules (all three are bilinear):
``<conv(x, w), gy> = <x, dgrad(gy, w)> = <w, wgrad(x, gy)>``.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from ..op import Op, require_ndim, require_same_dtype
from ..params import conv_out_size
from ..types import TensorType
from . import _fields as F


@attrs.frozen
class _ConvOp(Op):
    """Parameters shared by the convolution ops."""

    family: ClassVar[str] = "conv"

    stride: tuple = F.spatial("stride")
    padding: tuple = F.padding()
    dilation: tuple = F.spatial("dilation")
    groups: int = F.integer("groups", 1, minimum=1)

    def conv_params(self) -> dict:
        return dict(stride=self.stride, padding=self.padding,
                    dilation=self.dilation, groups=self.groups)

    def output_hw(self, in_hw, kernel_hw) -> tuple[int, int]:
        """Forward output (H, W); raises ShapeError when below 1."""
        out = tuple(conv_out_size(n, k, s, d, p) for n, k, s, d, p in
                    zip(in_hw, kernel_hw, self.stride, self.dilation, self.padding))
        if min(out) < 1:
            raise ShapeError(
                f"kernel {tuple(kernel_hw)} (dilation {self.dilation}) is larger than the padded "
                f"input {tuple(n + p[0] + p[1] for n, p in zip(in_hw, self.padding))}: output {out}")
        return out

    def check_channels(self, x_shape, w_shape) -> None:
        c, (o, cg) = x_shape[1], w_shape[:2]
        g = self.groups
        if c % g or o % g:
            raise ShapeError(f"parameter groups={g}: must divide in_channels={c} and out_channels={o}")
        if cg * g != c:
            raise ShapeError(f"weight shape {tuple(w_shape)} expects {cg * g} input channels "
                             f"(in/groups={cg}, groups={g}), input has {c}")

    def forward_shape(self, x_shape, w_shape) -> tuple[int, ...]:
        self.check_channels(x_shape, w_shape)
        return (x_shape[0], w_shape[0], *self.output_hw(x_shape[2:], w_shape[2:]))

    def macs(self, x_shape, w_shape) -> int:
        """Multiply-adds of the forward convolution."""
        n, o, ho, wo = self.forward_shape(x_shape, w_shape)
        return n * o * ho * wo * w_shape[1] * w_shape[2] * w_shape[3]


@attrs.frozen
class Conv2d(_ConvOp):
    """``y = conv(x, w) + b``: x (N, C, H, W), w (O, C/groups, kH, kW), b (O,)."""

    arity: ClassVar = (2, 3)
    kind: ClassVar[str] = "conv2d"
    direction: ClassVar[str] = "fwd"

    def infer(self, x: TensorType, w: TensorType, b: TensorType | None = None) -> TensorType:
        require_ndim(self, "input", x, 4)
        require_ndim(self, "weight", w, 4)
        dtype = require_same_dtype(self, (x, w) + ((b,) if b else ()))
        if b is not None and b.shape != (w.shape[0],):
            raise ShapeError(f"bias shape {b.shape} != (out_channels,) = ({w.shape[0]},)")
        return TensorType(self.forward_shape(x.shape, w.shape), dtype)

    def flops(self, types, out) -> int:
        return 2 * self.macs(types[0].shape, types[1].shape)

    def vjp(self, node, gy, wanted):
        x, w, *b = node.inputs
        g = node.graph
        gx, gw = conv_cotangents(g, self.conv_params(), x, w, gy, wanted[:2])
        if not b:
            return (gx, gw)
        from .elementwise import BiasAddBackward
        gb = g.apply(BiasAddBackward, {}, [gy]) if wanted[2] else None
        return (gx, gw, gb)


@attrs.frozen
class Conv2dBackwardData(_ConvOp):
    """dL/dx of ``Conv2d``: gy (N, O, Ho, Wo), w (O, C/groups, kH, kW) -> (N, C, H, W)."""

    input_shape: tuple = F.shape("input_shape")
    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "conv2d_backward_data"
    direction: ClassVar[str] = "dgrad"

    def infer(self, gy: TensorType, w: TensorType) -> TensorType:
        require_ndim(self, "output gradient", gy, 4)
        require_ndim(self, "weight", w, 4)
        if len(self.input_shape) != 4:
            raise ShapeError(f"parameter input_shape={self.input_shape}: must be NCHW (4 entries)")
        want = self.forward_shape(self.input_shape, w.shape)
        if gy.shape != want:
            raise ShapeError(f"output gradient shape {gy.shape} != forward output shape {want}")
        return TensorType(self.input_shape, require_same_dtype(self, (gy, w)))

    def flops(self, types, out) -> int:
        return 2 * self.macs(self.input_shape, types[1].shape)

    def vjp(self, node, ggx, wanted):
        gy, w = node.inputs
        return dgrad_cotangents(node.graph, self.conv_params(), gy, w, ggx, wanted)


@attrs.frozen
class Conv2dBackwardFilter(_ConvOp):
    """dL/dw of ``Conv2d``: x (N, C, H, W), gy (N, O, Ho, Wo) -> (O, C/groups, kH, kW)."""

    weight_shape: tuple = F.shape("weight_shape")
    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "conv2d_backward_filter"
    direction: ClassVar[str] = "wgrad"

    def infer(self, x: TensorType, gy: TensorType) -> TensorType:
        require_ndim(self, "input", x, 4)
        require_ndim(self, "output gradient", gy, 4)
        if len(self.weight_shape) != 4:
            raise ShapeError(f"parameter weight_shape={self.weight_shape}: must be OIHW (4 entries)")
        want = self.forward_shape(x.shape, self.weight_shape)
        if gy.shape != want:
            raise ShapeError(f"output gradient shape {gy.shape} != forward output shape {want}")
        return TensorType(self.weight_shape, require_same_dtype(self, (x, gy)))

    def flops(self, types, out) -> int:
        return 2 * self.macs(types[0].shape, self.weight_shape)

    def vjp(self, node, gw_bar, wanted):
        x, gy = node.inputs
        g, p = node.graph, self.conv_params()
        d_x = g.apply(Conv2dBackwardData, dict(p, input_shape=x.shape), [gy, gw_bar]) if wanted[0] else None
        d_gy = g.apply(Conv2d, p, [x, gw_bar]) if wanted[1] else None
        return (d_x, d_gy)


def conv_cotangents(graph, params: dict, x, w, gy, wanted) -> tuple:
    """``(gx, gw)`` of ``y = conv(x, w)`` with ``params`` given ``gy`` (None
    where ``wanted`` is False): backward-data and backward-filter nodes."""
    gx = graph.apply(Conv2dBackwardData, dict(params, input_shape=x.shape), [gy, w]) if wanted[0] else None
    gw = graph.apply(Conv2dBackwardFilter, dict(params, weight_shape=w.shape), [x, gy]) if wanted[1] else None
    return gx, gw


def dgrad_cotangents(graph, params: dict, gy, w, ggx, wanted) -> tuple:
    """``(d_gy, d_w)`` of ``gx = Conv2dBackwardData(gy, w)`` given its cotangent
    ``ggx``: a convolution and a backward-filter (the adjoint identities above)."""
    d_gy = graph.apply(Conv2d, params, [ggx, w]) if wanted[0] else None
    d_w = (graph.apply(Conv2dBackwardFilter, dict(params, weight_shape=w.shape), [ggx, gy])
           if wanted[1] else None)
    return d_gy, d_w
