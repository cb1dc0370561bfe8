"""CuPy kernels of our own: softmax, log-softmax, cross-entropy and their gradients.

Mirrors ``opgraph.backends.reference.loss`` (same arguments and keyword
names) and SEMANTICS.md: numerically stable (max subtracted, log-sum-exp), so
finite logits of any magnitude give finite results; an axis of all -inf gives
NaN, as in PyTorch; a NaN propagates to its whole row. Backward ops take the
forward *output*: softmax ``gx = y * (gy - sum(gy * y))``, log-softmax
``gx = gy - exp(y) * sum(gy)``, cross-entropy
``gx = (softmax(logits) - onehot(target)) * gy`` (/ N for ``'mean'``).

The reduced axis is made the middle one of an ``(outer, C, inner)`` view of
a C-contiguous buffer; one thread owns one row (fixed ``outer``, ``inner``)
and walks its C entries with stride ``inner``, so reads are coalesced across
threads when ``inner > 1`` and rows are independent. Index math is 64-bit.
float16 computes in float32 and rounds once (whole-tensor casts). bfloat16
computes in float32 inside the kernels (no cast pass): they read and write
its uint16 bits through the ``LD``/``ST`` macros of
:func:`.storage.storage_preamble` (load exact, store rounded to
nearest even once); the cross-entropy's per-row log-sum-exp and losses are
float32, summed in float32 and rounded once to the bfloat16 result.
"""

from __future__ import annotations

import functools

from opgraph.errors import ParameterError, ShapeError

from .storage import (BF16, bits, copy, dtype_name, float_to_bf16_bits, is_bf16, kernel_tag, like,
                      storage_preamble, unbits, zeros)
from ..reference.loss import check_cross_entropy

# x, y, gy, gx are T arrays, loaded / stored through LD / ST and computed in
# CT (storage_preamble: float for bfloat16 bits, T otherwise); the
# cross-entropy's lse and loss are A arrays (CT).

# The row of thread i: origin and stride; max (NaN sticks), then the sum of exp.
_ROW = """
    const long long r = i;
    const long long base = (r / inner) * C * inner + r % inner;
    CT m = LD(x[base]);
    for (long long c = 1; c < C; ++c) { const CT v = LD(x[base + c * inner]); if (v > m || v != v) m = v; }
    CT s = 0;
    for (long long c = 0; c < C; ++c) s += exp(LD(x[base + c * inner]) - m);
"""

_SOFTMAX = _ROW + """
    for (long long c = 0; c < C; ++c) {
        const long long j = base + c * inner;
        ST(y[j], exp(LD(x[j]) - m) / s);
    }
"""
_LOG_SOFTMAX = _ROW + """
    const CT ls = log(s);
    for (long long c = 0; c < C; ++c) {
        const long long j = base + c * inner;
        ST(y[j], (LD(x[j]) - m) - ls);
    }
"""
_SOFTMAX_BWD = """
    const long long r = i;
    const long long base = (r / inner) * C * inner + r % inner;
    CT d = 0;
    for (long long c = 0; c < C; ++c) d += LD(gy[base + c * inner]) * LD(y[base + c * inner]);
    for (long long c = 0; c < C; ++c) {
        const long long j = base + c * inner;
        ST(gx[j], LD(y[j]) * (LD(gy[j]) - d));
    }
"""
_LOG_SOFTMAX_BWD = """
    const long long r = i;
    const long long base = (r / inner) * C * inner + r % inner;
    CT d = 0;
    for (long long c = 0; c < C; ++c) d += LD(gy[base + c * inner]);
    for (long long c = 0; c < C; ++c) {
        const long long j = base + c * inner;
        ST(gx[j], LD(gy[j]) - exp(LD(y[j])) * d);
    }
"""
# Cross-entropy rows (inner == 1): the loss and log-sum-exp of each row.
_CE_ROWS = _ROW + """
    lse[r] = m + log(s);
    loss[r] = m + log(s) - LD(x[base + target[r]]);
"""
_CE_BWD = """
    const long long j = i, r = j / C, c = j % C;
    const CT p = exp(LD(x[j]) - lse[r]);
    ST(gx[j], (p - (c == target[r] ? (CT)1 : (CT)0)) * (CT)(LD(gy[0]) * scale));
"""


@functools.lru_cache(maxsize=None)
def _kernel(name, in_params, out_params, body, preamble=""):
    import cupy
    return cupy.ElementwiseKernel(in_params, out_params, body, f"opgraph_{name}", preamble=preamble)


def _launch(name, storage, in_params, out_params, body):
    """The kernel ``name`` for ``T`` arrays holding ``storage`` (a dtype name):
    the LD/ST/CT macros, and ``_bf16`` in the name for bfloat16."""
    return _kernel(name + kernel_tag(storage), in_params, out_params, body, storage_preamble(storage))


def _axis(x, axis):
    if isinstance(axis, bool) or int(axis) != axis or not -x.ndim <= axis < x.ndim:
        raise ParameterError("axis", axis, f"out of range for an array of shape {tuple(x.shape)}")
    return int(axis) % x.ndim


