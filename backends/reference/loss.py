"""Reference (oracle) softmax, log-softmax and cross-entropy, forward and backward.

All are numerically stable (SEMANTICS.md, Others): the maximum along the axis
is subtracted before ``exp``, and log-softmax / cross-entropy use
log-sum-exp, so finite logits of any size (1e30, -1e30) give finite results.
An axis of all ``-inf`` gives NaN (no class has any mass), as in PyTorch.
fp16 computes in fp32 and rounds once.

Backward kernels take the forward *output* (softmax ``y`` or log-softmax
``y``), which is what the ops carry, and use the standard identities:
softmax ``gx = y * (gy - sum(gy * y))``; log-softmax
``gx = gy - exp(y) * sum(gy)``; cross-entropy
``gx = (softmax(logits) - onehot(target)) * gy / (N if mean else 1)``.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.errors import ExecutionError, ParameterError, ShapeError
from opgraph.types import compute_dtype

from .kernel import reference

REDUCTIONS = ("mean", "sum")


def _axis(x, axis):
    if isinstance(axis, bool) or int(axis) != axis or not -x.ndim <= axis < x.ndim:
        raise ParameterError("axis", axis, f"out of range for an array of shape {tuple(x.shape)}")
    return int(axis) % x.ndim


@reference(ops.Softmax)
def softmax(xp, x, *, axis):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``.

    Returns x's shape and dtype. Raises ParameterError for a bad axis.
    """
    axis = _axis(x, axis)
    if x.shape[axis] == 0:
        return x.copy()
    xa = x.astype(compute_dtype(xp, x.dtype), copy=False)
    e = xp.exp(xa - xa.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


@reference(ops.SoftmaxBackward)
def softmax_backward(xp, y, gy, *, axis):
    """Input gradient of :func:`softmax` from its output ``y``:
    ``y * (gy - sum(gy * y, axis))``. Returns gy's shape, y's dtype."""
    axis = _axis(y, axis)
    _same("softmax_backward", y, gy)
    dt = compute_dtype(xp, y.dtype)
    ya, ga = y.astype(dt, copy=False), gy.astype(dt, copy=False)
    return (ya * (ga - (ga * ya).sum(axis=axis, keepdims=True))).astype(y.dtype, copy=False)


@reference(ops.LogSoftmax)
def log_softmax(xp, x, *, axis):
    """``x - logsumexp(x, axis)`` (max-subtracted). Returns x's shape and dtype."""
    axis = _axis(x, axis)
    if x.shape[axis] == 0:
        return x.copy()
    xa = x.astype(compute_dtype(xp, x.dtype), copy=False)
    m = xa.max(axis=axis, keepdims=True)
    # (x - m) - log(sum exp(x - m)): subtracting m first keeps huge logits exact.
    s = xa - m
    return (s - xp.log(xp.exp(s).sum(axis=axis, keepdims=True))).astype(x.dtype, copy=False)


@reference(ops.LogSoftmaxBackward)
def log_softmax_backward(xp, y, gy, *, axis):
    """Input gradient of :func:`log_softmax` from its output ``y``:
    ``gy - exp(y) * sum(gy, axis)``. Returns gy's shape, y's dtype."""
    axis = _axis(y, axis)
    _same("log_softmax_backward", y, gy)
    dt = compute_dtype(xp, y.dtype)
    ya, ga = y.astype(dt, copy=False), gy.astype(dt, copy=False)
    return (ga - xp.exp(ya) * ga.sum(axis=axis, keepdims=True)).astype(y.dtype, copy=False)


def check_cross_entropy(xp, logits, target, reduction):
    """The argument checks of cross-entropy (shared with the CUDA kernels); the
    target range is read back in one transfer (one device synchronisation on
    CuPy), since an out-of-range class is a user error, not a wrong number.

    Raises:
        ParameterError: unknown reduction. ShapeError: bad shapes or dtype.
        ExecutionError: a target class outside ``0..C-1``.
    """
    if reduction not in REDUCTIONS:
        raise ParameterError("reduction", reduction, f"must be one of {REDUCTIONS}")
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must be (N, C), got shape {logits.shape}")
    if tuple(target.shape) != (logits.shape[0],):
        raise ShapeError(f"cross_entropy: target must have shape ({logits.shape[0]},), got {target.shape}")
    if target.dtype.kind not in "iu":
        raise ShapeError(f"cross_entropy: target must hold integer class indices, got dtype {target.dtype}")
    if target.size:
        lo, hi = (int(v) for v in xp.stack([target.min(), target.max()]).tolist())
        if lo < 0 or hi >= logits.shape[1]:
            bad = lo if lo < 0 else hi
            raise ExecutionError(f"cross_entropy: target holds class {bad}, outside 0..{logits.shape[1] - 1}")


@reference(ops.CrossEntropy)
def cross_entropy(xp, logits, target, *, reduction):
    """Cross-entropy of logits against integer class targets.

    ``loss_n = logsumexp(logits[n]) - logits[n, target[n]]``, computed as
    ``log(sum(exp(s))) - s[target]`` with ``s = logits[n] - max``, then the mean
    (``reduction='mean'``) or sum over the batch. The mean of an empty batch
    is defined as 0 (PyTorch gives NaN) so batch-size-0 graphs run and
    compare cleanly.

    Args:
        logits: ``(N, C)`` float; target: ``(N,)`` integer in ``0 .. C-1``.
        reduction: ``'mean'`` or ``'sum'``.

    Returns:
        a 0-d array (shape ``()``) in logits' dtype.

    Raises:
        ParameterError: unknown reduction. ShapeError: bad shapes or a
        non-integer target. ExecutionError: a target class out of range.

    Source: ``torch.nn.functional.cross_entropy`` (no weights, no ignore_index,
    no label smoothing).
    """
    check_cross_entropy(xp, logits, target, reduction)
    n = logits.shape[0]
    la = logits.astype(compute_dtype(xp, logits.dtype), copy=False)
    if n:
        # log(sum exp(s)) - s[target] with s = x - max: subtracting the max from
        # the picked logit too keeps the O(1) part (e.g. log C for equal huge
        # logits), which ``lse(x) - x[target]`` would lose to absorption.
        s = la - la.max(axis=1, keepdims=True)
        picked = xp.take_along_axis(s, target.astype(xp.int64)[:, None], axis=1)
        total = (xp.log(xp.exp(s).sum(axis=1, keepdims=True)) - picked).sum()
    else:
        total = xp.zeros((), la.dtype)
    if reduction == "mean":
        total = total / max(n, 1)
    return xp.asarray(total, dtype=logits.dtype).reshape(())


@reference(ops.CrossEntropyBackward)
def cross_entropy_backward(xp, logits, target, gy, *, reduction):
    """Gradient of :func:`cross_entropy` with respect to the logits.

    ``(softmax(logits) - onehot(target)) * gy``, divided by N for ``'mean'``.

    Args:
        logits: ``(N, C)``; target: ``(N,)`` int; gy: the scalar output
            gradient (shape ``()``, or any size-1 array).

    Returns:
        ``(N, C)`` in logits' dtype.

    Raises:
        as :func:`cross_entropy`; ShapeError if gy is not a scalar.
    """
    check_cross_entropy(xp, logits, target, reduction)
    if gy.size != 1:
        raise ShapeError(f"cross_entropy_backward: gy must be a scalar, got shape {gy.shape}")
    n, c = logits.shape
    dt = compute_dtype(xp, logits.dtype)
    p = softmax(xp, logits.astype(dt, copy=False), axis=1)
    onehot = xp.arange(c)[None, :] == target.astype(xp.int64)[:, None]
    g = (p - onehot) * gy.astype(dt).reshape(())
    if reduction == "mean":
        g = g / max(n, 1)
    return g.astype(logits.dtype, copy=False)


def _same(what, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{what}: shapes differ, {a.shape} and {b.shape}")


__all__ = ["softmax", "softmax_backward", "log_softmax", "log_softmax_backward",
           "cross_entropy", "cross_entropy_backward"]
