"""Layer normalisation over the last axes (``torch.nn.functional.layer_norm``,
ONNX ``LayerNormalization`` with ``axis = -len(normalized_shape)``; Ba et al.,
"Layer Normalization", 2016; the ConvNeXt block).

For x (..., *normalized_shape) the statistics of each leading index run over
the trailing ``k = len(normalized_shape)`` axes, ``n`` values::

    y = (x - mean) / sqrt(var + eps) * weight + bias        (var biased)

weight and bias have ``normalized_shape``; absent weight is 1, absent bias 0.
Unlike batch norm there are no running statistics and the same formula holds
in training and inference, so every op recomputes mean and variance from x
(a row is small and was just read) instead of saving them.

Gradients (``xhat``, ``rstd``, means ``<.>`` per row; the arithmetic is
batch norm's, over other axes, in ``backends/reference/normalization.py``):

* ``LayerNormBackwardData``: (gy, x[, weight]) -> ``dx = rstd * (g - <g> - xhat
  <g xhat>)``, ``g = gy * weight``, through the statistics (the weight varies
  along a row, so it scales gy before the projection);
* ``LayerNormBackwardScale``: (x, gy) -> ``dweight = sum(gy * xhat)`` over the
  leading axes; ``dbias = SumTo(gy, normalized_shape)``;
* second derivatives: the projection ``g -> g - <g> - xhat <g xhat>`` is
  self-adjoint, so for a cotangent v of dx, d/dgy is ``weight * dx(v)|weight=1``,
  d/dweight ``sum(gy * dx(v)|weight=1)`` over the leading axes, and d/dx
  ``LayerNormDoubleBackward`` (v, gy, x[, weight]), batch norm's formula with
  ``g`` for gy (``batchnorm_training.py``); no third derivatives.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from ..op import Op, require_same_dtype
from ..types import TensorType, is_float
from . import _fields as F
from .broadcast import Mul, SumTo


def _check(op, x: TensorType, others: dict) -> None:
    """x ends with ``op.normalized_shape``; weight-like ``others`` have that shape,
    gradient-like ones x's shape; one floating dtype throughout."""
    ns = op.normalized_shape
    if not ns or x.ndim < len(ns) or x.shape[x.ndim - len(ns):] != ns:
        raise ShapeError(f"parameter normalized_shape={ns}: must be non-empty and end the input "
                         f"shape {x.shape}")
    if not is_float(x.dtype):
        raise ShapeError(f"{op.name}: input must be floating point, got {x.dtype}")
    for what, t in others.items():
        want = ns if what in ("weight", "bias") else x.shape
        if t.shape != want:
            raise ShapeError(f"{what} shape {t.shape} != {want}")
    require_same_dtype(op, (x, *others.values()))


@attrs.frozen
class _LayerNormFamily(Op):
    """The parameters every layer-norm op shares (underscored: a base, not an op)."""

    normalized_shape: tuple = F.shape("normalized_shape")
    eps: float = F.real("eps", 1e-5, lo=0.0)
    family: ClassVar[str] = "norm"


@attrs.frozen
class LayerNorm(_LayerNormFamily):
    """(x[, weight[, bias]]) -> x's shape: normalised over the trailing ``normalized_shape``."""

    arity: ClassVar = (1, 3)
    kind: ClassVar[str] = "layer_norm"

    def infer(self, x, *affine):
        _check(self, x, dict(zip(("weight", "bias"), affine)))
        return x

    def flops(self, types, out) -> int:
        return (6 + len(types) - 1) * out.size  # moments 4, normalise 2, affine 1 each

    def vjp(self, node, gy, wanted):
        x, *affine = node.inputs
        g, p = node.graph, self.params()
        dx = g.apply(LayerNormBackwardData, p, [gy, x, *affine[:1]]) if wanted[0] else None
        dw = g.apply(LayerNormBackwardScale, p, [x, gy]) if affine and wanted[1] else None
        db = (g.apply(SumTo, {"shape": self.normalized_shape}, [gy])
              if len(affine) > 1 and wanted[2] else None)
        return (dx, dw, db)[:len(node.inputs)]


@attrs.frozen
class LayerNormBackwardData(_LayerNormFamily):
    """dL/dx of ``LayerNorm`` through the statistics: (gy, x[, weight]) -> x's shape."""

    arity: ClassVar = (2, 3)
    kind: ClassVar[str] = "layer_norm_backward_data"

    def infer(self, gy, x, *weight):
        _check(self, x, dict(gy=gy, **dict(zip(("weight",), weight))))
        return x

    def flops(self, types, out) -> int:
        return 14 * out.size

    def vjp(self, node, v, wanted):
        return data_gradient_vjp(self, node.graph, node.inputs, v, wanted)


def data_gradient_vjp(op, g, inputs, v, wanted) -> tuple:
    """The cotangents of ``LayerNormBackwardData``'s ``inputs`` (gy, x[, weight]) in graph ``g``
    for the cotangent ``v`` of dx (``op``: its parameters); shared with the fused data gradient
    that fills the weight gradient (``layer_norm_sums.py``)."""
    # dx = rstd * P(gy * weight), P self-adjoint per row: <v, dx> = <rstd * P(v), gy * weight>
    gy, x, *weight = inputs
    p = op.params()
    unit = g.apply(LayerNormBackwardData, p, [v, x]) if wanted[0] or (weight and wanted[2]) else None
    d_gy = (g.apply(Mul, {}, [unit, weight[0]]) if weight else unit) if wanted[0] else None
    d_x = g.apply(LayerNormDoubleBackward, p, [v, gy, x, *weight]) if wanted[1] else None
    d_w = None
    if weight and wanted[2]:
        d_w = g.apply(SumTo, {"shape": op.normalized_shape}, [g.apply(Mul, {}, [gy, unit])])
    return (d_gy, d_x, d_w)[:len(inputs)]


@attrs.frozen
class LayerNormBackwardScale(_LayerNormFamily):
    """dL/dweight of ``LayerNorm``: (x, gy) -> ``sum(gy * xhat)`` over the leading axes."""

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "layer_norm_backward_scale"

    def infer(self, x, gy):
        _check(self, x, dict(gy=gy))
        return TensorType(self.normalized_shape, x.dtype)

    def flops(self, types, out) -> int:
        return 8 * types[0].size

    def vjp(self, node, v, wanted):
        x, gy = node.inputs
        return scale_vjp(self, node.graph, x, gy, v, wanted)


def scale_vjp(op, g, x, gy, v, wanted) -> tuple:
    """``(d_x, d_gy)`` of ``LayerNormBackwardScale(x, gy)`` for the cotangent ``v`` of the weight
    gradient (``wanted``: for x, for gy); shared with its slot (``layer_norm_sums.py``).
    sum(gy * xhat * v): d/dx is the data gradient with weight v, d/dgy xhat * v."""
    p = op.params()
    d_x = g.apply(LayerNormBackwardData, p, [gy, x, v]) if wanted[0] else None
    d_gy = g.apply(LayerNorm, p, [x, v]) if wanted[1] else None
    return (d_x, d_gy)


@attrs.frozen
class LayerNormDoubleBackward(_LayerNormFamily):
    """d<v, dx>/dx of ``LayerNormBackwardData``: (v, gy, x[, weight]) -> x's shape.
    No gradient rule (third order)."""

    arity: ClassVar = (3, 4)
    kind: ClassVar[str] = "layer_norm_double_backward"

    def infer(self, v, gy, x, *weight):
        _check(self, x, dict(cotangent=v, gy=gy, **dict(zip(("weight",), weight))))
        return x

    def flops(self, types, out) -> int:
        return 24 * out.size