def _rows(xp, x, axis):
    """``(buffer, C, inner, rows, storage)``: x C-contiguous in kernel storage
    (float16 converted to float32, bfloat16 as its bits) and that storage's
    dtype name."""
    buf = xp.ascontiguousarray(bits(xp, x))
    if buf.dtype == xp.float16:
        buf = buf.astype(xp.float32)
    c = x.shape[axis]
    inner = 1
    for n in x.shape[axis + 1:]:
        inner *= int(n)
    return buf, c, inner, (buf.size // c if c else 0), BF16 if is_bf16(x) else dtype_name(buf.dtype)


def _result(xp, buf, dtype):
    """A kernel's output as the caller's ``dtype`` (float16 cast back, bfloat16 viewed)."""
    return buf.astype(xp.float16) if dtype_name(dtype) == "float16" else unbits(buf, dtype)


def _row_op(xp, name, body, x, axis):
    axis = _axis(x, axis)
    if x.size == 0:
        return copy(xp, x)
    buf, c, inner, rows, storage = _rows(xp, x, axis)
    y = xp.empty_like(buf)
    _launch(name, storage, "raw T x, int64 C, int64 inner", "raw T y", body)(buf.ravel(), c, inner, y.ravel(),
                                                                             size=rows)
    return _result(xp, y, x.dtype)


def softmax(xp, x, *, axis):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``; x's shape and dtype.
    Raises ParameterError for a bad axis. Source: SEMANTICS.md."""
    return _row_op(xp, "softmax", _SOFTMAX, x, axis)


def log_softmax(xp, x, *, axis):
    """``(x - max) - log(sum(exp(x - max)))`` along ``axis``; x's shape and dtype."""
    return _row_op(xp, "log_softmax", _LOG_SOFTMAX, x, axis)


def _row_bwd(xp, name, body, y, gy, axis):
    axis = _axis(y, axis)
    if tuple(y.shape) != tuple(gy.shape):
        raise ShapeError(f"{name}: shapes differ, {y.shape} and {gy.shape}")
    if y.size == 0:
        return copy(xp, gy)
    yb, c, inner, rows, storage = _rows(xp, y, axis)
    g = xp.ascontiguousarray(like(xp, gy, storage))  # gy in y's storage (a view when dtypes agree)
    gx = xp.empty_like(yb)
    kern = _launch(name, storage, "raw T y, raw T gy, int64 C, int64 inner", "raw T gx", body)
    kern(yb.ravel(), g.ravel(), c, inner, gx.ravel(), size=rows)
    return _result(xp, gx, y.dtype)


def softmax_backward(xp, y, gy, *, axis):
    """Input gradient of softmax from its output: ``y * (gy - sum(gy * y, axis))``."""
    return _row_bwd(xp, "softmax_bwd", _SOFTMAX_BWD, y, gy, axis)


def log_softmax_backward(xp, y, gy, *, axis):
    """Input gradient of log-softmax from its output: ``gy - exp(y) * sum(gy, axis)``."""
    return _row_bwd(xp, "log_softmax_bwd", _LOG_SOFTMAX_BWD, y, gy, axis)


def _ce_rows(xp, logits, target):
    buf, c, _, n, storage = _rows(xp, logits, 1)
    t = xp.ascontiguousarray(target).astype(xp.int64, copy=False)
    acc = xp.float32 if storage == BF16 else buf.dtype
    lse, loss = xp.empty(n, dtype=acc), xp.empty(n, dtype=acc)
    _launch("ce_rows", storage, "raw T x, raw int64 target, int64 C, int64 inner", "raw A lse, raw A loss",
            _CE_ROWS)(buf.ravel(), t, c, 1, lse, loss, size=n)
    return buf, t, lse, loss, storage


def cross_entropy(xp, logits, target, *, reduction):
    """``mean``/``sum`` over the batch of ``logsumexp(logits[n]) - logits[n, target[n]]``.

    Args: logits ``(N, C)`` float; target ``(N,)`` integer in ``0 .. C-1``.
    Returns a 0-d array in logits' dtype; the mean of an empty batch is 0
    (as the reference). Raises ParameterError / ShapeError / ExecutionError as
    the reference.
    """
    check_cross_entropy(xp, logits, target, reduction)
    n = logits.shape[0]
    if n == 0 or logits.shape[1] == 0:
        return zeros(xp, (), logits.dtype)
    _, _, _, loss, storage = _ce_rows(xp, logits, target)
    total = loss.sum()
    if reduction == "mean":
        total = total / n
    if storage == BF16:
        return float_to_bf16_bits(xp, total.reshape(1)).view(logits.dtype).reshape(())
    return total.astype(logits.dtype).reshape(())


def cross_entropy_backward(xp, logits, target, gy, *, reduction):
    """``(softmax(logits) - onehot(target)) * gy`` (/ N for ``'mean'``): ``(N, C)``
    in logits' dtype. ``gy`` is the scalar output gradient (any size-1 array).
    Raises as :func:`cross_entropy`, and ShapeError if gy is not a scalar."""
    check_cross_entropy(xp, logits, target, reduction)
    if gy.size != 1:
        raise ShapeError(f"cross_entropy_backward: gy must be a scalar, got shape {gy.shape}")
    n, c = logits.shape
    if n == 0 or c == 0:
        return zeros(xp, logits.shape, logits.dtype)
    buf, t, lse, _, storage = _ce_rows(xp, logits, target)
    g = xp.ascontiguousarray(like(xp, gy.reshape(1), storage))
    gx = xp.empty_like(buf)
    kern = _launch("ce_bwd", storage, "raw T x, raw int64 target, raw A lse, raw T gy, float64 scale, int64 C",
                   "raw T gx", _CE_BWD)
    kern(buf.ravel(), t, lse, g, 1.0 / n if reduction == "mean" else 1.0, c, gx.ravel(), size=gx.size)
    return _result(xp, gx, logits.dtype)


__all__ = ["softmax", "softmax_backward", "log_softmax", "log_softmax_backward",
           "cross_entropy", "cross_entropy_backward"]
