"""The training batch norm's backward from its two per-channel sums: the ops
the fuse pass's ``bn-backward-sums`` rule makes (``passes/fuse_bn_backward.py``),
never a builder.

The backward of ``BatchNormTraining(x, stats, weight, bias)`` needs, per
channel c over the ``n`` values of every axis but 1 (Ioffe & Szegedy 2015,
§3; ``batchnorm_training.py``), ``xhat = (x - mean) * rstd``::

    sum_gy      = sum(gy)            (= dbias)
    sum_gy_xhat = sum(gy * xhat)     (= dweight)
    dx          = weight * rstd * (gy - sum_gy / n - xhat * sum_gy_xhat / n)

Unfused, ``BiasAddBackward``, ``BatchNormTrainingBackwardScale`` and
``BatchNormTrainingBackwardData`` each reduce gy again (8 passes over the
tensors). Here:

* ``BatchNormTrainingBackwardSums(eps)``: (x, stats, gy) -> (2, C), row 0
  ``sum_gy``, row 1 ``sum_gy_xhat``, in :func:`stats_dtype` (float32 for
  half storage): one pass reading x and gy;
* ``BatchNormBackwardSumsRow(row)``: (sums, x) -> one row rounded to x's
  (the storage) dtype, the parameter gradients dbias (row 0) and dweight (row 1);
* ``BatchNormTrainingBackwardDataFromSums(eps)``: (gy, x, stats, sums[,
  weight]) -> dx, one element-wise pass reading gy and x.

5 passes in all. The sums stay in float32 for bfloat16/float16 storage,
as the unfused data gradient keeps them: rounded to bf16 (2^-9) they put dx
at 0.16 relative error where gy is nearly ``a + b * xhat`` per channel
(tests/passes/test_fuse_bn_backward.py, the cancellation case).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import NotDifferentiableError, ShapeError
from ..op import Op
from ..types import TensorType
from . import _fields as F
from .batchnorm_training import (_check_input, _check_stats, _check_vectors, _same_as_input, stats_dtype)

#: The rows of the stacked sums, by what they hold.
SUM_GY, SUM_GY_XHAT = 0, 1


def _check_sums(x: TensorType, sums: TensorType) -> None:
    want = TensorType((2, x.shape[1]), stats_dtype(x.dtype))
    if (sums.shape, sums.dtype) != (want.shape, want.dtype):
        raise ShapeError(f"sums must be {want} (sum(gy) and sum(gy * xhat) of the {x.shape[1]} channels "
                         f"of input {x.shape}), got {sums}")


def _made_by_the_fuse_pass(node, op) -> NotDifferentiableError:
    return NotDifferentiableError(
        f"node {node.name} ({op.name}): made by the fuse pass after grad (bn-backward-sums), "
        f"it has no gradient rule; differentiate the graph before compiling it")


@attrs.frozen
class BatchNormTrainingBackwardSums(Op):
    """Per-channel ``[sum(gy); sum(gy * xhat)]``: (x, stats, gy) -> (2, C) in
    :func:`stats_dtype` (float32 for half x), ``xhat = (x - mean) / sqrt(var + eps)``
    from the stats rows (module docstring).

    Raises:
        ShapeError: x not (N, C, ...) floating, stats not (2, C) in
            :func:`stats_dtype`, gy not of x's shape and dtype.
    """

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (3, 3)
    family: ClassVar[str] = "norm"
    fused: ClassVar[bool] = True
    kind: ClassVar[str] = "batch_norm_training_backward_sums"

    def infer(self, x, stats, gy):
        _check_input(self, x)
        _check_stats(x, stats)
        _same_as_input(self, x, gy, "output gradient")
        return TensorType((2, x.shape[1]), stats_dtype(x.dtype))

    def flops(self, types, out) -> int:
        return 5 * types[0].size  # xhat (2), gy * xhat (1), two sums (2)

    def vjp(self, node, v, wanted):
        raise _made_by_the_fuse_pass(node, self)


@attrs.frozen
class BatchNormBackwardSumsRow(Op):
    """Row ``row`` of :class:`BatchNormTrainingBackwardSums`' output rounded to
    the storage dtype: (sums, like) -> (C,) in like's dtype; row 0 is dbias,
    row 1 dweight. ``like`` (the batch norm's input x, (N, C, ...)) is not
    read: it carries the storage dtype, which the float32 sums do not, also
    where ``compile(dtype=...)`` overrides it (``opgraph/run_types.py`` infers
    each node's dtype from its inputs'). It is x rather than gy so that gy's
    last reader stays the data gradient, which may then overwrite gy in place.

    Raises:
        ParameterError: row not 0 or 1.
        ShapeError: like not (N, C, ...) floating, sums not (2, C) in
            :func:`stats_dtype` of like's dtype.
    """

    row: int = F.choice("row", (SUM_GY, SUM_GY_XHAT))
    arity: ClassVar = (2, 2)
    unread_inputs: ClassVar = (1,)  # like: its dtype only
    family: ClassVar[str] = "norm"
    fused: ClassVar[bool] = True
    kind: ClassVar[str] = "batch_norm_backward_sums_row"

    def infer(self, sums, like):
        _check_input(self, like)
        _check_sums(like, sums)
        return TensorType((like.shape[1],), like.dtype)

    def flops(self, types, out) -> int:
        return 0  # a rounding copy

    def vjp(self, node, v, wanted):
        raise _made_by_the_fuse_pass(node, self)


@attrs.frozen
class BatchNormTrainingBackwardDataFromSums(Op):
    """``BatchNormTrainingBackwardData`` given the per-channel sums (Ioffe & Szegedy 2015, §3):
    (gy, x, stats, sums[, weight]) -> ``dx``, gy's shape and dtype, with

        dx = weight * rstd * (gy - sums[0] / n - xhat * sums[1] / n)

    ``n`` the values per channel (``channel_count``), ``xhat = (x - mean) *
    rstd`` from the stats rows, ``sums`` the (2, C) output of
    :class:`BatchNormTrainingBackwardSums` (float32 for half storage). The
    unfused formula scales gy by weight before its two sums; weight is one
    number per channel, so it factors out of both and the sums here are those
    of the unscaled gy, which are also the bias and weight gradients. Absent
    weight is 1.

    Raises:
        ShapeError: x not (N, C, ...) floating, gy not of x's shape, stats or
            sums not (2, C) in :func:`stats_dtype`, weight not (C,), mixed dtypes.
    """

    eps: float = F.real("eps", 1e-5, lo=0.0)
    arity: ClassVar = (4, 5)
    family: ClassVar[str] = "norm"
    fused: ClassVar[bool] = True
    kind: ClassVar[str] = "batch_norm_training_backward_data_from_sums"

    def infer(self, gy, x, stats, sums, *weight):
        _check_input(self, x)
        _same_as_input(self, x, gy, "output gradient")
        _check_stats(x, stats)
        _check_sums(x, sums)
        _check_vectors(self, x, dict(zip(("weight",), weight)))
        return gy

    def flops(self, types, out) -> int:
        return 6 * out.size  # xhat (2), two scaled sums subtracted (3), the factor (1)

    def vjp(self, node, v, wanted):
        raise _made_by_the_fuse_pass(node, self)


__all__ = ["SUM_GY", "SUM_GY_XHAT", "BatchNormTrainingBackwardSums", "BatchNormBackwardSumsRow",
           "BatchNormTrainingBackwardDataFromSums"]
