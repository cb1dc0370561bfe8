"""CuPy kernels of column and row sums, and the bias gradient built on them.

The bias gradient is the sum of ``gy`` over every axis but 1 (the reference:
``opgraph.backends.reference.elementwise.bias_add_backward``); channels-last
input is an ``(N*H*W, C)`` matrix whose column sums a two-pass raw kernel
takes (:func:`column_sums`: deterministic, no atomics, no cuBLAS, so it can be
captured into a CUDA graph). The column sums read float16 directly and
accumulate in float32; bfloat16 (:mod:`.storage`) too. A large (or bfloat16)
NCHW bias gradient takes :func:`row_sums` then the column kernel (partials in
the accumulator type), capturable too. Only ``bias_add_backward(...,
method='gemv')`` on channels-last input calls cuBLAS (an autotune variant,
declared not capturable: :func:`method_capture_blocker`; bfloat16 converted to
float32 first); ``method='vector'`` takes the same column sums with 16-byte loads
(:mod:`.colsum_vector`, capturable). Index arithmetic is 64-bit (``long long``). Kernels compile on
first use (NVRTC) and are cached here, per dtype.
"""

from __future__ import annotations

import functools

from opgraph.errors import ParameterError, ShapeError
from opgraph.types import compute_dtype, is_channels_last

from . import colsum_vector
from .storage import BF16_DEVICE, bits, dtype_name, float_to_bf16_bits, is_bf16, like, unbits, zeros


#: NCHW bias gradients smaller than this (elements) use a CuPy sum, larger ones
#: our row and column kernels. The threshold was measured against the two
#: cuBLAS products those kernels replaced because they refuse stream capture
#: (0.06-0.12 ms against 0.19-0.24 ms on GoogLeNet's 1.6-4.8 M element
#: gradients; 1.6 ms against 0.27 ms at 103 M; H200, 2026-11-30); the row
#: kernels were not timed against either at these sizes. They run one warp per
#: ``(n, c)`` row, so a gradient of few rows and a large image would be slow;
#: the NHWC runs of the benchmarks never take this path.
BIAS_GRAD_SUM_BELOW = 16 * 2 ** 20

#: ``method`` of :func:`bias_add_backward` for channels-last input: our
#: column-sum kernel (the default; capturable into a CUDA graph), the same sums
#: with 16-byte loads (``colsum_vector``; capturable) or one cuBLAS
#: matrix-vector product (not capturable; kept as an autotune variant).
BIAS_GRAD_METHODS = ("columns", "vector", "gemv")


def method_capture_blocker(options) -> str | None:
    """Why :func:`bias_add_backward` with these kernel options cannot be
    captured into a CUDA graph, or None (the bias rule's
    ``Rule.variant_capture_blocker``): ``method='gemv'`` multiplies on CuPy's
    cuBLAS handle, which refuses stream capture, so autotune leaves it out of
    a replayed step. Declared for the option alone: on NCHW input that method
    runs the same capturable code as ``'columns'`` (a CuPy sum below
    :data:`BIAS_GRAD_SUM_BELOW`, the row kernels above), which the declaration
    then undersells (a replay runs the step eagerly), never oversells."""
    if options.get("method") == "gemv":
        return ("method='gemv' is a cuBLAS product on CuPy's handle, which refuses stream capture "
                "(the default method='columns' captures)")
    return None

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
#: ``cuda_fp16.h`` (which NVRTC does not always find). bfloat16 is its bit
#: pattern too, typed ``opgraph_bf16`` (a struct of the 16 bits, so that its
#: overloads differ from float16's) and converted by :data:`BF16_DEVICE`.
_COLSUM_TYPES = {"float16": ("unsigned short", "float"), "bfloat16": ("opgraph_bf16", "float"),
                 "float32": ("float", "float"), "float64": ("double", "double")}

#: The bfloat16 overloads of the column / row kernels' load and store.
COLSUM_BF16_HELPERS = BF16_DEVICE + r"""
struct opgraph_bf16 { unsigned short bits; };
__device__ __forceinline__ float opgraph_load(opgraph_bf16 b) { return opgraph_bf16_load(b.bits); }
__device__ __forceinline__ void opgraph_store(opgraph_bf16* p, float v) { p->bits = opgraph_bf16_bits(v); }
"""

