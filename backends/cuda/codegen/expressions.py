"""The expression table: each memory-bound op type as IR (``ir.py``) in CT arithmetic.

``EXPRESSIONS[op type]`` is an :class:`Expression`: ``build(b, op, types,
*operands)`` (``b`` an :class:`ir.Builder`, ``types`` the member's input
types) returns the op's value (or :class:`ir.Stacked` rows) from its
operands (:class:`ir.Ext` program inputs or earlier members' values), and
``iterates`` says which shape the op runs over: ``'out'`` (its output's),
``'in'`` (its first input's: a reduction) or None (per channel only). The
formulas are those of the reference kernels (``backends/reference``;
SEMANTICS.md), written in CT (fp32, fp64 for float64 storage):

* selects stay selects (masks pick a value or 0, so an infinite gradient at
  a blocked position gives 0, as the reference's ``where``); NaN propagates
  through clips by comparison order (``x < lo ? lo : (x > hi ? hi : x)``);
* sigmoid from ``e = exp(-|x|)``: no overflow for any x;
* constants that the reference compares in the storage dtype (threshold) are
  rounded to it on the host first, as NumPy does;
* batch statistics: one pass of shifted sums, ``d = x - x[0, c, 0, 0]``,
  ``mean = shift + sum(d)/n``, ``var = sum(d^2)/n - (sum(d)/n)^2`` (the shift
  removes the cancellation of ``E[x^2] - E[x]^2``; Chan, Golub & LeVeque,
  "Algorithms for computing the sample variance", 1983); counts are
  ``max(n, 1)`` as the reference's group means.

A program whose member is not in the table, or whose operands the builder
cannot place, is declined (``ir.PlanError``).
"""

from __future__ import annotations

import math

from opgraph import ops
from opgraph.ops.batchnorm_sums import SUM_GY, SUM_GY_XHAT
from opgraph.types import rounded

from ...reference.dropout import keep_threshold, seed_state
from .ir import PlanError, Stacked, trailing_axes
from .moments import rstd as _rstd, shifted_moments
from .storage import lit
from .table import EXPRESSIONS, Expression, expression




def _clip(lo: str, hi: str) -> str:
    return f"({{0}} < {lo} ? {lo} : ({{0}} > {hi} ? {hi} : {{0}}))"


# ------------------------------------------------------------------ ReLU family

@expression(ops.Relu)
def _relu(b, op, types, x):
    return b.expr("(({0} > (CT)0 || {0} != {0}) ? {0} : (CT)0)", b.value(x))


@expression(ops.ReluBackward)
def _relu_backward(b, op, types, y, gy):
    return b.expr("({0} > (CT)0 ? {1} : (CT)0)", b.value(y), b.value(gy))


@expression(ops.Threshold)
def _threshold(b, op, types, x):
    t, v = lit(rounded(op.threshold, types[0].dtype)), lit(rounded(op.value, types[0].dtype))
    return b.expr(f"({{0}} <= {t} ? {v} : {{0}})", b.value(x))


@expression(ops.ThresholdBackward)
def _threshold_backward(b, op, types, x, gy):
    t = lit(rounded(op.threshold, types[0].dtype))
    return b.expr(f"({{0}} > {t} ? {{1}} : (CT)0)", b.value(x), b.value(gy))


# ------------------------------------------------------------------ piecewise activations

@expression(ops.Hardtanh)
def _hardtanh(b, op, types, x):
    return b.expr(_clip(lit(op.min_val), lit(op.max_val)), b.value(x))


@expression(ops.HardtanhBackward)
def _hardtanh_backward(b, op, types, x, gy):
    """The mask against the bounds rounded to x's storage dtype (x may be the
    stored output, whose clipped elements hold the rounded bound)."""
    lo, hi = (lit(rounded(v, types[0].dtype)) for v in (op.min_val, op.max_val))
    return b.expr(f"(({{0}} > {lo} && {{0}} < {hi}) ? {{1}} : (CT)0)", b.value(x), b.value(gy))


@expression(ops.Hardsigmoid)
def _hardsigmoid(b, op, types, x):
    t = b.expr(f"({{0}} * {lit(op.alpha)} + {lit(op.beta)})", b.value(x))
    return b.expr(_clip("(CT)0", "(CT)1"), t)


