"""Batch normalisation in training form, as ``torch.nn.functional.batch_norm(training=True)``.

Semantics (SEMANTICS.md, "BatchNorm, training form"; Ioffe & Szegedy 2015,
Algorithm 1 and section 3): for x of shape (N, C, ...) the statistics of
channel c run over every axis but 1, ``n = N * H * W`` values::

    mean = sum(x) / n,   var = sum((x - mean)^2) / n          (biased)
    y    = (x - mean) / sqrt(var + eps) * weight + bias
    running_mean' = (1 - momentum) * running_mean + momentum * mean
    running_var'  = (1 - momentum) * running_var  + momentum * var * n / (n - 1)

n = 1 is an error when the graph is built (PyTorch: "Expected more than 1
value per channel when training"); n = 0 (an empty batch) gives an empty
output, zero statistics and unchanged running statistics, as PyTorch.

Design (the graph has single-output nodes; cuDNN's split):

* ``BatchNormStats``: x -> (2, C), row 0 the mean, row 1 the biased
  variance, computed once. Stored in float32 for float16/bfloat16 x
  (:func:`stats_dtype`): the sums and the statistics are fp32.
* ``BatchNormTraining(eps)``: (x, stats[, weight[, bias]]) -> y. The stats
  input must be ``BatchNormStats`` of the same x (checked by the gradient
  rules): the cotangent the rule returns for x is the *total* derivative,
  through the mean and variance too, and the stats input gets none, so the
  backward is the single fused formula below and not a chain of reductions.
* ``BatchNormRunningUpdate(statistic, momentum, count)``: (stats, running)
  -> the new running mean or variance (one node each), extra outputs a
  training step fetches. Not differentiable: no gradient flows into
  running statistics (PyTorch updates them outside autograd).
* Backward, with the saved statistics (``xhat = (x - mean) * rstd``,
  ``rstd = 1 / sqrt(var + eps)``, sums per channel):
  ``BatchNormTrainingBackwardData``: (gy, x, stats[, weight]) ->
  ``dx = weight * rstd / n * (n * gy - sum(gy) - xhat * sum(gy * xhat))``;
  ``BatchNormTrainingBackwardScale``: (x, stats, gy) -> ``dweight =
  sum(gy * xhat)``; ``dbias = sum(gy)`` is ``BiasAddBackward``.
* The fuse pass's ``bn-backward-sums`` rule computes both sums once in
  float32 and the data gradient from them (``batchnorm_sums.py``).
* Second derivatives: the data gradient is linear and self-adjoint in gy
  (d/dgy is the same op), ``d/dweight = sum(v * dx|weight=1)``, and d/dx is
  ``BatchNormTrainingDoubleBackward`` (v, gy, x, stats[, weight])::

      -weight * rstd^2 * (xhat * (mean(v gy) - mean(v) mean(gy) - 3 mean(v xhat) mean(gy xhat))
                          + (v - mean(v)) mean(gy xhat) + (gy - mean(gy)) mean(v xhat))

  (means per channel; derived by differentiating ``dx`` through mean, var
  and xhat; checked against finite differences and PyTorch's
  ``batchnorm_double_backward``). Third derivatives are not implemented.
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs

from ..errors import NotDifferentiableError, ParameterError, ShapeError
from ..op import Op, abstract_of, require_same_dtype
from ..types import HALF_DTYPES, TensorType, is_float
from . import _fields as F
from .broadcast import Mul
from .elementwise import BiasAddBackward

STATISTICS = ("mean", "var")


def stats_dtype(dtype: str) -> str:
    """The dtype batch statistics are kept in for storage ``dtype``: float32 for
    float16/bfloat16 (SEMANTICS.md: statistics and sums in fp32), else ``dtype``."""
    return "float32" if dtype in HALF_DTYPES else dtype


def channel_count(x: TensorType) -> int:
    """``n``: values per channel of x (N, C, ...): the product of every axis but 1."""
    return math.prod(x.shape[:1] + x.shape[2:])


def _check_input(op, x: TensorType) -> None:
    if x.ndim < 2:
        raise ShapeError(f"input must be (N, C, ...), got shape {x.shape}")
    if not is_float(x.dtype):
        raise ShapeError(f"{op.name}: input must be floating point, got {x.dtype}")


def _check_stats(x: TensorType, stats: TensorType) -> None:
    want = TensorType((2, x.shape[1]), stats_dtype(x.dtype))
    if (stats.shape, stats.dtype) != (want.shape, want.dtype):
        raise ShapeError(f"stats must be {want} (mean and variance of the {x.shape[1]} channels "
                         f"of input {x.shape}), got {stats}")


def _check_vectors(op, x: TensorType, named: dict) -> None:
    for what, t in named.items():
        if t.shape != (x.shape[1],):
            raise ShapeError(f"{what} shape {t.shape} != (C,) = ({x.shape[1]},) of input {x.shape}")
    require_same_dtype(op, (x, *named.values()))


def _same_as_input(op, x: TensorType, other: TensorType, what: str) -> None:
    if other.shape != x.shape:
        raise ShapeError(f"{what} shape {other.shape} != input shape {x.shape}")
    require_same_dtype(op, (x, other))


def _require_stats_of(node, x_pos: int, stats_pos: int) -> None:
    """The gradient rules take the path through the statistics themselves, so
    their stats input must be ``BatchNormStats`` of their x input."""
    x, stats = node.inputs[x_pos], node.inputs[stats_pos]
    src = node.graph.node(stats.node)
    if not (isinstance(abstract_of(src.op), BatchNormStats) and src.inputs[0].node == x.node):
        raise NotDifferentiableError(
            f"node {node.name} ({node.op.name}): its stats input {src.name} must be BatchNormStats "
            f"of its input {x.name} (the gradient through the batch statistics is taken here)")


@attrs.frozen
class BatchNormStats(Op):
    """Per-channel mean and biased variance: x (N, C, ...) -> (2, C), in :func:`stats_dtype`.

    Raises:
        ShapeError: x not (N, C, ...), not floating, or one value per channel.
    """

    family: ClassVar[str] = "norm"
    kind: ClassVar[str] = "batch_norm_stats"

    def infer(self, x):
        _check_input(self, x)
        if channel_count(x) == 1:
            raise ShapeError(f"Expected more than 1 value per channel when training, got input "
                             f"shape {x.shape} (batch statistics of one value)")
        return TensorType((2, x.shape[1]), stats_dtype(x.dtype))

    def flops(self, types, out) -> int:
        return 4 * types[0].size  # sum; subtract, square, sum

    def vjp(self, node, gy, wanted):
        raise NotDifferentiableError(
            f"node {node.name} ({self.name}): batch statistics are differentiated by the "
            f"BatchNormTraining node that reads them (its rule covers the path through mean and "
            f"variance); a gradient through another reader is not implemented")


@attrs.frozen
class BatchNormTraining(Op):
    """``(x - mean) * rstd * weight + bias``: (x, stats[, weight[, bias]]) -> x's shape.

    weight and bias are (C,), in x's dtype; absent weight is 1, absent bias 0.
    """

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (2, 4)
    family: ClassVar[str] = "norm"
    kind: ClassVar[str] = "batch_norm_training"

    def infer(self, x, stats, *affine):
        _check_input(self, x)
        _check_stats(x, stats)
        _check_vectors(self, x, dict(zip(("weight", "bias"), affine)))
        return x

    def flops(self, types, out) -> int:
        return len(types) * out.size  # subtract, scale; 1 more each for weight and bias

    def vjp(self, node, gy, wanted):
        _require_stats_of(node, 0, 1)
        x, stats, *affine = node.inputs
        g, p = node.graph, {"eps": self.eps}
        dx = g.apply(BatchNormTrainingBackwardData, p, [gy, x, stats, *affine[:1]]) if wanted[0] else None
        dw = (g.apply(BatchNormTrainingBackwardScale, p, [x, stats, gy])
              if len(affine) > 0 and wanted[2] else None)
        db = g.apply(BiasAddBackward, {}, [gy]) if len(affine) > 1 and wanted[3] else None
        return (dx, None, dw, db)[:len(node.inputs)]


@attrs.frozen
class BatchNormTrainingBackwardData(Op):
    """dL/dx of ``BatchNormTraining`` through the statistics:
    (gy, x, stats[, weight]) -> ``weight * rstd * (gy - mean(gy) - xhat * mean(gy * xhat))``."""

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (3, 4)
    family: ClassVar[str] = "norm"
    kind: ClassVar[str] = "batch_norm_training_backward_data"

    def infer(self, gy, x, stats, *weight):
        _check_input(self, x)
        _same_as_input(self, x, gy, "output gradient")
        _check_stats(x, stats)
        _check_vectors(self, x, dict(zip(("weight",), weight)))
        return gy

    def flops(self, types, out) -> int:
        return 10 * out.size

    def vjp(self, node, v, wanted):
        _require_stats_of(node, 1, 2)
        gy, x, stats, *weight = node.inputs
        g, p = node.graph, {"eps": self.eps}
        d_gy = g.apply(BatchNormTrainingBackwardData, p, [v, x, stats, *weight]) if wanted[0] else None
        d_x = (g.apply(BatchNormTrainingDoubleBackward, p, [v, gy, x, stats, *weight])
               if wanted[1] else None)
        d_w = None
        if weight and wanted[3]:
            unit = g.apply(BatchNormTrainingBackwardData, p, [gy, x, stats])
            d_w = g.apply(BiasAddBackward, {}, [g.apply(Mul, {}, [v, unit])])
        return (d_gy, d_x, None, d_w)[:len(node.inputs)]


@attrs.frozen
class BatchNormTrainingBackwardScale(Op):
    """dL/dweight of ``BatchNormTraining``: (x, stats, gy) -> ``sum(gy * xhat)`` per channel, (C,)."""

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (3, 3)
    family: ClassVar[str] = "norm"
    kind: ClassVar[str] = "batch_norm_training_backward_scale"

    def infer(self, x, stats, gy):
        _check_input(self, x)
        _check_stats(x, stats)
        _same_as_input(self, x, gy, "output gradient")
        return TensorType((x.shape[1],), x.dtype)

    def flops(self, types, out) -> int:
        return 4 * types[0].size

    def vjp(self, node, v, wanted):
        _require_stats_of(node, 0, 1)
        x, stats, gy = node.inputs
        g, p = node.graph, {"eps": self.eps}
        # sum(gy * xhat) per channel, weighted by v: d/dx is the data gradient with weight v,
        # d/dgy is xhat * v, the forward with weight v and no bias.
        d_x = g.apply(BatchNormTrainingBackwardData, p, [gy, x, stats, v]) if wanted[0] else None
        d_gy = g.apply(BatchNormTraining, p, [x, stats, v]) if wanted[2] else None
        return (d_x, None, d_gy)


@attrs.frozen
class BatchNormTrainingDoubleBackward(Op):
    """d<v, dx>/dx of ``BatchNormTrainingBackwardData`` (module docstring):
    (v, gy, x, stats[, weight]) -> x's shape. No gradient rule (third order)."""

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (4, 5)
    family: ClassVar[str] = "norm"
    kind: ClassVar[str] = "batch_norm_training_double_backward"

    def infer(self, v, gy, x, stats, *weight):
        _check_input(self, x)
        _same_as_input(self, x, v, "cotangent")
        _same_as_input(self, x, gy, "output gradient")
        _check_stats(x, stats)
        _check_vectors(self, x, dict(zip(("weight",), weight)))
        return x

    def flops(self, types, out) -> int:
        return 20 * out.size


