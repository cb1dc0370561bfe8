"""The arithmetic shared by the batch-statistics normalisations (training batch
norm, layer norm): moments over a set of axes and the first and second
derivatives of ``y = xhat * w`` through the statistics.

Notation: for each group of ``n`` values (one channel for batch norm, one row
for layer norm), ``mean``, the biased ``var``, ``rstd = 1 / sqrt(var + eps)``,
``xhat = (x - mean) * rstd``; ``<a>`` is the group mean of ``a``; ``g`` is the
gradient with respect to xhat (``gy * weight``: the weight is constant over a
batch-norm group, not over a layer-norm row, so it is applied first). Then
(Ioffe & Szegedy 2015, section 3)::

    dx = rstd * (g - <g> - xhat * <g xhat>)

and, for a cotangent ``v`` of dx, the derivative of ``sum(v * dx)`` with
respect to x, through mean, var and xhat (derived in
``opgraph/ops/batchnorm_training.py``)::

    -rstd^2 * (xhat * (<v g> - <v><g> - 3 <v xhat><g xhat>)
               + (v - <v>) <g xhat> + (g - <g>) <v xhat>)

Arrays come in the compute dtype (float32 for half storage). Group means of
an empty group are 0 (a sum over nothing divided by ``max(n, 1)``), so an
empty batch gives empty gradients and no NaN or warning.
"""

from __future__ import annotations

import math


def group_mean(a, axes, n):
    """``sum(a)`` over ``axes`` (kept with extent 1) divided by ``max(n, 1)``."""
    return a.sum(axis=axes, keepdims=True) / max(n, 1)


def group_size(shape, axes) -> int:
    """Number of values in each group: the product of ``shape`` over ``axes``."""
    return math.prod(shape[a] for a in axes)


def moments(x, axes):
    """``(mean, var)`` over ``axes``, kept with extent 1; var biased, two-pass."""
    n = group_size(x.shape, axes)
    mean = group_mean(x, axes, n)
    centred = x - mean
    return mean, group_mean(centred * centred, axes, n)


def normalized(xp, x, mean, var, eps):
    """``(xhat, rstd)`` from x and its moments."""
    rstd = 1.0 / xp.sqrt(var + eps)
    return (x - mean) * rstd, rstd


def data_gradient(g, xhat, rstd, axes):
    """``dx = rstd * (g - <g> - xhat * <g xhat>)``, g the gradient w.r.t. xhat."""
    n = group_size(g.shape, axes)
    return rstd * (g - group_mean(g, axes, n) - xhat * group_mean(g * xhat, axes, n))


def data_gradient_input_grad(v, g, xhat, rstd, axes):
    """d sum(v * dx) / dx of :func:`data_gradient` (module docstring)."""
    n = group_size(g.shape, axes)
    mean_v, mean_g = group_mean(v, axes, n), group_mean(g, axes, n)
    v_xhat, g_xhat = group_mean(v * xhat, axes, n), group_mean(g * xhat, axes, n)
    cross = group_mean(v * g, axes, n) - mean_v * mean_g - 3.0 * v_xhat * g_xhat
    return -(rstd * rstd) * (xhat * cross + (v - mean_v) * g_xhat + (g - mean_g) * v_xhat)


__all__ = ["group_mean", "group_size", "moments", "normalized", "data_gradient",
           "data_gradient_input_grad"]