@expression(ops.HardsigmoidBackward)
def _hardsigmoid_backward(b, op, types, x, gy):
    t = b.expr(f"({{0}} * {lit(op.alpha)} + {lit(op.beta)})", b.value(x))
    return b.expr(f"(({{0}} > (CT)0 && {{0}} < (CT)1) ? {{1}} * {lit(op.alpha)} : (CT)0)", t, b.value(gy))


@expression(ops.Hardswish)
def _hardswish(b, op, types, x):
    x = b.value(x)
    gate = b.expr(_clip("(CT)0", "(CT)1"), b.expr(f"({{0}} * {lit(1 / 6)} + (CT)0.5)", x))
    return b.expr("({0} * {1})", x, gate)


@expression(ops.HardswishBackward)
def _hardswish_backward(b, op, types, x, gy):
    x, gy = b.value(x), b.value(gy)
    inside = "({0} > (CT)-3 && {0} < (CT)3)"
    if op.order == 2:
        return b.expr(f"({inside} ? {{1}} * {lit(1 / 3)} : (CT)0)", x, gy)
    return b.expr(f"({{0}} >= (CT)3 ? {{1}} : ({inside} ? {{1}} * ({{0}} * {lit(1 / 3)} + (CT)0.5) : (CT)0))",
                  x, gy)


# ------------------------------------------------------------------ smooth activations

def _sigmoid_parts(b, x):
    """``(s, s (1 - s))`` from ``e = exp(-|x|)`` (the reference's ``_sigmoid_parts``)."""
    e = b.expr("exp(-fabs({0}))", x)
    inv = b.expr("((CT)1 / ((CT)1 + {0}))", e)
    s = b.expr("({0} >= (CT)0 ? {1} : {2} * {1})", x, inv, e)
    return s, b.expr("({0} * {1} * {1})", e, inv)


@expression(ops.Sigmoid)
def _sigmoid(b, op, types, x):
    return _sigmoid_parts(b, b.value(x))[0]


@expression(ops.SigmoidBackward)
def _sigmoid_backward(b, op, types, x, gy):
    s, ds = _sigmoid_parts(b, b.value(x))
    d = ds if op.order == 1 else b.expr("({0} * ((CT)1 - (CT)2 * {1}))", ds, s)
    return b.expr("({0} * {1})", b.value(gy), d)


@expression(ops.Silu)
def _silu(b, op, types, x):
    x = b.value(x)
    return b.expr("({0} * {1})", x, _sigmoid_parts(b, x)[0])


@expression(ops.SiluBackward)
def _silu_backward(b, op, types, x, gy):
    x = b.value(x)
    s, ds = _sigmoid_parts(b, x)
    if op.order == 1:
        d = b.expr("({0} + {1} * {2})", s, x, ds)
    else:
        d = b.expr("({0} * ((CT)2 + {1} * ((CT)1 - (CT)2 * {2})))", ds, x, s)
    return b.expr("({0} * {1})", b.value(gy), d)


_K, _C = lit(math.sqrt(2.0 / math.pi)), lit(0.044715)


@expression(ops.Gelu)
def _gelu(b, op, types, x):
    x = b.value(x)
    if op.approximate == "tanh":
        return b.expr(f"((CT)0.5 * {{0}} * ((CT)1 + tanh({_K} * ({{0}} + {_C} * {{0}} * {{0}} * {{0}}))))", x)
    return b.expr(f"((CT)0.5 * {{0}} * ((CT)1 + erf({{0}} * {lit(math.sqrt(0.5))})))", x)