@attrs.frozen
class BatchNormRunningUpdate(Op):
    """The new running ``statistic`` ('mean' or 'var'): (stats, running) -> running's type.

    ``(1 - momentum) * running + momentum * s``, where s is the batch mean, or
    the unbiased batch variance ``var * count / (count - 1)``; ``count`` is n,
    the values per channel. count = 0 (an empty batch) returns ``running``
    unchanged (PyTorch). Not differentiable.

    Raises:
        ParameterError: momentum outside [0, 1], count 1, an unknown statistic.
    """

    statistic: str = F.choice("statistic", STATISTICS)
    momentum: float = F.real("momentum", 0.1, lo=0.0, hi=1.0)
    count: int = F.integer("count", minimum=0)
    arity: ClassVar = (2, 2)
    family: ClassVar[str] = "norm"
    kind: ClassVar[str] = "batch_norm_running_update"

    def __attrs_post_init__(self):
        if self.count == 1:
            raise ParameterError("count", 1, "Expected more than 1 value per channel when training "
                                             "(the unbiased variance divides by count - 1)")

    def infer(self, stats, running):
        if running.ndim != 1 or not is_float(running.dtype):
            raise ShapeError(f"running {self.statistic} must be a floating (C,) vector, got {running}")
        want = (2, running.shape[0])
        if stats.shape != want or stats.dtype != stats_dtype(running.dtype):
            raise ShapeError(f"stats must be {stats_dtype(running.dtype)}[2, {running.shape[0]}] for a "
                             f"running {self.statistic} {running}, got {stats}")
        return running

    def flops(self, types, out) -> int:
        return 3 * out.size

    def vjp(self, node, gy, wanted):
        raise NotDifferentiableError(
            f"node {node.name} ({self.name}): running statistics get no gradient (PyTorch updates "
            f"them outside autograd); differentiate the batch_norm output instead")
