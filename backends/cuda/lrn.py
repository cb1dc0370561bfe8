"""CuPy kernels of local response normalization across channels, forward and backward.

``y = x / (k + alpha/size * sum_{W(c)} x^2)^beta`` with the window
``c - floor((size-1)/2) .. c + ceil((size-1)/2)`` clipped, the sum divided by
``size`` everywhere (Caffe/cuDNN/ONNX; Krizhevsky et al. 2012, 3.3;
SEMANTICS.md; the NumPy reference ``opgraph.backends.reference.lrn``).

The kernels read a 4-D tensor through explicit element strides, so
channels-last input costs no transpose. Index arithmetic is 64-bit (``long
long``). float16 computes in float32 (SEMANTICS.md: half accumulates in
fp32); bfloat16 is loaded and stored inside the kernel with float32
intermediates (:mod:`.storage`).
"""

from __future__ import annotations

from opgraph.errors import ParameterError, ShapeError

from .storage import (BF16, bits, copy, dtype_name, elementwise_kernel, in_layout, is_bf16, kernel_tag, like,
                      logical, physical, same_shape, storage_preamble, unbits)


_CHANNEL = """
    const long long t = i;
    const long long c = cl ? t % C : (t / inner) % C;
    const long long sc = cl ? 1 : inner;
    const long long lo = (c - before > 0 ? c - before : 0) - c;
    const long long hi = (c + after < C - 1 ? c + after : C - 1) - c;
"""

# x, y, gy, gx are T arrays (loaded / stored through LD / ST, computed in
# CT: storage_preamble); the backward's intermediates dp, tt are A arrays,
# held in CT (float32 for bfloat16, T otherwise).
_LRN_FWD = _CHANNEL + """
    CT s = 0;
    for (long long j = lo; j <= hi; ++j) { const CT v = LD(x[t + j * sc]); s += v * v; }
    const CT d = (CT)kk + (CT)(alpha / nsize) * s;
    ST(y[t], LD(x[t]) * pow(d, (CT)(-beta)));
"""

_LRN_BWD1 = _CHANNEL + """
    CT s = 0;
    for (long long j = lo; j <= hi; ++j) { const CT v = LD(x[t + j * sc]); s += v * v; }
    const CT d = (CT)kk + (CT)(alpha / nsize) * s;
    const CT p = pow(d, (CT)(-beta));
    dp[t] = p;
    tt[t] = LD(gy[t]) * LD(x[t]) * p / d;
"""

# The transposed window: j is in W(c) iff c is in j - after .. j + before.
_LRN_BWD2 = _CHANNEL.replace("c - before", "c - after").replace("c + after", "c + before") + """
    CT s = 0;
    for (long long j = lo; j <= hi; ++j) s += tt[t + j * sc];
    ST(gx[t], LD(gy[t]) * dp[t] - (CT)(2.0 * alpha * beta / nsize) * LD(x[t]) * s);
"""

_LRN_PARAMS = ("int64 C, int64 inner, bool cl, int64 before, int64 after, float64 alpha, "
               "float64 beta, float64 kk, float64 nsize")


def _lrn_check(x, size):
    if isinstance(size, bool) or int(size) != size or size < 1:
        raise ParameterError("size", size, "must be an int >= 1")
    if x.ndim < 2:
        raise ShapeError(f"local_response_norm: x must be (N, C, ...), got shape {x.shape}")


def _lrn_setup(xp, x, size, k):
    """Physical buffer in kernel storage (float16 converted to float32,
    bfloat16 as its bits), the storage's dtype name, and the kernel's scalar
    params."""
    buf, cl = physical(xp, bits(xp, x))
    storage = BF16 if is_bf16(x) else ("float32" if x.dtype == xp.float16 else dtype_name(x.dtype))
    if storage != BF16:
        buf = buf.astype(storage, copy=False)
    size = int(size)
    inner = 1
    for n in x.shape[2:]:
        inner *= int(n)
    return buf, cl, storage, (x.shape[1], inner, cl, (size - 1) // 2, size // 2), float(k), size


def _lrn_result(xp, buf, cl, dtype):
    """A kernel's output buffer as the caller's ``dtype`` in x's layout."""
    out = logical(buf, cl)
    return unbits(out, dtype) if dtype_name(dtype) == BF16 else out.astype(dtype, copy=False)


def local_response_norm(xp, x, *, size, alpha, beta, k):
    """LRN across channels of ``(N, C, ...)`` x (module docstring formula).

    Returns x's shape, dtype and layout. Raises ParameterError (size) or
    ShapeError (fewer than 2 dims). Source: SEMANTICS.md; reference ``lrn.py``.
    """
    _lrn_check(x, size)
    if x.size == 0:
        return copy(xp, x)
    buf, cl, storage, geo, kk, size = _lrn_setup(xp, x, size, k)
    kern = elementwise_kernel("lrn_fwd" + kernel_tag(storage), "raw T x, " + _LRN_PARAMS, "raw T y", _LRN_FWD,
               storage_preamble(storage))
    y = xp.empty_like(buf)
    kern(buf.ravel(), *geo, float(alpha), float(beta), kk, float(size), y.ravel(), size=buf.size)
    return _lrn_result(xp, y, cl, x.dtype)


def local_response_norm_backward(xp, x, gy, *, size, alpha, beta, k):
    """Input gradient of :func:`local_response_norm` (exact):
    ``gx_j = gy_j d_j^-beta - 2 alpha beta/size x_j sum_{c: j in W(c)} gy_c x_c d_c^(-beta-1)``.

    Two passes: per cell ``d^-beta`` and ``gy x d^(-beta-1)``, then the
    transposed window sum (intermediates in float32 for bfloat16). Returns x's
    shape, dtype and layout.
    """
    _lrn_check(x, size)
    same_shape("local_response_norm_backward", x, gy)
    if x.size == 0:
        return copy(xp, gy)
    buf, cl, storage, geo, kk, size = _lrn_setup(xp, x, size, k)
    g = in_layout(xp, like(xp, gy, storage), cl)
    mid = xp.float32 if storage == BF16 else buf.dtype
    dp, tt, gx = xp.empty_like(buf, dtype=mid), xp.empty_like(buf, dtype=mid), xp.empty_like(buf)
    pre, tag = storage_preamble(storage), kernel_tag(storage)
    k1 = elementwise_kernel("lrn_bwd1" + tag, "raw T x, raw T gy, " + _LRN_PARAMS, "raw A dp, raw A tt", _LRN_BWD1, pre)
    k1(buf.ravel(), g.ravel(), *geo, float(alpha), float(beta), kk, float(size), dp.ravel(), tt.ravel(),
       size=buf.size)
    k2 = elementwise_kernel("lrn_bwd2" + tag, "raw T x, raw T gy, raw A dp, raw A tt, " + _LRN_PARAMS, "raw T gx",
             _LRN_BWD2, pre)
    k2(buf.ravel(), g.ravel(), dp.ravel(), tt.ravel(), *geo, float(alpha), float(beta), kk, float(size),
       gx.ravel(), size=buf.size)
    return _lrn_result(xp, gx, cl, x.dtype)


__all__ = ["local_response_norm", "local_response_norm_backward"]