@expression(ops.GeluBackward)
def _gelu_backward(b, op, types, x, gy):
    x, gy = b.value(x), b.value(gy)
    if op.approximate == "tanh":
        t = b.expr(f"tanh({_K} * ({{0}} + {_C} * {{0}} * {{0}} * {{0}}))", x)
        du = b.expr(f"({_K} * ((CT)1 + (CT)3 * {_C} * {{0}} * {{0}}))", x)
        if op.order == 1:
            d = b.expr("((CT)0.5 * ((CT)1 + {0}) + (CT)0.5 * {1} * ((CT)1 - {0} * {0}) * {2})", t, x, du)
        else:
            d = b.expr(f"(((CT)1 - {{0}} * {{0}}) * ({{2}} + (CT)0.5 * {{1}} * ((CT)6 * {_C} * {_K} * {{1}}"
                       f" - (CT)2 * {{0}} * {{2}} * {{2}})))", t, x, du)
        return b.expr("({0} * {1})", gy, d)
    phi = b.expr(f"({lit(1 / math.sqrt(2 * math.pi))} * exp((CT)-0.5 * {{0}} * {{0}}))", x)
    if op.order == 1:
        d = b.expr(f"((CT)0.5 * ((CT)1 + erf({{0}} * {lit(math.sqrt(0.5))})) + {{0}} * {{1}})", x, phi)
    else:
        d = b.expr("({1} * ((CT)2 - {0} * {0}))", x, phi)
    return b.expr("({0} * {1})", gy, d)


# ------------------------------------------------------------------ arithmetic, broadcasting

@expression(ops.Add, ops.BroadcastAdd)
def _add(b, op, types, x, y):
    return b.expr("({0} + {1})", b.value(x), b.value(y))


@expression(ops.Mul)
def _mul(b, op, types, x, y):
    return b.expr("({0} * {1})", b.value(x), b.value(y))


@expression(ops.Div)
def _div(b, op, types, x, y):
    if types[0].dtype == "int64":
        raise PlanError("integer division is not generated")
    return b.expr("({0} / {1})", b.value(x), b.value(y))


@expression(ops.Neg)
def _neg(b, op, types, x):
    return b.expr("(-{0})", b.value(x))


@expression(ops.BiasAdd)
def _bias_add(b, op, types, x, bias):
    return b.expr("({0} + {1})", b.value(x), b.channel(bias))


@expression(ops.BroadcastTo)
def _broadcast_to(b, op, types, x):
    return b.value(x)


def reduction_target(in_shape, out_shape) -> str | None:
    """The reduction that sums ``in_shape`` down to ``out_shape``: ``'plane'`` (the
    axes after 1: ``(N, C, 1, 1)`` or ``(N, C)``), ``'channel'`` (every axis
    but 1: ``(C,)``, ``(1, C, 1, 1)``, ``(C, 1, 1)``), ``'scalar'`` (all),
    ``'col'`` (the leading axes, keeping the trailing ones: :func:`trailing_axes`;
    the bias gradient of a Linear layer on ``(N, H, W, C)``), None (none: the
    same shape); PlanError for another pattern. With N = 1 a
    ``(1, C, 1, 1)`` result is per plane (the same sums). A result of the input's
    rank is read by position: ``(N, 1, 1, 1)`` is not per channel even when N = C."""
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    if in_shape == out_shape:
        return None
    if math.prod(out_shape) == 1 and math.prod(in_shape) > 0:
        return "scalar"
    same_rank = len(out_shape) == len(in_shape)
    if len(in_shape) >= 3 and (out_shape == in_shape[:2] or (
            same_rank and out_shape[:2] == in_shape[:2] and set(out_shape[2:]) == {1})):
        return "plane"
    if (len(in_shape) >= 2 and [s for s in out_shape if s != 1] == [in_shape[1]]
            and (not same_rank or out_shape[1] == in_shape[1])):
        return "channel"
    if trailing_axes(in_shape, out_shape) is not None:
        return "col"
    raise PlanError(f"a sum from {in_shape} to {out_shape} is not per channel, per plane, per trailing index "
                    "or total")


@expression(ops.SumTo, iterates="in")
def _sum_to(b, op, types, x):
    # SumTo aligns its shape with the input's trailing axes (NumPy broadcasting):
    # a (C,) target of a 4-D input keeps W, so it is compared at the input's rank
    rank = len(types[0].shape)
    target = reduction_target(types[0].shape, (1,) * (rank - len(op.shape)) + tuple(op.shape))
    x = b.value(x)
    if target == "col":
        return b.reduce(x, target, trailing_axes(types[0].shape, op.shape))
    return x if target is None else b.reduce(x, target)


@expression(ops.BiasAddBackward, iterates="in")
def _bias_add_backward(b, op, types, gy):
    return b.reduce(b.value(gy), "channel")


