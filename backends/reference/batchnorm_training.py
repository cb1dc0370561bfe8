"""Reference (oracle) kernels of training-form batch norm (``opgraph/ops/batchnorm_training.py``).

Statistics over every axis but 1 of x (N, C, ...), ``n`` values per channel;
``stats`` is (2, C): the mean, then the biased variance. Formulas:
SEMANTICS.md ("BatchNorm, training form"), Ioffe & Szegedy 2015 (Algorithm 1,
section 3); the shared arithmetic is ``normalization.py``.

float16/bfloat16 x: the statistics, sums and all arithmetic are float32; the
statistics stay float32, every other result is rounded once to x's dtype.
Every kernel takes the array module ``xp`` first and returns a fresh array.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.errors import ShapeError
from opgraph.ops.batchnorm_sums import SUM_GY, SUM_GY_XHAT
from opgraph.types import compute_dtype

from .kernel import reference
from .normalization import data_gradient, data_gradient_input_grad, group_size, moments, normalized


def _axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _check(what, x, stats, sums=None, **vectors):
    """x (N, C, ...), the (2, C) ``stats`` and ``sums`` (None: absent), (C,) ``vectors``."""
    if x.ndim < 2:
        raise ShapeError(f"{what}: x must be (N, C, ...), got shape {x.shape}")
    for name, rows in (("stats", stats), ("sums", sums)):
        if rows is not None and tuple(rows.shape) != (2, x.shape[1]):
            raise ShapeError(f"{what}: {name} must have shape (2, {x.shape[1]}), got {rows.shape}")
    for name, v in vectors.items():
        if v is not None and tuple(v.shape) != (x.shape[1],):
            raise ShapeError(f"{what}: {name} must have shape ({x.shape[1]},), got {v.shape}")


def _channel(v, ndim, dt):
    """A (C,) vector as (1, C, 1, ...) in ``dt`` (None stays None)."""
    return None if v is None else v.astype(dt, copy=False).reshape((1, -1) + (1,) * (ndim - 2))


def _scaled(gy, weight):
    """``gy * weight`` per channel (gy in the compute dtype; weight None: gy)."""
    return gy if weight is None else gy * _channel(weight, gy.ndim, gy.dtype)


def _xhat(xp, x, stats, eps):
    """``(x, xhat, rstd)`` in the compute dtype, from the saved statistics."""
    dt = compute_dtype(xp, x.dtype)
    xc = x.astype(dt, copy=False)
    mean, var = _channel(stats[0], x.ndim, dt), _channel(stats[1], x.ndim, dt)
    xhat, rstd = normalized(xp, xc, mean, var, eps)
    return xc, xhat, rstd


@reference(ops.BatchNormStats)
def batch_norm_stats(xp, x):
    """Per-channel ``[mean; biased variance]`` of x (N, C, ...) -> (2, C), float32
    for half x (else x's dtype). Two passes (mean, then centred squares) for
    accuracy; an empty batch gives zeros.

    Raises:
        ShapeError: x has no channel axis.
    """
    if x.ndim < 2:
        raise ShapeError(f"batch_norm_stats: x must be (N, C, ...), got shape {x.shape}")
    dt = compute_dtype(xp, x.dtype)
    mean, var = moments(x.astype(dt, copy=False), _axes(x))
    return xp.stack([mean.reshape(-1), var.reshape(-1)])


@reference(ops.BatchNormTraining)
def batch_norm_training(xp, x, stats, weight=None, bias=None, *, eps):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with the batch statistics.

    Shapes: x (N, C, ...), stats (2, C), weight and bias (C,) or None (1, 0).
    Returns x's shape and dtype.
    """
    _check("batch_norm_training", x, stats, weight=weight, bias=bias)
    _, y, _ = _xhat(xp, x, stats, eps)
    dt = y.dtype
    if weight is not None:
        y = y * _channel(weight, x.ndim, dt)
    if bias is not None:
        y = y + _channel(bias, x.ndim, dt)
    return y.astype(x.dtype, copy=False)


@reference(ops.BatchNormTrainingBackwardData)
def batch_norm_training_backward_data(xp, gy, x, stats, weight=None, *, eps):
    """``dx = weight * rstd * (gy - <gy> - xhat * <gy xhat>)`` (channel means ``<.>``):
    the gradient through the normalisation and the batch statistics.

    Shapes: gy and x (N, C, ...), stats (2, C), weight (C,) or None.
    Returns gy's shape and dtype.
    """
    _check("batch_norm_training_backward_data", x, stats, weight=weight)
    xc, xhat, rstd = _xhat(xp, x, stats, eps)
    g = _scaled(gy.astype(xc.dtype, copy=False), weight)
    return data_gradient(g, xhat, rstd, _axes(x)).astype(gy.dtype, copy=False)


@reference(ops.BatchNormTrainingBackwardSums)
def batch_norm_training_backward_sums(xp, x, stats, gy, *, eps):
    """``[sum(gy); sum(gy * xhat)]`` over every axis but 1 -> (2, C), in the
    statistics' dtype (float32 for half x, else x's): the sums the data, weight
    and bias gradients share (``ops/batchnorm_sums.py``), accumulated in the
    compute dtype.

    Shapes: x and gy (N, C, ...), stats (2, C).
    """
    _check("batch_norm_training_backward_sums", x, stats)
    _, xhat, _ = _xhat(xp, x, stats, eps)
    g = gy.astype(xhat.dtype, copy=False)
    rows = {SUM_GY: g.sum(axis=_axes(x)), SUM_GY_XHAT: (g * xhat).sum(axis=_axes(x))}
    return xp.stack([rows[r] for r in sorted(rows)]).astype(stats.dtype, copy=False)


@reference(ops.BatchNormBackwardSumsRow)
def batch_norm_backward_sums_row(xp, sums, like, *, row):
    """Row ``row`` of the (2, C) ``sums`` rounded to like's dtype -> (C,)
    (``like``, (N, C, ...), is not read: it gives the storage dtype)."""
    _check("batch_norm_backward_sums_row", like, None, sums)
    return sums[row].astype(like.dtype)


@reference(ops.BatchNormTrainingBackwardDataFromSums)
def batch_norm_training_backward_data_from_sums(xp, gy, x, stats, sums, weight=None, *, eps):
    """``dx = weight * rstd * (gy - sums[0] / n - xhat * sums[1] / n)``: the
    data gradient of :func:`batch_norm_training_backward_data` with its two
    per-channel sums given (:func:`batch_norm_training_backward_sums`; the
    op's docstring: weight factors out of them).

    Shapes: gy and x (N, C, ...), stats and sums (2, C), weight (C,) or None
    (1). Returns gy's shape and dtype.
    """
    _check("batch_norm_training_backward_data_from_sums", x, stats, sums, weight=weight)
    xc, xhat, rstd = _xhat(xp, x, stats, eps)
    dt, n = xc.dtype, max(group_size(x.shape, _axes(x)), 1)  # an empty batch: no division by 0
    mean_g = _channel(sums[SUM_GY], x.ndim, dt) / n
    mean_gx = _channel(sums[SUM_GY_XHAT], x.ndim, dt) / n
    dx = _scaled(rstd * (gy.astype(dt, copy=False) - mean_g - xhat * mean_gx), weight)
    return dx.astype(gy.dtype, copy=False)


@reference(ops.BatchNormTrainingBackwardScale)
def batch_norm_training_backward_scale(xp, x, stats, gy, *, eps):
    """``dweight = sum(gy * xhat)`` over every axis but 1 -> (C,), x's dtype."""
    _check("batch_norm_training_backward_scale", x, stats)
    _, xhat, _ = _xhat(xp, x, stats, eps)
    total = (gy.astype(xhat.dtype, copy=False) * xhat).sum(axis=_axes(x))
    return total.astype(x.dtype, copy=False)


@reference(ops.BatchNormTrainingDoubleBackward)
def batch_norm_training_double_backward(xp, v, gy, x, stats, weight=None, *, eps):
    """d sum(v * dx) / dx of :func:`batch_norm_training_backward_data`
    (``normalization.data_gradient_input_grad``); x's shape and dtype."""
    _check("batch_norm_training_double_backward", x, stats, weight=weight)
    xc, xhat, rstd = _xhat(xp, x, stats, eps)
    dt = xc.dtype
    g = _scaled(gy.astype(dt, copy=False), weight)
    out = data_gradient_input_grad(v.astype(dt, copy=False), g, xhat, rstd, _axes(x))
    return out.astype(x.dtype, copy=False)


@reference(ops.BatchNormRunningUpdate)
def batch_norm_running_update(xp, stats, running, *, statistic, momentum, count):
    """``(1 - momentum) * running + momentum * s``: s the batch mean
    (``statistic='mean'``) or the unbiased variance ``var * count / (count - 1)``
    (``'var'``). ``count`` 0 (an empty batch) returns a copy of ``running``.
    Computed in float32 for half storage; returns running's shape and dtype.
    """
    if tuple(stats.shape) != (2, running.shape[0]):
        raise ShapeError(f"batch_norm_running_update: stats must have shape (2, {running.shape[0]}), "
                         f"got {stats.shape}")
    if count == 0:
        return running.copy()
    dt = compute_dtype(xp, running.dtype)
    batch = stats[0 if statistic == "mean" else 1].astype(dt, copy=False)
    if statistic == "var":
        batch = batch * (count / (count - 1))
    new = running.astype(dt, copy=False) * (1.0 - momentum) + batch * momentum
    return new.astype(running.dtype, copy=False)


__all__ = ["batch_norm_stats", "batch_norm_training", "batch_norm_training_backward_data",
           "batch_norm_training_backward_sums", "batch_norm_backward_sums_row", "batch_norm_training_backward_data_from_sums",
           "batch_norm_training_backward_scale", "batch_norm_training_double_backward",
           "batch_norm_running_update"]