_COLSUM_HELPERS = COLSUM_BF16_HELPERS + r"""
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
    ``'bfloat16'``, ``'float32'`` or ``'float64'``): ``opgraph_colsum_part`` (dtype -> the
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


#: Geometry of :func:`row_sums`: a block of (32, 8) threads, one warp per row.
ROWSUM_BLOCK = (32, 8)

# Warp ty of block b sums row r = b*8 + ty of the C-contiguous (rows, L) matrix
# src: lane tx adds elements tx, tx+32, ... (a warp reads 32 adjacent
# elements), then the 32 lane sums fold in a fixed tree (shuffles 16, 8, 4,
# 2, 1: deterministic), and lane 0 writes dst[r] in the accumulator type. A
# warp past the last row leaves as a whole, so every shuffle sees full warps.
_ROWSUM_KERNEL = r"""
extern "C" __global__ void opgraph_rowsum(const IN_T* __restrict__ src, ACC* __restrict__ dst,
                                          const long long rows, const long long L) {
    const long long r = (long long)blockIdx.x * 8 + threadIdx.y;
    if (r >= rows) return;
    const IN_T* row = src + r * L;
    ACC s = 0;
    for (long long j = threadIdx.x; j < L; j += 32) s += opgraph_load(row[j]);
    for (int k = 16; k > 0; k >>= 1) s += __shfl_down_sync(0xffffffffu, s, k);
    if (threadIdx.x == 0) dst[r] = s;
}
"""


def rowsum_source(dtype: str) -> str:
    """CUDA source of ``opgraph_rowsum(src, dst, long long rows, long long L)``
    for ``dtype`` (as :func:`colsum_source`): the sums of the rows of a
    C-contiguous ``(rows, L)`` matrix of ``dtype``, in the accumulator type."""
    store, acc = _COLSUM_TYPES[dtype]
    return f"typedef {acc} ACC;\n" + _COLSUM_HELPERS + _ROWSUM_KERNEL.replace("IN_T", store)


@functools.lru_cache(maxsize=None)
def _rowsum_kernel(dtype: str):
    """The compiled :func:`rowsum_source` kernel for ``dtype`` (built on first use)."""
    import cupy
    return cupy.RawModule(code=rowsum_source(dtype)).get_function("opgraph_rowsum")


def row_sums(xp, a):
    """Sums of the rows of a C-contiguous 2-D ``(R, L)`` array (float16,
    bfloat16, float32 or float64), ``L >= 1``: shape ``(R,)`` in the
    accumulator type (float32 for float16/bfloat16, else a's dtype), one warp
    per row (coalesced along L), deterministic. The first pass of a large (or
    bfloat16) NCHW bias gradient. Raises ShapeError for another rank, dtype or an
    ``R*L == 0`` matrix."""
    dtype = dtype_name(a.dtype)
    if a.ndim != 2 or dtype not in _COLSUM_TYPES or a.size == 0:
        raise ShapeError(f"row_sums: a must be a non-empty 2-D float array, got {a.shape} {dtype}")
    rows, length = a.shape
    src = xp.ascontiguousarray(bits(xp, a))
    out = xp.empty(rows, dtype=compute_dtype(xp, a.dtype))
    _rowsum_kernel(dtype)((-(-rows // ROWSUM_BLOCK[1]),), ROWSUM_BLOCK,
                          (src, out, xp.int64(rows), xp.int64(length)))
    return out


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
    (float16, bfloat16, float32 or float64; float16 and bfloat16 accumulate in
    float32 and round once to nearest even, float64 in float64, float32 in
    float32).

    Our kernel in two passes (deterministic, no atomics, no cuBLAS: capturable
    into a CUDA graph): pass 1 writes an ``(R, C)`` matrix of partial sums in
    the accumulator type, ``R`` and the chunks from :func:`colsum_grid`; pass 2
    sums that matrix in one block row and rounds to a's dtype. When ``R == 1``
    pass 1 writes the result itself. ``a`` is read in C order (copied first if
    it is not C-contiguous). Raises ShapeError for another rank or dtype.
    """
    if a.ndim != 2:
        raise ShapeError(f"column_sums: a must be 2-D (M, C), got shape {a.shape}")
    dtype = dtype_name(a.dtype)
    if dtype not in _COLSUM_TYPES:
        raise ShapeError(f"column_sums: dtype {dtype} is not one of {', '.join(_COLSUM_TYPES)}")
    m, c = a.shape
    if a.size == 0:
        return zeros(xp, c, a.dtype)
    src = xp.ascontiguousarray(bits(xp, a))  # bfloat16: its bits (the kernel's opgraph_bf16)
    kernels = _colsum_kernels(dtype)
    r, rows_per_block = colsum_grid(m, c)
    tiles = -(-c // COLSUM_BLOCK[0])
    out = xp.empty(c, dtype=src.dtype)
    if r == 1:
        kernels["direct"]((tiles, 1), COLSUM_BLOCK, (src, out, xp.int64(m), xp.int64(c), xp.int64(m)))
        return unbits(out, a.dtype)
    part = xp.empty((r, c), dtype=compute_dtype(xp, a.dtype))
    kernels["part"]((tiles, r), COLSUM_BLOCK, (src, part, xp.int64(m), xp.int64(c), xp.int64(rows_per_block)))
    kernels["final"]((tiles, 1), COLSUM_BLOCK, (part, out, xp.int64(r), xp.int64(c), xp.int64(r)))
    return unbits(out, a.dtype)


def bias_add_backward(xp, gy, *, method="columns"):
    """Sum of ``gy`` over every axis but 1: (N, C, ...) -> (C,), gy's dtype;
    float16 and bfloat16 accumulate in float32.

    Channels-last 4-D gy is an ``(N*H*W, C)`` matrix (a view, no copy):
    ``method='columns'`` (default) sums its columns with our two-pass kernel
    (:func:`column_sums`), which CUDA graphs can capture -- CuPy refuses cuBLAS
    calls during stream capture; ``method='gemv'`` keeps the previous one
    cuBLAS matrix-vector product (``ones(N*H*W) @ rows``; float16 copied to
    float32 first), offered to the autotuner as a variant
    (``rules.bias_variants``); ``method='vector'`` takes the column sums with
    16-byte loads (:func:`colsum_vector.column_sums`, capturable) where its
    ``declines`` gives no reason (bfloat16 or float32, channels a multiple of
    its lanes, 16-byte-aligned rows), else the ``'columns'`` kernel: the same
    sums, another order of additions.

    NCHW (every method; other ranks likewise): below
    :data:`BIAS_GRAD_SUM_BELOW` elements a CuPy sum, which launches less;
    from there our kernels, two deterministic passes with no cast pass and no
    cuBLAS (so capturable, as the bias rule declares): :func:`row_sums` of the
    ``(N*C, prod(spatial))`` rows into the accumulator type, then the column
    kernel's accumulator -> dtype pass (``opgraph_colsum_final``) over the
    ``(N, C)`` partials; gy with no spatial extent is an ``(N, C)`` matrix for
    :func:`column_sums`. A CuPy reduction over axes (0, 2, 3) was measured at
    8.8 ms for AlexNet's conv1 gradient on the H200 (channels-last).

    bfloat16 (CuPy neither sums nor multiplies it): channels-last as above
    (``'gemv'`` converts to float32 first); any other layout, of any size,
    runs the row and column kernels on the bits.

    Raises ParameterError for a ``method`` not in :data:`BIAS_GRAD_METHODS`,
    ShapeError when gy has fewer than 2 dims.
    """
    if method not in BIAS_GRAD_METHODS:
        raise ParameterError("method", method, f"must be one of {', '.join(map(repr, BIAS_GRAD_METHODS))}")
    if gy.ndim < 2:
        raise ShapeError(f"bias_add_backward: gy must have a channel axis, got shape {gy.shape}")
    c = gy.shape[1]
    bf16 = is_bf16(gy)
    acc = compute_dtype(xp, gy.dtype)
    if gy.size == 0:  # a product over an empty axis is not guaranteed to write its output
        return zeros(xp, c, gy.dtype)
    if is_channels_last(gy):
        rows = gy.transpose(0, 2, 3, 1).reshape(-1, c)  # (N*H*W, C), a view
        if method == "vector" and colsum_vector.declines(rows) is None:
            return colsum_vector.column_sums(xp, rows)
        if method in ("columns", "vector"):
            return column_sums(xp, rows)
        rows = like(xp, rows, xp.float32) if bf16 else rows.astype(acc, copy=False)
        out = xp.ones(rows.shape[0], dtype=acc) @ rows
    elif bf16 or gy.size >= BIAS_GRAD_SUM_BELOW:
        return _bias_grad_rows(xp, gy)
    else:
        out = gy.sum(axis=(0, *range(2, gy.ndim)), dtype=acc)
    if bf16:
        return float_to_bf16_bits(xp, out).view(gy.dtype)
    return out.astype(gy.dtype, copy=False)


def _bias_grad_rows(xp, gy):
    """Non-channels-last ``bias_add_backward`` by the row and column kernels
    (its docstring), gy non-empty, any dtype of :func:`row_sums`."""
    n, c = gy.shape[:2]
    g = xp.ascontiguousarray(bits(xp, gy)).reshape(n * c, -1)  # (N*C, L); bfloat16 as bits
    if g.shape[1] == 1:
        return column_sums(xp, g.reshape(n, c).view(gy.dtype))
    part = row_sums(xp, g.view(gy.dtype))  # (N*C,) in the accumulator type: row n*C + ch
    out = xp.empty(c, dtype=g.dtype)
    _colsum_kernels(dtype_name(gy.dtype))["final"]((-(-c // COLSUM_BLOCK[0]), 1), COLSUM_BLOCK,
                                                   (part, out, xp.int64(n), xp.int64(c), xp.int64(n)))
    return unbits(out, gy.dtype)


__all__ = ["BIAS_GRAD_SUM_BELOW", "BIAS_GRAD_METHODS", "COLSUM_BLOCK", "COLSUM_BF16_HELPERS", "ROWSUM_BLOCK",
           "bias_add_backward", "column_sums", "colsum_grid", "colsum_source", "method_capture_blocker", "row_sums",
           "rowsum_source"]