def _mean_target(shape, axes) -> str | None:
    axes = tuple(axes)
    if not axes:
        return None
    if axes == tuple(range(len(shape))):
        return "scalar"
    if len(shape) >= 2 and axes == (0, *range(2, len(shape))):
        return "channel"
    if len(shape) >= 3 and axes == tuple(range(2, len(shape))):
        return "plane"
    raise PlanError(f"a mean over axes {axes} of {shape} is not per channel, per plane or total")


def _mean(b, x, target):
    return x if target is None else b.expr("({0} / {1})", b.reduce(x, target), b.count(target))


@expression(ops.Mean, iterates="in")
def _mean_op(b, op, types, x):
    return _mean(b, b.value(x), _mean_target(types[0].shape, op.axes))


@expression(ops.GlobalAvgPool2d, iterates="in")
def _global_avg_pool(b, op, types, x):
    return _mean(b, b.value(x), "plane")


@expression(ops.MeanBackward)
def _mean_backward(b, op, types, gy):
    target = _mean_target(op.input_shape, op.axes)
    kept = tuple(1 if a in op.axes else s for a, s in enumerate(op.input_shape))
    g = b.value(gy, as_shape=kept)
    return g if target is None else b.expr("({0} / {1})", g, b.count(target))


@expression(ops.GlobalAvgPool2dBackward)
def _global_avg_pool_backward(b, op, types, gy):
    return b.expr("({0} / {1})", b.value(gy), b.count("plane"))


def _whole_plane(op, spatial) -> None:
    """Raise PlanError unless average pooling ``op`` is a global pool of a ``spatial`` plane: one
    window covering it with no padding (so one output per plane and the divisor its H * W,
    with or without ``count_include_pad``: SEMANTICS.md, Pooling). GoogLeNet's 7x7/1 pool."""
    whole = tuple(op.kernel_size) == tuple(spatial) and all(p == (0, 0) for p in op.padding)
    if not whole:
        raise PlanError(f"{op.describe()}: only a window covering the whole {tuple(spatial)} plane with no "
                        "padding is generated (a global average pool)")


@expression(ops.AvgPool2d, iterates="in")
def _avg_pool_whole_plane(b, op, types, x):
    _whole_plane(op, types[0].shape[2:])
    return _global_avg_pool(b, op, types, x)


@expression(ops.AvgPool2dBackward)
def _avg_pool_whole_plane_backward(b, op, types, gy):
    _whole_plane(op, op.input_shape[2:])
    return _global_avg_pool_backward(b, op, types, gy)


@expression(ops.Dropout)
def _dropout(b, op, types, x):
    x = b.value(x)
    if not op.training or op.p == 0:
        return x
    if op.p >= 1:  # zeros in x's space; x is not read (0 * inf would be NaN)
        return b.expr("(CT)0", x)
    scale = lit(rounded(1.0 / (1.0 - op.p), types[0].dtype))
    keep = b.keep(seed_state(op.seed), keep_threshold(op.p))
    return b.expr(f"({{1}} != (CT)0 ? {{0}} * {scale} : (CT)0)", x, keep)


# ------------------------------------------------------------------ batch norm, inference form

@expression(ops.BatchNorm)
def _batch_norm(b, op, types, x, scale, bias, mean, var):
    rstd = _rstd(b, b.channel(var), op.eps)
    xhat = b.expr("(({0} - {1}) * {2})", b.value(x), b.channel(mean), rstd)
    return b.expr("({0} * {1} + {2})", xhat, b.channel(scale), b.channel(bias))


@expression(ops.BatchNormBackwardData)
def _batch_norm_backward_data(b, op, types, gy, scale, var):
    factor = b.expr("({0} * {1})", b.channel(scale), _rstd(b, b.channel(var), op.eps))
    return b.expr("({0} * {1})", b.value(gy), factor)


@expression(ops.BatchNormBackwardScale, iterates="in")
def _batch_norm_backward_scale(b, op, types, x, mean, var, gy):
    total = b.reduce(b.expr("({0} * ({1} - {2}))", b.value(gy), b.value(x), b.channel(mean)), "channel")
    return b.expr("({0} * {1})", total, _rstd(b, b.channel(var), op.eps))


# ------------------------------------------------------------------ batch norm, training form

