"""CuPy kernels of our own: ReLU, threshold, bias gradient (column sums), local
response norm, bfloat16 casts.

Each public function mirrors its NumPy reference in
``opgraph.backends.reference`` (same positional arrays, same keyword names as
the op fields) and follows ``shared/design/SEMANTICS.md``:

* ReLU ``max(x, 0)`` with NaN propagating; its gradient is ``gy`` where
  ``x > 0``, else 0 (0 at exactly 0 and at NaN) -- a select, so an infinite
  ``gy`` at a blocked cell gives 0, not NaN;
* threshold ``x if x > threshold else value`` (``torch.nn.functional.threshold``);
* bias gradient: the sum of ``gy`` over every axis but 1; channels-last input
  is an ``(N*H*W, C)`` matrix whose column sums a two-pass raw kernel takes
  (:func:`column_sums`: deterministic, no atomics, no cuBLAS, so it can be
  captured into a CUDA graph);
* LRN across channels ``y = x / (k + alpha/size * sum_{W(c)} x^2)^beta`` with
  the window ``c - floor((size-1)/2) .. c + ceil((size-1)/2)`` clipped, the sum
  divided by ``size`` everywhere (Caffe/cuDNN/ONNX; Krizhevsky et al. 2012, 3.3).

Element-wise kernels keep the input's memory layout (NCHW or NHWC views);
the LRN kernels read a 4-D tensor through explicit element strides, so
channels-last input costs no transpose. Index arithmetic is 64-bit (``long
long``). float16 LRN computes in float32 (SEMANTICS.md: half accumulates in
fp32); the column sums read float16 directly and accumulate in float32.
Kernels compile on first use (NVRTC) and are cached by CuPy (element-wise
kernels) or here, per dtype (the column-sum module).
"""

from __future__ import annotations

import functools

from opgraph.errors import ParameterError, ShapeError
from opgraph.types import is_channels_last


@functools.lru_cache(maxsize=None)
def _ew(name: str, in_params: str, out_params: str, code: str):
    import cupy
    return cupy.ElementwiseKernel(in_params, out_params, code, f"opgraph_{name}")


def _zero(xp, a):
    return xp.zeros((), dtype=a.dtype)


