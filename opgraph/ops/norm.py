"""Batch normalisation in inference form.

``BatchNorm`` normalises with fixed statistics over axis 1 (channels)::

    y = (x - mean) / sqrt(var + eps) * scale + bias

with scale, bias, mean, var of shape (C,) and x of shape (N, C, ...). This
is ONNX ``BatchNormalization`` with ``training_mode=0`` and Ioffe & Szegedy
(2015), Algorithm 2 (inference network). The running statistics ``mean`` and
``var`` are treated as constants: the gradient rule covers x, scale and bias
and raises ``NotDifferentiableError`` where a gradient with respect to mean
or var is asked for (they are buffers, not trainable parameters).

Gradient ops (``s = 1 / sqrt(var + eps)``, sums over every axis but 1):

* ``BatchNormBackwardData(gy, scale, var)`` = ``gy * scale * s`` (dL/dx);
* ``BatchNormBackwardScale(x, mean, var, gy)`` = ``sum(gy * (x - mean) * s)``
  (dL/dscale); dL/dbias is ``BiasAddBackward(gy)``.

Both are bilinear, so their own gradients are written with the same three ops.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import NotDifferentiableError, ShapeError
from ..op import Op, require_same_dtype
from ..types import TensorType
from . import _fields as F


def _check_channel_vectors(op, x: TensorType, named: dict[str, TensorType]) -> str:
    if x.ndim < 2:
        raise ShapeError(f"input must be (N, C, ...), got shape {x.shape}")
    for what, t in named.items():
        if t.shape != (x.shape[1],):
            raise ShapeError(f"{what} shape {t.shape} != (C,) = ({x.shape[1]},) of input {x.shape}")
    return require_same_dtype(op, (x, *named.values()))


def _no_stats_gradient(op, node, wanted, positions: dict[int, str]) -> None:
    for i, what in positions.items():
        if wanted[i]:
            raise NotDifferentiableError(
                f"node {node.name} ({op.name}): no gradient with respect to the running {what} "
                f"(inference-form batch norm treats mean and var as constants)")


def _zeros_like_channel(node, like):
    from .elementwise import Zeros
    return node.graph.apply(Zeros, {"type": like.type}, [])


@attrs.frozen
class BatchNorm(Op):
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over axis 1.

    Inputs: x (N, C, ...), scale, bias, mean, var (C,) -> shape of x.
    """

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (5, 5)
    kind: ClassVar[str] = "batch_norm"
    family: ClassVar[str] = "norm"

    def infer(self, x, scale, bias, mean, var):
        dtype = _check_channel_vectors(self, x, dict(scale=scale, bias=bias, mean=mean, var=var))
        return TensorType(x.shape, dtype)

    def vjp(self, node, gy, wanted):
        _no_stats_gradient(self, node, wanted, {3: "mean", 4: "var"})
        x, scale, bias, mean, var = node.inputs
        g, p = node.graph, {"eps": self.eps}
        from .elementwise import BiasAddBackward
        gx = g.apply(BatchNormBackwardData, p, [gy, scale, var]) if wanted[0] else None
        gs = g.apply(BatchNormBackwardScale, p, [x, mean, var, gy]) if wanted[1] else None
        gb = g.apply(BiasAddBackward, {}, [gy]) if wanted[2] else None
        return (gx, gs, gb, None, None)


@attrs.frozen
class BatchNormBackwardData(Op):
    """dL/dx of ``BatchNorm``: ``gy * scale / sqrt(var + eps)``; gy (N, C, ...), scale, var (C,)."""

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (3, 3)
    kind: ClassVar[str] = "batch_norm_backward_data"
    family: ClassVar[str] = "norm"

    def infer(self, gy, scale, var):
        return TensorType(gy.shape, _check_channel_vectors(self, gy, dict(scale=scale, var=var)))

    def vjp(self, node, v, wanted):
        _no_stats_gradient(self, node, wanted, {2: "var"})
        gy, scale, var = node.inputs
        g, p = node.graph, {"eps": self.eps}
        d_gy = g.apply(BatchNormBackwardData, p, [v, scale, var]) if wanted[0] else None
        # d/dscale_c sum(v * gy * scale * s) = sum(v * (gy - 0) * s): BackwardScale with mean 0.
        d_scale = (g.apply(BatchNormBackwardScale, p, [gy, _zeros_like_channel(node, scale), var, v])
                   if wanted[1] else None)
        return (d_gy, d_scale, None)


@attrs.frozen
class BatchNormBackwardScale(Op):
    """dL/dscale of ``BatchNorm``: ``sum(gy * (x - mean) / sqrt(var + eps))`` over all axes but 1.

    Inputs: x (N, C, ...), mean, var (C,), gy (shape of x) -> (C,).
    """

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (4, 4)
    kind: ClassVar[str] = "batch_norm_backward_scale"
    family: ClassVar[str] = "norm"

    def infer(self, x, mean, var, gy):
        dtype = _check_channel_vectors(self, x, dict(mean=mean, var=var))
        if gy.shape != x.shape:
            raise ShapeError(f"output gradient shape {gy.shape} != input shape {x.shape}")
        require_same_dtype(self, (x, gy))
        return TensorType((x.shape[1],), dtype)

    def vjp(self, node, v, wanted):
        _no_stats_gradient(self, node, wanted, {1: "mean", 2: "var"})
        x, mean, var, gy = node.inputs
        g, p = node.graph, {"eps": self.eps}
        d_x = g.apply(BatchNormBackwardData, p, [gy, v, var]) if wanted[0] else None
        d_gy = (g.apply(BatchNorm, p, [x, v, _zeros_like_channel(node, v), mean, var])
                if wanted[3] else None)
        return (d_x, None, None, d_gy)