@expression(ops.BatchNormStats, iterates="in")
def _batch_norm_stats(b, op, types, x):
    shift = b.sample(x)
    _, m1, var, _ = shifted_moments(b, x, shift, "channel")
    return Stacked((b.expr("({0} + {1})", shift, m1), var))


def _xhat(b, x, stats, eps):
    """``(xhat, rstd)`` from the saved statistics (rows 0 and 1 of ``stats``)."""
    rstd = _rstd(b, b.row(stats, 1), eps)
    return b.expr("(({0} - {1}) * {2})", b.value(x), b.row(stats, 0), rstd), rstd


@expression(ops.BatchNormTraining)
def _batch_norm_training(b, op, types, x, stats, *affine):
    y, _ = _xhat(b, x, stats, op.eps)
    if affine:
        y = b.expr("({0} * {1})", y, b.channel(affine[0]))
    if len(affine) > 1:
        y = b.expr("({0} + {1})", y, b.channel(affine[1]))
    return y


@expression(ops.BatchNormTrainingBackwardData)
def _batch_norm_training_backward_data(b, op, types, gy, x, stats, *weight):
    xhat, rstd = _xhat(b, x, stats, op.eps)
    g = b.value(gy)
    if weight:
        g = b.expr("({0} * {1})", g, b.channel(weight[0]))
    n = b.count("channel")
    mean_g = b.expr("({0} / {1})", b.reduce(g, "channel"), n)
    mean_gx = b.expr("({0} / {1})", b.reduce(b.expr("({0} * {1})", g, xhat), "channel"), n)
    return b.expr("({0} * ({1} - {2} - {3} * {4}))", rstd, g, mean_g, xhat, mean_gx)


@expression(ops.BatchNormTrainingBackwardSums, iterates="in")
def _batch_norm_training_backward_sums(b, op, types, x, stats, gy):
    """``[sum(gy); sum(gy * xhat)]`` per channel, one pass over x and gy, summed in CT."""
    xhat, _ = _xhat(b, x, stats, op.eps)
    g = b.value(gy)
    return Stacked((b.reduce(g, "channel"), b.reduce(b.expr("({0} * {1})", g, xhat), "channel")))


@expression(ops.BatchNormBackwardSumsRow, iterates=None)
def _batch_norm_backward_sums_row(b, op, types, sums, like):
    return b.row(sums, op.row)  # rounded to like's storage dtype on the store; like is not read


@expression(ops.BatchNormTrainingBackwardDataFromSums)
def _batch_norm_training_backward_data_from_sums(b, op, types, gy, x, stats, sums, *weight):
    """The data gradient with its sums given (the op's docstring): one element-wise pass."""
    xhat, rstd = _xhat(b, x, stats, op.eps)
    n = b.count("channel")
    mean_g = b.expr("({0} / {1})", b.row(sums, SUM_GY), n)  # per channel values: computed once per channel
    mean_gx = b.expr("({0} / {1})", b.row(sums, SUM_GY_XHAT), n)
    centred = b.expr("({0} - {1} - {2} * {3})", b.value(gy), mean_g, xhat, mean_gx)
    factor = b.expr("({0} * {1})", rstd, b.channel(weight[0])) if weight else rstd
    return b.expr("({0} * {1})", factor, centred)


@expression(ops.BatchNormTrainingBackwardScale, iterates="in")
def _batch_norm_training_backward_scale(b, op, types, x, stats, gy):
    xhat, _ = _xhat(b, x, stats, op.eps)
    return b.reduce(b.expr("({0} * {1})", b.value(gy), xhat), "channel")


@expression(ops.BatchNormRunningUpdate, iterates=None)
def _batch_norm_running_update(b, op, types, stats, running):
    old = b.channel(running)
    if op.count == 0:
        return old
    batch = b.row(stats, 0 if op.statistic == "mean" else 1)
    if op.statistic == "var":
        batch = b.expr(f"({{0}} * {lit(op.count / (op.count - 1))})", batch)
    return b.expr(f"({{0}} * {lit(1.0 - op.momentum)} + {{1}} * {lit(op.momentum)})", old, batch)


__all__ = ["EXPRESSIONS", "Expression", "expression", "reduction_target", "trailing_axes"]


from . import layer_norm  # noqa: E402,F401  (registers layer norm's expressions in the table)
