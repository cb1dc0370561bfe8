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

bfloat16 (``ml_dtypes.bfloat16``, dtype name ``'bfloat16'``) is taken by every
kernel here and returned in the same dtype and layout, computed in float32
with the load and store inside the kernel (no cast pass over the tensor): the
kernel gets the array's uint16 bit pattern (:func:`bits`, a view), loads an
element as ``__uint_as_float(bits << 16)`` (exact) and stores a float32 result
rounded to nearest even (NaN kept a quiet NaN, overflow to inf), as
:func:`float_to_bf16_bits` does; the ``LD``/``ST``/``CT`` macros of
:func:`storage_preamble` say how, per storage type (the identity for the
other dtypes, whose kernels compile to what they were). So comparisons (ReLU
and threshold masks, NaN tests) are those of float32 on the bf16 values, and
an output that is an input element (ReLU, the selects) is that element's bits.
In-kernel for bfloat16: ReLU and threshold (fwd/bwd), the column sums and the
NCHW bias gradient (:func:`row_sums` then the column kernel: float32
partials), LRN fwd/bwd (float32 intermediates). Only ``bias_add_backward(...,
method='gemv')`` on channels-last bfloat16 converts to float32 first (a cuBLAS
product; an autotune variant).
Kernels compile on first use (NVRTC) and are cached by CuPy (element-wise
kernels) or here, per dtype (the column-sum and row-sum modules).
"""

from __future__ import annotations

import functools

import numpy as np

from opgraph.errors import ParameterError, ShapeError
from opgraph.types import compute_dtype, is_channels_last, numpy_dtype


@functools.lru_cache(maxsize=None)
def _ew(name: str, in_params: str, out_params: str, code: str, preamble: str = ""):
    import cupy
    return cupy.ElementwiseKernel(in_params, out_params, code, f"opgraph_{name}", preamble=preamble)


# ------------------------------------------------------------------ storage types

#: numpy dtype name of bfloat16 (``ml_dtypes.bfloat16``): stored as 16 bits,
#: computed in float32 inside our kernels (module docstring).
BF16 = "bfloat16"

#: Device functions of bfloat16 storage: bits -> float32 (exact: the bits are
#: float32's upper half) and float32 -> bits rounded to nearest even, a NaN
#: kept a quiet NaN (sign and top payload bits kept), overflow to inf.
BF16_DEVICE = r"""
__device__ __forceinline__ float opgraph_bf16_load(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short opgraph_bf16_bits(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""

_BF16_MACROS = BF16_DEVICE + ("#define CT float\n#define LD(e) opgraph_bf16_load(e)\n"
                              "#define ST(e, v) ((e) = opgraph_bf16_bits(v))\n")
_PLAIN_MACROS = "#define CT T\n#define LD(e) (e)\n#define ST(e, v) ((e) = (v))\n"


def dtype_name(dtype) -> str:
    """numpy's name of ``dtype`` (a dtype, a scalar type or a name): ``'bfloat16'``,
    ``'float32'``... (the name ``'bfloat16'`` is returned as is: NumPy knows it
    only once ml_dtypes is imported)."""
    return BF16 if isinstance(dtype, str) and dtype == BF16 else np.dtype(dtype).name


def storage_preamble(storage: str) -> str:
    """CUDA preamble of an element-wise kernel whose ``T`` arrays hold ``storage``
    (a numpy dtype name, as the caller's array had it before :func:`bits`).

    Defines ``CT`` (the compute type), ``LD(e)`` (an element of a ``T`` array
    as CT) and ``ST(e, v)`` (store the CT value ``v`` into element ``e``).
    bfloat16: T is ``unsigned short`` (the bits), CT ``float``, LD/ST the
    conversions of :data:`BF16_DEVICE`. Any other storage: CT is T and LD/ST
    the identity, so a kernel compiles to what it did without the macros.
    ``T``-typed constants such as ``(T)0`` stay bit patterns (0 is +0.0 in
    every storage)."""
    return _BF16_MACROS if storage == BF16 else _PLAIN_MACROS


def kernel_tag(storage: str) -> str:
    """Suffix of a kernel's name per storage: ``'_bf16'`` for bfloat16, else ``''``
    (the float kernels keep their names)."""
    return "_bf16" if storage == BF16 else ""


def is_bf16(a) -> bool:
    """Whether array ``a`` holds bfloat16."""
    return dtype_name(a.dtype) == BF16


def bits(xp, a):
    """``a`` as our kernels take it: a bfloat16 array as its uint16 bit pattern
    (a view: same shape and strides, so layout checks still hold), any other
    array unchanged. CuPy copies, transposes and allocates uint16 arrays; it
    may not compute on bfloat16 ones, so bfloat16 data stays in this form until
    :func:`unbits`."""
    return a.view(xp.uint16) if is_bf16(a) else a


def unbits(a, dtype):
    """A result held as ``bits`` (:func:`bits`) back in ``dtype``: a view for
    bfloat16, ``a`` itself otherwise."""
    return a.view(numpy_dtype(BF16)) if dtype_name(dtype) == BF16 else a


def zeros(xp, shape, dtype):
    """``zeros(shape, dtype)``; bfloat16 allocated as uint16 zeros (+0.0) and viewed."""
    if dtype_name(dtype) == BF16:
        return xp.zeros(shape, dtype=xp.uint16).view(dtype)
    return xp.zeros(shape, dtype=dtype)


def copy(xp, a):
    """A copy of ``a`` in its dtype and layout (bfloat16 copied as its bits)."""
    return unbits(bits(xp, a).copy(), a.dtype)


def like(xp, a, dtype):
    """``a`` as a kernel whose storage is ``dtype`` takes it (:func:`bits` form):
    a view when a already has that dtype, else converted (a pass over a;
    bfloat16 through :func:`float_to_bf16_bits` / :func:`bf16_bits_to_float`).
    For mixed-dtype calls (an op's two float operands in different dtypes)."""
    want, have = dtype_name(dtype), dtype_name(a.dtype)
    if have == want:
        return bits(xp, a)
    if have == BF16:
        a = bf16_bits_to_float(xp, bits(xp, a))
    if want == BF16:
        return float_to_bf16_bits(xp, a.astype(xp.float32, copy=False))
    return a.astype(dtype, copy=False)


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
#: Bodies of the ReLU / threshold kernels. Only ``x`` (storage T) is loaded
#: (LD); an output is an input element or a constant, copied as stored -- for
#: bfloat16 its bits, ``(T)0`` / ``(G)0`` being +0.0 -- so nothing is rounded.
RELU_BODY = "y = (LD(x) > (CT)0 || LD(x) != LD(x)) ? x : (T)0"
RELU_BWD_BODY = "gx = (LD(x) > (CT)0) ? gy : (G)0"
THRESHOLD_BODY = "y = (LD(x) <= LD(t)) ? v : x"
THRESHOLD_BWD_BODY = "gx = (LD(x) > LD(t)) ? gy : z"


def relu(xp, x, *, out=None):
    """``max(x, 0)``, NaN propagating; any shape and float dtype (bfloat16
    included: compared in float32, stored bits copied), layout kept. Into
    ``out`` if given (x itself for an in-place step), which is returned."""
    dt = dtype_name(x.dtype)
    k = _ew("relu" + kernel_tag(dt), "T x", "T y", RELU_BODY, storage_preamble(dt))
    if out is not None:
        (xm, om), _ = _memory_order(bits(xp, x), bits(xp, out))
        k(xm, om)
        return out
    (xm,), back = _memory_order(bits(xp, x))
    return unbits(back(k(xm, xp.empty_like(xm))), x.dtype)


def relu_backward(xp, x, gy, *, out=None):
    """``gy`` where ``x > 0``, else 0 (gradient 0 at exactly 0 and at NaN);
    gy's dtype (bfloat16: x compared in float32, gy's bits copied). Into
    ``out`` if given (gy itself for an in-place step), which is returned."""
    _same("relu_backward", x, gy)
    dt = dtype_name(x.dtype)
    k = _ew("relu_bwd" + kernel_tag(dt), "T x, G gy", "G gx", RELU_BWD_BODY, storage_preamble(dt))
    if out is not None:
        (xm, gm, om), _ = _memory_order(bits(xp, x), bits(xp, gy), bits(xp, out))
        k(xm, gm, om)
        return out
    (xm, gm), back = _memory_order(bits(xp, x), bits(xp, gy))
    return unbits(back(k(xm, gm, xp.empty_like(gm))), gy.dtype)


def _constant(xp, value, dtype):
    """0-d array of ``value`` rounded to ``dtype``, in kernel storage (bfloat16:
    its bits, rounded on the host by ml_dtypes, nearest even)."""
    if dtype_name(dtype) == BF16:
        return xp.asarray(np.asarray(value, dtype=dtype).view(np.uint16))
    return xp.asarray(value, dtype=dtype)


def threshold(xp, x, *, threshold, value):
    """``x if x > threshold else value``; a NaN input propagates. The two
    constants are rounded to x's dtype first, as NumPy compares (bfloat16:
    compared in float32 on the rounded values)."""
    dt = dtype_name(x.dtype)
    k = _ew("threshold" + kernel_tag(dt), "T x, T t, T v", "T y", THRESHOLD_BODY, storage_preamble(dt))
    (xm,), back = _memory_order(bits(xp, x))
    return unbits(back(k(xm, _constant(xp, threshold, x.dtype), _constant(xp, value, x.dtype),
                         xp.empty_like(xm))), x.dtype)


def threshold_backward(xp, x, gy, *, threshold):
    """``gy`` where ``x > threshold``, else 0; gy's dtype."""
    _same("threshold_backward", x, gy)
    dt = dtype_name(x.dtype)
    k = _ew("threshold_bwd" + kernel_tag(dt), "T x, T t, G gy, G z", "G gx", THRESHOLD_BWD_BODY,
            storage_preamble(dt))
    (xm, gm), back = _memory_order(bits(xp, x), bits(xp, gy))
    return unbits(back(k(xm, _constant(xp, threshold, x.dtype), gm, _zero(xp, gm), xp.empty_like(gm))),
                  gy.dtype)


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
    per row (coalesced along L), deterministic. The first pass of the NCHW
    bfloat16 bias gradient. Raises ShapeError for another rank, dtype or an
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
    (``cuda_rules.bias_variants``).

    NCHW (either method): one product over the ``(N*C, H*W)`` rows, then one
    over N (below :data:`BIAS_GRAD_SUM_BELOW` elements a CuPy sum, which
    launches less); other ranks likewise. A CuPy reduction over axes (0, 2, 3)
    was measured at 8.8 ms for AlexNet's conv1 gradient on the H200
    (channels-last); the NCHW variants were the fastest measured on the
    winners' shapes (``scripts/gpu_kernel_bench.py``, docs/performance.md).

    bfloat16 (CuPy neither sums nor multiplies it): channels-last as above
    (``'gemv'`` converts to float32 first); any other layout runs our kernels
    on the bits, two deterministic passes with no cast pass: :func:`row_sums`
    of the ``(N*C, prod(spatial))`` rows into float32, then the column kernel's
    float32 -> bfloat16 pass (``opgraph_colsum_final``) over the ``(N, C)``
    partials; gy with no spatial extent is an ``(N, C)`` matrix for
    :func:`column_sums`.

    Raises ParameterError for a ``method`` not in :data:`BIAS_GRAD_METHODS`,
    ShapeError when gy has fewer than 2 dims.
    """
    if method not in BIAS_GRAD_METHODS:
        raise ParameterError("method", method, f"must be one of {', '.join(map(repr, BIAS_GRAD_METHODS))}")
    if gy.ndim < 2:
        raise ShapeError(f"bias_add_backward: gy must have a channel axis, got shape {gy.shape}")
    n, c = gy.shape[:2]
    bf16 = is_bf16(gy)
    acc = compute_dtype(xp, gy.dtype)
    if gy.size == 0:  # a product over an empty axis is not guaranteed to write its output
        return zeros(xp, c, gy.dtype)
    if is_channels_last(gy):
        rows = gy.transpose(0, 2, 3, 1).reshape(-1, c)  # (N*H*W, C), a view
        if method == "columns":
            return column_sums(xp, rows)
        rows = like(xp, rows, xp.float32) if bf16 else rows.astype(acc, copy=False)
        out = xp.ones(rows.shape[0], dtype=acc) @ rows
    elif bf16:
        return _bias_grad_bf16(xp, gy)
    elif gy.size < BIAS_GRAD_SUM_BELOW:
        out = gy.sum(axis=(0, *range(2, gy.ndim)), dtype=acc)
    else:
        g = xp.ascontiguousarray(gy).reshape(n * c, -1).astype(acc, copy=False)  # (N*C, HW)
        out = xp.ones(n, dtype=acc) @ (g @ xp.ones(g.shape[1], dtype=acc)).reshape(n, c)
    if bf16:
        return float_to_bf16_bits(xp, out).view(gy.dtype)
    return out.astype(gy.dtype, copy=False)


def _bias_grad_bf16(xp, gy):
    """Non-channels-last bfloat16 ``bias_add_backward`` (its docstring), gy non-empty."""
    n, c = gy.shape[:2]
    g = xp.ascontiguousarray(bits(xp, gy)).reshape(n * c, -1)  # (N*C, L) bits
    if g.shape[1] == 1:
        return column_sums(xp, g.reshape(n, c).view(gy.dtype))
    part = row_sums(xp, g.view(gy.dtype))  # (N*C,) float32: row n*C + ch
    out = xp.empty(c, dtype=xp.uint16)
    _colsum_kernels(BF16)["final"]((-(-c // COLSUM_BLOCK[0]), 1), COLSUM_BLOCK,
                                   (part, out, xp.int64(n), xp.int64(c), xp.int64(n)))
    return out.view(gy.dtype)


# ------------------------------------------------------------------ bfloat16 bits

def float_to_bf16_bits(xp, x):
    """float32 -> bfloat16, round to nearest even, as uint16 bit patterns
    (NaN stays a quiet NaN, overflow rounds to inf). Layout kept."""
    k = _ew("f32_to_bf16", "float32 x", "uint16 y", "y = opgraph_bf16_bits(x)", BF16_DEVICE)
    return k(x, xp.empty_like(x, dtype=xp.uint16))


def bf16_bits_to_float(xp, bits):
    """bfloat16 bit patterns (uint16) -> float32 (exact). Layout kept."""
    k = _ew("bf16_to_f32", "uint16 x", "float32 y", "y = opgraph_bf16_load(x)", BF16_DEVICE)
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
    kern = _ew("lrn_fwd" + kernel_tag(storage), "raw T x, " + _LRN_PARAMS, "raw T y", _LRN_FWD,
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
    _same("local_response_norm_backward", x, gy)
    if x.size == 0:
        return copy(xp, gy)
    buf, cl, storage, geo, kk, size = _lrn_setup(xp, x, size, k)
    g = in_layout(xp, like(xp, gy, storage), cl)
    mid = xp.float32 if storage == BF16 else buf.dtype
    dp, tt, gx = xp.empty_like(buf, dtype=mid), xp.empty_like(buf, dtype=mid), xp.empty_like(buf)
    pre, tag = storage_preamble(storage), kernel_tag(storage)
    k1 = _ew("lrn_bwd1" + tag, "raw T x, raw T gy, " + _LRN_PARAMS, "raw A dp, raw A tt", _LRN_BWD1, pre)
    k1(buf.ravel(), g.ravel(), *geo, float(alpha), float(beta), kk, float(size), dp.ravel(), tt.ravel(),
       size=buf.size)
    k2 = _ew("lrn_bwd2" + tag, "raw T x, raw T gy, raw A dp, raw A tt, " + _LRN_PARAMS, "raw T gx",
             _LRN_BWD2, pre)
    k2(buf.ravel(), g.ravel(), dp.ravel(), tt.ravel(), *geo, float(alpha), float(beta), kk, float(size),
       gx.ravel(), size=buf.size)
    return _lrn_result(xp, gx, cl, x.dtype)


__all__ = ["BF16", "BF16_DEVICE", "relu", "relu_backward", "threshold", "threshold_backward",
           "bias_add_backward", "column_sums", "colsum_grid", "colsum_source", "row_sums", "rowsum_source",
           "float_to_bf16_bits", "bf16_bits_to_float", "physical", "in_layout", "logical",
           "local_response_norm", "local_response_norm_backward", "storage_preamble", "kernel_tag",
           "dtype_name", "is_bf16", "bits", "unbits", "zeros", "copy", "like"]
