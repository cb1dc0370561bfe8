"""Layer normalisation's ops as IR (``opgraph/ops/layer_norm.py``; Ba et al.,
"Layer Normalization", 2016), registered in the expression table.

Each op splits its iteration shape S (x's shape) at the trailing
``k = len(normalized_shape)`` axes (``ir``: ``row`` / ``col`` spaces): the
statistics are ``row`` reductions (one per leading index, over ``K`` values),
the weight and bias ``col`` operands, the weight gradient a ``col``
reduction (over the rows). Every sum is in CT (fp32 for half storage).

Statistics, as batch norm's (``moments.py``): one pass of sums shifted by
the row's first element, ``d = x - x[row, 0]``, ``m1 = <d>``, ``mean = shift +
m1``, ``var = max(<d^2> - m1^2, 0)`` (Chan, Golub & LeVeque 1983), ``rstd =
1 / sqrt(var + eps)``, ``xhat = (x - mean) rstd``. A mean against xhat is
taken in the same pass, ``<a xhat> = rstd (<a d> - m1 <a>)`` (xhat = (d - m1)
rstd), so the data gradients need one reduction kernel and one sweep.
Formulas: ``backends/reference/normalization.py`` (the op docstrings):

* ``LayerNorm``: ``xhat * weight + bias``;
* ``LayerNormBackwardData``: ``rstd (g - <g> - xhat <g xhat>)``, ``g = gy weight``;
* ``LayerNormBackwardScale``: ``sum(gy xhat)`` over the leading axes;
* ``LayerNormBackwardDataSums``: the data gradient, and the weight gradient's terms ``gy xhat``
  summed per column into its slot input while the row sweep has each row on chip
  (``Builder.fill_columns``, ``kernels.row_sweep``; ``opgraph/ops/layer_norm_sums.py``);
* ``LayerNormDoubleBackward``: ``-rstd^2 (xhat (<v g> - <v><g> - 3 <v xhat><g
  xhat>) + (v - <v>) <g xhat> + (g - <g>) <v xhat>)``.
"""

from __future__ import annotations

import attrs

from opgraph import ops

from .moments import rstd, shifted_moments
from .table import expression


@attrs.frozen
class RowStats:
    """One row's statistics (``row`` values) of the full operand x: ``d = x -
    shift``, ``m1 = <d>``, ``mean``, ``rstd`` and the count ``n``."""

    d: object
    m1: object
    mean: object
    rstd: object
    n: object
    k: int


def row_stats(b, x, k: int, eps: float) -> RowStats:
    """The statistics of x over its trailing ``k`` axes (module docstring)."""
    shift = b.row_sample(x, k)
    d, m1, var, n = shifted_moments(b, x, shift, "row", k)
    return RowStats(d, m1, b.expr("({0} + {1})", shift, m1), rstd(b, var, eps), n, k)


def xhat(b, s: RowStats):
    """``xhat = (d - m1) rstd`` of each element of the row (``(x - mean) / sqrt(var + eps)``)."""
    return b.expr("(({0} - {1}) * {2})", s.d, s.m1, s.rstd)


def row_mean(b, s: RowStats, a):
    """``<a>``: the row mean of the full value ``a``."""
    return b.expr("({0} / {1})", b.reduce(a, "row", s.k), s.n)


def row_mean_xhat(b, s: RowStats, a, mean_a):
    """``<a xhat> = rstd (<a d> - m1 <a>)``: in the statistics' pass."""
    return b.expr("({0} * ({1} - {2} * {3}))", s.rstd, row_mean(b, s, b.expr("({0} * {1})", a, s.d)), s.m1,
                  mean_a)


#: ``a * b`` rounded on its own (``__fmul_rn`` / ``__dmul_rn`` in CT): never contracted into
#: a fused multiply-add with what it is added to, as NVRTC does by default (``--fmad=true``)
MUL_RN = "((CT)(sizeof(CT) == 4 ? (double)__fmul_rn((float){0}, (float){1}) : __dmul_rn((double){0}, (double){1})))"


def _scaled(b, k, gy, weight):
    """``g = gy * weight`` (gy itself without a weight), rounded on its own (:data:`MUL_RN`), so
    that the sweep's ``g - <g>`` is exactly 0 where a row has one element (``<g>`` = g): NVRTC
    contracted ``gy * weight - <g>`` into an FMA, leaving the product's rounding error times
    ``rstd = 1 / sqrt(eps)``, ~1e-5 on the H200 (2026-12-05) where the answer is 0."""
    g = b.value(gy)
    return b.expr(MUL_RN, g, b.trailing_operand(weight[0], k)) if weight else g


@expression(ops.LayerNorm)
def _layer_norm(b, op, types, x, *affine):
    k = len(op.normalized_shape)
    y = xhat(b, row_stats(b, x, k, op.eps))
    if affine:
        y = b.expr("({0} * {1})", y, b.trailing_operand(affine[0], k))
    if len(affine) > 1:
        y = b.expr("({0} + {1})", y, b.trailing_operand(affine[1], k))
    return y


@expression(ops.LayerNormBackwardData)
def _layer_norm_backward_data(b, op, types, gy, x, *weight):
    k = len(op.normalized_shape)
    s = row_stats(b, x, k, op.eps)
    g = _scaled(b, k, gy, weight)
    mean_g = row_mean(b, s, g)
    mean_gx = row_mean_xhat(b, s, g, mean_g)
    return b.expr("({0} * ({1} - {2} - {3} * {4}))", s.rstd, g, mean_g, xhat(b, s), mean_gx)


def _weight_gradient_terms(b, op, x, gy):
    """``gy * xhat``: the terms of the weight gradient, each row's (``sum`` over the rows)."""
    return b.expr("({0} * {1})", b.value(gy), xhat(b, row_stats(b, x, len(op.normalized_shape), op.eps)))


@expression(ops.LayerNormBackwardScale, iterates="in")
def _layer_norm_backward_scale(b, op, types, x, gy):
    return b.reduce(_weight_gradient_terms(b, op, x, gy), "col", len(op.normalized_shape))


@expression(ops.LayerNormBackwardDataSums)
def _layer_norm_backward_data_sums(b, op, types, gy, x, weight, dw):
    """The data gradient, its weight gradient's terms summed per column into ``dw`` by the
    one-kernel row sweep (``Builder.fill_columns``; the terms share the data gradient's
    statistics and xhat: equal nodes are one)."""
    dx = _layer_norm_backward_data(b, op, types[:3], gy, x, weight)
    b.fill_columns(_weight_gradient_terms(b, op, x, gy), dw)
    return dx


@expression(ops.LayerNormDoubleBackward)
def _layer_norm_double_backward(b, op, types, v, gy, x, *weight):
    k = len(op.normalized_shape)
    s = row_stats(b, x, k, op.eps)
    v, g = b.value(v), _scaled(b, k, gy, weight)
    mean_v, mean_g = row_mean(b, s, v), row_mean(b, s, g)
    v_xhat, g_xhat = row_mean_xhat(b, s, v, mean_v), row_mean_xhat(b, s, g, mean_g)
    cross = b.expr("({0} - {1} * {2} - (CT)3 * {3} * {4})", row_mean(b, s, b.expr("({0} * {1})", v, g)),
                   mean_v, mean_g, v_xhat, g_xhat)
    return b.expr("(-({0} * {0}) * ({1} * {2} + ({3} - {4}) * {5} + ({6} - {7}) * {8}))",
                  s.rstd, xhat(b, s), cross, v, mean_v, g_xhat, g, mean_g, v_xhat)


__all__ = ["RowStats", "row_stats", "xhat", "row_mean", "row_mean_xhat"]
