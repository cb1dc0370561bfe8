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
float16 computes in float32 and rounds once.
"""

from __future__ import annotations

import functools

from opgraph.errors import ParameterError, ShapeError

from .reference.loss import check_cross_entropy

# The row of thread i: origin and stride; max (NaN sticks), then the sum of exp.
_ROW = """
    const long long r = i;
    const long long base = (r / inner) * C * inner + r % inner;
    T m = x[base];
    for (long long c = 1; c < C; ++c) { const T v = x[base + c * inner]; if (v > m || v != v) m = v; }
    T s = 0;
    for (long long c = 0; c < C; ++c) s += exp(x[base + c * inner] - m);
"""

_SOFTMAX = _ROW + """
    for (long long c = 0; c < C; ++c) { const long long j = base + c * inner; y[j] = exp(x[j] - m) / s; }
"""
_LOG_SOFTMAX = _ROW + """
    const T ls = log(s);
    for (long long c = 0; c < C; ++c) { const long long j = base + c * inner; y[j] = (x[j] - m) - ls; }
"""
_SOFTMAX_BWD = """
    const long long r = i;
    const long long base = (r / inner) * C * inner + r % inner;
    T d = 0;
    for (long long c = 0; c < C; ++c) d += gy[base + c * inner] * y[base + c * inner];
    for (long long c = 0; c < C; ++c) { const long long j = base + c * inner; gx[j] = y[j] * (gy[j] - d); }
"""
_LOG_SOFTMAX_BWD = """
    const long long r = i;
    const long long base = (r / inner) * C * inner + r % inner;
    T d = 0;
    for (long long c = 0; c < C; ++c) d += gy[base + c * inner];
    for (long long c = 0; c < C; ++c) { const long long j = base + c * inner; gx[j] = gy[j] - exp(y[j]) * d; }
"""
# Cross-entropy rows (inner == 1): the loss and log-sum-exp of each row.
_CE_ROWS = _ROW + """
    lse[r] = m + log(s);
    loss[r] = m + log(s) - x[base + target[r]];
"""
_CE_BWD = """
    const long long j = i, r = j / C, c = j % C;
    const T p = exp(x[j] - lse[r]);
    gx[j] = (p - (c == target[r] ? (T)1 : (T)0)) * (T)(gy[0] * scale);
"""


@functools.lru_cache(maxsize=None)
def _kernel(name, in_params, out_params, body):
    import cupy
    return cupy.ElementwiseKernel(in_params, out_params, body, f"opgraph_{name}")


def _axis(x, axis):
    if isinstance(axis, bool) or int(axis) != axis or not -x.ndim <= axis < x.ndim:
        raise ParameterError("axis", axis, f"out of range for an array of shape {tuple(x.shape)}")
    return int(axis) % x.ndim


def _rows(xp, x, axis):
    """``(buffer, C, inner, rows, half)``: x C-contiguous in its compute dtype."""
    buf = xp.ascontiguousarray(x)
    half = buf.dtype == xp.float16
    if half:
        buf = buf.astype(xp.float32)
    c = x.shape[axis]
    inner = 1
    for n in x.shape[axis + 1:]:
        inner *= int(n)
    return buf, c, inner, (buf.size // c if c else 0), half


def _row_op(xp, name, body, x, axis):
    axis = _axis(x, axis)
    if x.size == 0:
        return x.copy()
    buf, c, inner, rows, half = _rows(xp, x, axis)
    y = xp.empty_like(buf)
    _kernel(name, "raw T x, int64 C, int64 inner", "raw T y", body)(buf.ravel(), c, inner, y.ravel(), size=rows)
    return y.astype(xp.float16) if half else y


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
        return gy.copy()
    yb, c, inner, rows, half = _rows(xp, y, axis)
    g = xp.ascontiguousarray(gy).astype(yb.dtype, copy=False)
    gx = xp.empty_like(yb)
    kern = _kernel(name, "raw T y, raw T gy, int64 C, int64 inner", "raw T gx", body)
    kern(yb.ravel(), g.ravel(), c, inner, gx.ravel(), size=rows)
    return gx.astype(xp.float16) if half else gx


def softmax_backward(xp, y, gy, *, axis):
    """Input gradient of softmax from its output: ``y * (gy - sum(gy * y, axis))``."""
    return _row_bwd(xp, "softmax_bwd", _SOFTMAX_BWD, y, gy, axis)


def log_softmax_backward(xp, y, gy, *, axis):
    """Input gradient of log-softmax from its output: ``gy - exp(y) * sum(gy, axis)``."""
    return _row_bwd(xp, "log_softmax_bwd", _LOG_SOFTMAX_BWD, y, gy, axis)


def _ce_rows(xp, logits, target):
    buf, c, _, n, half = _rows(xp, logits, 1)
    t = xp.ascontiguousarray(target).astype(xp.int64, copy=False)
    lse, loss = xp.empty(n, dtype=buf.dtype), xp.empty(n, dtype=buf.dtype)
    _kernel("ce_rows", "raw T x, raw int64 target, int64 C, int64 inner", "raw T lse, raw T loss",
            _CE_ROWS)(buf.ravel(), t, c, 1, lse, loss, size=n)
    return buf, t, lse, loss, half


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
        return xp.zeros((), dtype=logits.dtype)
    _, _, _, loss, _ = _ce_rows(xp, logits, target)
    total = loss.sum()
    if reduction == "mean":
        total = total / n
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
        return xp.zeros(logits.shape, dtype=logits.dtype)
    buf, t, lse, _, half = _ce_rows(xp, logits, target)
    g = xp.ascontiguousarray(gy.reshape(1)).astype(buf.dtype, copy=False)
    gx = xp.empty_like(buf)
    _kernel("ce_bwd", "raw T x, raw int64 target, raw T lse, raw T gy, float64 scale, int64 C",
            "raw T gx", _CE_BWD)(buf.ravel(), t, lse, g, 1.0 / n if reduction == "mean" else 1.0, c, gx.ravel(),
                                 size=gx.size)
    return gx.astype(xp.float16) if half else gx


__all__ = ["softmax", "softmax_backward", "log_softmax", "log_softmax_backward",
           "cross_entropy", "cross_entropy_backward"]