def _same(what, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{what}: shapes differ, {a.shape} and {b.shape}")


def _memory_order(*arrays):
    """Views that index memory in order, and the map back to logical NCHW.

    A channels-last 4-D tensor is an NCHW-shaped view with strides
    ``(HWC, 1, WC, C)``; an element-wise kernel over such views pays a
    division per axis per element. When every operand is channels-last, the
    kernel runs over their NHWC (C-contiguous) views instead.
    """
    if all(is_channels_last(a) for a in arrays):
        return [a.transpose(0, 2, 3, 1) for a in arrays], lambda y: y.transpose(0, 3, 1, 2)
    return list(arrays), lambda y: y


# The zero is a literal, not a 0-d array argument: a broadcast operand can
# keep CuPy off its flat contiguous indexing path.
def relu(xp, x):
    """``max(x, 0)``, NaN propagating; any shape and float dtype, layout kept."""
    k = _ew("relu", "T x", "T y", "y = (x > (T)0 || x != x) ? x : (T)0")
    (xm,), back = _memory_order(x)
    return back(k(xm, xp.empty_like(xm)))


def relu_backward(xp, x, gy):
    """``gy`` where ``x > 0``, else 0 (gradient 0 at exactly 0 and at NaN)."""
    _same("relu_backward", x, gy)
    k = _ew("relu_bwd", "T x, G gy", "G gx", "gx = (x > (T)0) ? gy : (G)0")
    (xm, gm), back = _memory_order(x, gy)
    return back(k(xm, gm, xp.empty_like(gm)))


def threshold(xp, x, *, threshold, value):
    """``x if x > threshold else value``; a NaN input propagates. The two
    constants are rounded to x's dtype first, as NumPy compares."""
    k = _ew("threshold", "T x, T t, T v", "T y", "y = (x <= t) ? v : x")
    (xm,), back = _memory_order(x)
    return back(k(xm, xp.asarray(threshold, dtype=x.dtype), xp.asarray(value, dtype=x.dtype),
                  xp.empty_like(xm)))


def threshold_backward(xp, x, gy, *, threshold):
    """``gy`` where ``x > threshold``, else 0."""
    _same("threshold_backward", x, gy)
    k = _ew("threshold_bwd", "T x, T t, G gy, G z", "G gx", "gx = (x > t) ? gy : z")
    (xm, gm), back = _memory_order(x, gy)
    return back(k(xm, xp.asarray(threshold, dtype=x.dtype), gm, _zero(xp, gy), xp.empty_like(gm)))


#: NCHW bias gradients smaller than this (elements) use a CuPy sum: measured
#: 0.06-0.12 ms against 0.19-0.24 ms for the products on GoogLeNet's 1.6-4.8 M
#: element gradients; 1.6 ms against 0.27 ms at 103 M (H200, 2026-11-30).
BIAS_GRAD_SUM_BELOW = 16 * 2 ** 20

#: ``method`` of :func:`bias_add_backward` for channels-last input: our
#: column-sum kernel (the default; capturable into a CUDA graph) or one cuBLAS
#: matrix-vector product (not capturable; kept as an autotune variant).
BIAS_GRAD_METHODS = ("columns", "gemv")

# ------------------------------------------------------------------ column sums

#: Pass-1 geometry of :func:`column_sums`: a block of (32, 8) threads covers 32
#: columns; its 8 rows of threads read every 8th row of the block's chunk.
COLSUM_BLOCK = (32, 8)
#: About this many pass-1 blocks in all (an H200 keeps 132 SMs x 8 blocks of
#: 256 threads resident) ...
COLSUM_BLOCKS = 1024
#: ... and at most one block row per this many rows (8 per thread row).
COLSUM_MIN_ROWS = 64

#: numpy dtype name -> (storage type, accumulator type) in the CUDA source.
#: float16 is stored as its bit pattern (``unsigned short``) and converted by
#: PTX ``cvt``, as ``__half2float``/``__float2half`` do, so the source needs no
#: ``cuda_fp16.h`` (which NVRTC does not always find).
_COLSUM_TYPES = {"float16": ("unsigned short", "float"), "float32": ("float", "float"),
                 "float64": ("double", "double")}

_COLSUM_HELPERS = r"""
__device__ __forceinline__ float opgraph_load(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float opgraph_load(float v) { return v; }
__device__ __forceinline__ double opgraph_load(double v) { return v; }
__device__ __forceinline__ void opgraph_store(unsigned short* p, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    *p = h;
}
__device__ __forceinline__ void opgraph_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void opgraph_store(double* p, double v) { *p = v; }
"""

# Block (blockIdx.x, blockIdx.y) sums columns blockIdx.x*32 .. +31 over rows
# [blockIdx.y*rows_per_block, min(+rows_per_block, M)) of the C-contiguous
# (M, C) matrix src; thread (tx, ty) takes column c = blockIdx.x*32 + tx, rows
# ty, ty+8, ... of the chunk (a warp reads 32 adjacent elements of one row),
# then thread row 0 adds the 8 partial sums in a fixed order (deterministic)
# and writes dst[blockIdx.y*C + c]. Threads past the last column still reach
# __syncthreads. Indices are 64-bit: M*C may exceed 2^31.
_COLSUM_KERNEL = r"""
extern "C" __global__ void opgraph_colsum_NAME(const IN_T* __restrict__ src, OUT_T* __restrict__ dst,
                                               const long long M, const long long C,
                                               const long long rows_per_block) {
    __shared__ ACC part[8][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long c = (long long)blockIdx.x * 32 + tx;
    const long long r0 = (long long)blockIdx.y * rows_per_block;
    const long long r1 = (r0 + rows_per_block < M) ? r0 + rows_per_block : M;
    ACC s = 0;
    if (c < C) {
        for (long long r = r0 + ty; r < r1; r += 8) s += opgraph_load(src[r * C + c]);
    }
    part[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int k = 1; k < 8; ++k) s += part[k][tx];
        opgraph_store(dst + (long long)blockIdx.y * C + c, s);
    }
}
"""


def colsum_source(dtype: str) -> str:
    """CUDA source of the column-sum kernels for ``dtype`` (``'float16'``,
    ``'float32'`` or ``'float64'``): ``opgraph_colsum_part`` (dtype -> the
    accumulator type: pass 1), ``opgraph_colsum_final`` (accumulator -> dtype:
    pass 2) and ``opgraph_colsum_direct`` (dtype -> dtype: a single pass), each
    ``(src, dst, long long M, long long C, long long rows_per_block)``.
    Raises KeyError for another dtype."""
    store, acc = _COLSUM_TYPES[dtype]
    kernels = [_COLSUM_KERNEL.replace("NAME", name).replace("IN_T", a).replace("OUT_T", b)
               for name, a, b in (("part", store, acc), ("final", acc, store), ("direct", store, store))]
    return f"typedef {acc} ACC;\n" + _COLSUM_HELPERS + "".join(kernels)


@functools.lru_cache(maxsize=None)
def _colsum_kernels(dtype: str) -> dict:
    """``{'part', 'final', 'direct'}`` -> compiled kernel for ``dtype`` (one
    NVRTC module per dtype, built on first use)."""
    import cupy
    module = cupy.RawModule(code=colsum_source(dtype))
    return {name: module.get_function(f"opgraph_colsum_{name}") for name in ("part", "final", "direct")}


def colsum_grid(m: int, c: int) -> tuple[int, int]:
    """``(R, rows_per_block)`` of :func:`column_sums` on an ``(m, c)`` matrix,
    ``m, c >= 1``: pass 1 runs ``(ceil(c/32), R)`` blocks, block row ``y``
    summing rows ``[y*rows_per_block, min((y+1)*rows_per_block, m))``.

    ``R = max(1, min(ceil(m/64), max(1, 1024 // ceil(c/32))))``: at most
    about :data:`COLSUM_BLOCKS` blocks in all and one block row per
    :data:`COLSUM_MIN_ROWS` rows; one block row (a single pass) when
    ``m <= 64`` or ``c > 32 * 512``. ``rows_per_block = ceil(m/R)``, and R is
    then trimmed to ``ceil(m/rows_per_block)`` so that no chunk is empty.
    """
    col_tiles = -(-c // COLSUM_BLOCK[0])
    r = max(1, min(-(-m // COLSUM_MIN_ROWS), max(1, COLSUM_BLOCKS // col_tiles)))
    rows_per_block = -(-m // r)
    return -(-m // rows_per_block), rows_per_block


def column_sums(xp, a):
    """Column sums of a 2-D ``(M, C)`` array: shape ``(C,)``, a's dtype
    (float16, float32 or float64; float16 accumulates in float32, float64 in
    float64, float32 in float32).

    Our kernel in two passes (deterministic, no atomics, no cuBLAS: capturable
    into a CUDA graph): pass 1 writes an ``(R, C)`` matrix of partial sums in
    the accumulator type, ``R`` and the chunks from :func:`colsum_grid`; pass 2
    sums that matrix in one block row and rounds to a's dtype. When ``R == 1``
    pass 1 writes the result itself. ``a`` is read in C order (copied first if
    it is not C-contiguous). Raises ShapeError for another rank or dtype.
    """
    if a.ndim != 2:
        raise ShapeError(f"column_sums: a must be 2-D (M, C), got shape {a.shape}")
    dtype = str(a.dtype)
    if dtype not in _COLSUM_TYPES:
        raise ShapeError(f"column_sums: dtype {dtype} is not one of {', '.join(_COLSUM_TYPES)}")
    m, c = a.shape
    if a.size == 0:
        return xp.zeros(c, dtype=a.dtype)
    a = xp.ascontiguousarray(a)
    kernels = _colsum_kernels(dtype)
    r, rows_per_block = colsum_grid(m, c)
    tiles = -(-c // COLSUM_BLOCK[0])
    out = xp.empty(c, dtype=a.dtype)
    if r == 1:
        kernels["direct"]((tiles, 1), COLSUM_BLOCK, (a, out, xp.int64(m), xp.int64(c), xp.int64(m)))
        return out
    part = xp.empty((r, c), dtype=xp.float32 if dtype == "float16" else a.dtype)
    kernels["part"]((tiles, r), COLSUM_BLOCK, (a, part, xp.int64(m), xp.int64(c), xp.int64(rows_per_block)))
    kernels["final"]((tiles, 1), COLSUM_BLOCK, (part, out, xp.int64(r), xp.int64(c), xp.int64(r)))
    return out


def bias_add_backward(xp, gy, *, method="columns"):
    """Sum of ``gy`` over every axis but 1: (N, C, ...) -> (C,), gy's dtype;
    float16 accumulates in float32.

    Channels-last 4-D gy is an ``(N*H*W, C)`` matrix (a view, no copy):
    ``method='columns'`` (default) sums its columns with our two-pass kernel
    (:func:`column_sums`), which CUDA graphs can capture -- CuPy refuses cuBLAS
    calls during stream capture; ``method='gemv'`` keeps the previous one
    cuBLAS matrix-vector product (``ones(N*H*W) @ rows``; float16 copied to
    float32 first), offered to the autotuner as a variant
    (``cuda_rules.bias_variants``).

    NCHW (either method): one product over the ``(N*C, H*W)`` rows, then one
    over N (below :data:`BIAS_GRAD_SUM_BELOW` elements a CuPy sum, which
    launches less); other ranks likewise. A CuPy reduction over axes (0, 2, 3)
    was measured at 8.8 ms for AlexNet's conv1 gradient on the H200
    (channels-last); the NCHW variants were the fastest measured on the
    winners' shapes (``scripts/gpu_kernel_bench.py``, docs/performance.md).

    Raises ParameterError for a ``method`` not in :data:`BIAS_GRAD_METHODS`,
    ShapeError when gy has fewer than 2 dims.
    """
    if method not in BIAS_GRAD_METHODS:
        raise ParameterError("method", method, f"must be one of {', '.join(map(repr, BIAS_GRAD_METHODS))}")
    if gy.ndim < 2:
        raise ShapeError(f"bias_add_backward: gy must have a channel axis, got shape {gy.shape}")
    n, c = gy.shape[:2]
    acc = xp.float32 if gy.dtype == xp.float16 else gy.dtype
    if gy.size == 0:  # a product over an empty axis is not guaranteed to write its output
        return xp.zeros(c, dtype=gy.dtype)
    if is_channels_last(gy):
        rows = gy.transpose(0, 2, 3, 1).reshape(-1, c)  # (N*H*W, C), a view
        if method == "columns":
            return column_sums(xp, rows)
        rows = rows.astype(acc, copy=False)
        out = xp.ones(rows.shape[0], dtype=acc) @ rows
    elif gy.size < BIAS_GRAD_SUM_BELOW:
        out = gy.sum(axis=(0, *range(2, gy.ndim)), dtype=acc)
    else:
        g = xp.ascontiguousarray(gy).reshape(n * c, -1).astype(acc, copy=False)  # (N*C, HW)
        out = xp.ones(n, dtype=acc) @ (g @ xp.ones(g.shape[1], dtype=acc)).reshape(n, c)
    return out.astype(gy.dtype, copy=False)


# ------------------------------------------------------------------ bfloat16 bits

def float_to_bf16_bits(xp, x):
    """float32 -> bfloat16, round to nearest even, as uint16 bit patterns
    (NaN stays a quiet NaN, overflow rounds to inf). Layout kept."""
    k = _ew("f32_to_bf16", "float32 x", "uint16 y", """
        unsigned int u = __float_as_uint(x);
        if ((u & 0x7fffffffu) > 0x7f800000u) y = (unsigned short)((u >> 16) | 0x40u);
        else y = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);""")
    return k(x, xp.empty_like(x, dtype=xp.uint16))


def bf16_bits_to_float(xp, bits):
    """bfloat16 bit patterns (uint16) -> float32 (exact). Layout kept."""
    k = _ew("bf16_to_f32", "uint16 x", "float32 y", "y = __uint_as_float(((unsigned int)x) << 16)")
    return k(bits, xp.empty_like(bits, dtype=xp.float32))


# ------------------------------------------------------------------ LRN

def physical(xp, x):
    """``(buffer, channels_last)``: a C-contiguous array holding x's memory
    (NHWC order when x is a channels-last view of a 4-D tensor), copying only
    when x is neither NCHW- nor NHWC-contiguous."""
    if is_channels_last(x):
        return x.transpose(0, 2, 3, 1), True
    return xp.ascontiguousarray(x), False


def in_layout(xp, a, cl: bool):
    """The C-contiguous buffer of ``a`` in NHWC (``cl``) or NCHW order (copies if needed)."""
    return xp.ascontiguousarray(a.transpose(0, 2, 3, 1) if cl else a)


def logical(buf, cl: bool):
    """Inverse of :func:`physical`: the NCHW-shaped view of ``buf``."""
    return buf.transpose(0, 3, 1, 2) if cl else buf


_CHANNEL = """
    const long long t = i;
    const long long c = cl ? t % C : (t / inner) % C;
    const long long sc = cl ? 1 : inner;
    const long long lo = (c - before > 0 ? c - before : 0) - c;
    const long long hi = (c + after < C - 1 ? c + after : C - 1) - c;
"""

_LRN_FWD = _CHANNEL + """
    T s = 0;
    for (long long j = lo; j <= hi; ++j) { const T v = x[t + j * sc]; s += v * v; }
    const T d = (T)kk + (T)(alpha / nsize) * s;
    y[t] = x[t] * pow(d, (T)(-beta));
"""

_LRN_BWD1 = _CHANNEL + """
    T s = 0;
    for (long long j = lo; j <= hi; ++j) { const T v = x[t + j * sc]; s += v * v; }
    const T d = (T)kk + (T)(alpha / nsize) * s;
    const T p = pow(d, (T)(-beta));
    dp[t] = p;
    tt[t] = gy[t] * x[t] * p / d;
"""

# The transposed window: j is in W(c) iff c is in j - after .. j + before.
_LRN_BWD2 = _CHANNEL.replace("c - before", "c - after").replace("c + after", "c + before") + """
    T s = 0;
    for (long long j = lo; j <= hi; ++j) s += tt[t + j * sc];
    gx[t] = gy[t] * dp[t] - (T)(2.0 * alpha * beta / nsize) * x[t] * s;
"""

_LRN_PARAMS = ("int64 C, int64 inner, bool cl, int64 before, int64 after, float64 alpha, "
               "float64 beta, float64 kk, float64 nsize")


def _lrn_check(x, size):
    if isinstance(size, bool) or int(size) != size or size < 1:
        raise ParameterError("size", size, "must be an int >= 1")
    if x.ndim < 2:
        raise ShapeError(f"local_response_norm: x must be (N, C, ...), got shape {x.shape}")


def _lrn_setup(xp, x, size, k):
    """Physical buffer in the compute dtype, and the kernel's scalar params."""
    buf, cl = physical(xp, x)
    dt = xp.float32 if x.dtype == xp.float16 else x.dtype
    buf = buf.astype(dt, copy=False)
    size = int(size)
    inner = 1
    for n in x.shape[2:]:
        inner *= int(n)
    return buf, cl, dt, (x.shape[1], inner, cl, (size - 1) // 2, size // 2), float(k), size


def local_response_norm(xp, x, *, size, alpha, beta, k):
    """LRN across channels of ``(N, C, ...)`` x (module docstring formula).

    Returns x's shape, dtype and layout. Raises ParameterError (size) or
    ShapeError (fewer than 2 dims). Source: SEMANTICS.md; reference ``lrn.py``.
    """
    _lrn_check(x, size)
    if x.size == 0:
        return x.copy()
    buf, cl, dt, geo, kk, size = _lrn_setup(xp, x, size, k)
    kern = _ew("lrn_fwd", "raw T x, " + _LRN_PARAMS, "raw T y", _LRN_FWD)
    y = xp.empty_like(buf)
    kern(buf.ravel(), *geo, float(alpha), float(beta), kk, float(size), y.ravel(), size=buf.size)
    return logical(y, cl).astype(x.dtype, copy=False)


def local_response_norm_backward(xp, x, gy, *, size, alpha, beta, k):
    """Input gradient of :func:`local_response_norm` (exact):
    ``gx_j = gy_j d_j^-beta - 2 alpha beta/size x_j sum_{c: j in W(c)} gy_c x_c d_c^(-beta-1)``.

    Two passes: per cell ``d^-beta`` and ``gy x d^(-beta-1)``, then the
    transposed window sum. Returns x's shape, dtype and layout.
    """
    _lrn_check(x, size)
    _same("local_response_norm_backward", x, gy)
    if x.size == 0:
        return gy.copy()
    buf, cl, dt, geo, kk, size = _lrn_setup(xp, x, size, k)
    g = in_layout(xp, gy, cl).astype(dt, copy=False)
    dp, tt, gx = xp.empty_like(buf), xp.empty_like(buf), xp.empty_like(buf)
    k1 = _ew("lrn_bwd1", "raw T x, raw T gy, " + _LRN_PARAMS, "raw T dp, raw T tt", _LRN_BWD1)
    k1(buf.ravel(), g.ravel(), *geo, float(alpha), float(beta), kk, float(size), dp.ravel(), tt.ravel(),
       size=buf.size)
    k2 = _ew("lrn_bwd2", "raw T x, raw T gy, raw T dp, raw T tt, " + _LRN_PARAMS, "raw T gx", _LRN_BWD2)
    k2(buf.ravel(), g.ravel(), dp.ravel(), tt.ravel(), *geo, float(alpha), float(beta), kk, float(size),
       gx.ravel(), size=buf.size)
    return logical(gx, cl).astype(x.dtype, copy=False)


__all__ = ["relu", "relu_backward", "threshold", "threshold_backward", "bias_add_backward",
           "column_sums", "colsum_grid", "colsum_source", "float_to_bf16_bits",
           "bf16_bits_to_float", "physical", "in_layout", "logical", "local_response_norm",
           "local_response_norm_backward"]
