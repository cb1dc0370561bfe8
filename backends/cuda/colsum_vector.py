"""Column sums of a channels-last gradient with 16-byte loads: the bias gradient's ``vector`` method.

The bias gradient of a channels-last ``(N, C, H, W)`` gradient is the column sums of its
``(N*H*W, C)`` rows (``colsum.bias_add_backward``). :func:`column_sums` takes them in two
deterministic passes, like ``colsum.column_sums``, but each thread of pass 1 loads 16 bytes at a
time (8 bfloat16 or 4 float32 channels: ``V`` lanes) instead of one element, so that a warp reads
whole 128-byte lines and each thread keeps several loads in flight. GoogLeNet's 58 bias gradients
ran at 43.5 % of the copy bandwidth on the H200 (eighteenth session's profile) with 2-byte loads
and 32-column blocks; most take under 10 microseconds, so fewer, wider loads and a short second
pass are what is left to gain.

Pass 1 (``opgraph_colsum_vec_part``): block ``(b, t)`` of 256 threads takes the columns
``[t*TW*V, (t+1)*TW*V)`` (TW vector columns: ``min(C/V, 256)``) over rows
``[b*rows_per_block, ...)``; its ``256 // TW`` thread rows take every ``256 // TW``-th row in
turn, then thread row 0 adds the thread rows' sums in order (shared memory) and writes row ``b``
of the float32 partials ``part (G, C)``. Pass 2 (``opgraph_colsum_vec_final``): a block of
(32, 32) threads per 32 columns; thread row ``j`` adds partial rows ``j, j+32, ...`` in order,
then thread row 0 adds the 32 sums in order and rounds once to the storage dtype. Every sum runs
in a fixed order, so the result does not depend on scheduling; it may differ in the last bits
from the ``columns`` method's (another order of additions), within the bias gradient's
tolerance (SEMANTICS.md). Index arithmetic is 64-bit. No atomics, no cuBLAS: capturable into a
CUDA graph.
"""

from __future__ import annotations

import functools

from opgraph.errors import ShapeError

from .codegen.launch import address
from .storage import BF16_DEVICE, bits, dtype_name, unbits

#: the kernels' revision, part of the autotune cache key of the bias gradient's variants
#: (``rules.bias_variants``): a change to the kernels or their geometry tunes again
#: (an edit of the kernels' code needs no bump: its fingerprint is in the key too, ``kernel_sources``)
REVISION = 1
#: storage dtype -> lanes per 16-byte load. float16 is left to the ``columns`` method (its
#: conversions need PTX this module does not carry); float64 too (it sums in float64).
LANES = {"bfloat16": 8, "float32": 4}
#: threads of a pass-1 block; an H200 keeps 132 SMs x 8 such blocks resident
THREADS = 256
#: at most about this many pass-1 blocks in all
MAX_BLOCKS = 1056
#: each thread of pass 1 loads at least about this many 16-byte vectors
LOADS_PER_THREAD = 8
#: pass 2's block: 32 columns x 32 thread rows over the partial rows
FINAL_BLOCK = (32, 32)

# What one 16-byte load adds to the thread's V float sums, per storage: bfloat16 is the high half
# of a float32 (its low 16 bits zero), so each 32-bit word holds two lanes.
_UNPACK = {
    "bfloat16": """
        const unsigned int w[4] = {q.x, q.y, q.z, q.w};
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            acc[2 * k] += __uint_as_float(w[k] << 16);
            acc[2 * k + 1] += __uint_as_float(w[k] & 0xffff0000u);
        }""",
    "float32": """
        acc[0] += __uint_as_float(q.x); acc[1] += __uint_as_float(q.y);
        acc[2] += __uint_as_float(q.z); acc[3] += __uint_as_float(q.w);""",
}
_STORE = {"bfloat16": ("unsigned short", "opgraph_bf16_bits(s)"), "float32": ("float", "s")}

#: the end of a pass-1 kernel: each thread's V sums into shared memory, then thread row 0 adds the
#: thread rows' in order and writes the block's row of the float32 partials (``colsum_relu`` ends
#: its pass 1 the same way)
BLOCK_PARTIALS = r"""    #pragma unroll
    for (int k = 0; k < V; ++k) red[t * V + k] = acc[k];
    __syncthreads();
    if (ty == 0 && cv < CV) {
        for (int j = 1; j < RP; ++j) {
            #pragma unroll
            for (int k = 0; k < V; ++k) acc[k] += red[(j * TW + tx) * V + k];
        }
        float* out = part + (long long)blockIdx.x * ((long long)CV * V) + (long long)cv * V;
        #pragma unroll
        for (int k = 0; k < V; ++k) out[k] = acc[k];
    }
}
"""

_SOURCE = r"""
constexpr int V = LANES;
typedef STORE_T ST;
extern "C" __global__ void __launch_bounds__(THREADS) opgraph_colsum_vec_part(
        const ST* __restrict__ src, float* __restrict__ part, long long M, long long ld, int CV, int TW,
        long long rows_per_block) {
    __shared__ float red[THREADS * V];
    const int t = threadIdx.x, tx = t % TW, ty = t / TW, RP = THREADS / TW;
    const int cv = blockIdx.y * TW + tx;
    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = (r0 + rows_per_block < M) ? r0 + rows_per_block : M;
    float acc[V];
    #pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
    if (ty < RP && cv < CV) {
        const uint4* p = reinterpret_cast<const uint4*>(src + (r0 + ty) * ld) + cv;
        const long long step = (long long)RP * (ld / V);
        #pragma unroll 4
        for (long long r = r0 + ty; r < r1; r += RP, p += step) {
            const uint4 q = *p;
UNPACK
        }
    }
BLOCK_PARTIALS

extern "C" __global__ void __launch_bounds__(1024) opgraph_colsum_vec_final(
        const float* __restrict__ part, ST* __restrict__ dst, long long G, long long C) {
    __shared__ float red[32][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long c = (long long)blockIdx.x * 32 + tx;
    float s = 0.0f;
    if (c < C) {
        #pragma unroll 4
        for (long long g = ty; g < G; g += 32) s += part[g * C + c];
    }
    red[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int j = 1; j < 32; ++j) s += red[j][tx];
        dst[c] = STORE_EXPR;
    }
}
"""


def source(dtype: str) -> str:
    """CUDA source of both passes for ``dtype`` (a key of :data:`LANES`): ``opgraph_colsum_vec_part(src,
    part, long long M, long long ld, int CV, int TW, long long rows_per_block)`` and
    ``opgraph_colsum_vec_final(part, dst, long long G, long long C)``. Raises KeyError for
    another dtype."""
    store_t, store_expr = _STORE[dtype]
    return (BF16_DEVICE + _SOURCE.replace("BLOCK_PARTIALS\n", BLOCK_PARTIALS).replace("UNPACK", _UNPACK[dtype])
            .replace("STORE_T", store_t)
            .replace("STORE_EXPR", store_expr).replace("LANES", str(LANES[dtype]))
            .replace("THREADS", str(THREADS)))


@functools.lru_cache(maxsize=None)
def _kernels(dtype: str) -> tuple:
    """``(part, final)`` compiled for ``dtype`` (one NVRTC module per dtype, built on first use)."""
    import cupy
    module = cupy.RawModule(code=source(dtype))
    return module.get_function("opgraph_colsum_vec_part"), module.get_function("opgraph_colsum_vec_final")


def declines(rows) -> str | None:
    """Why :func:`column_sums` does not take the 2-D ``(M, C)`` array ``rows``, or None: its dtype has
    no entry in :data:`LANES`, C is not a multiple of the lanes, its rows are not dense runs of
    16-byte-aligned vectors (element stride, row stride and data pointer), or it is empty."""
    dtype = dtype_name(rows.dtype)
    if rows.ndim != 2:
        return f"rows of shape {rows.shape} are not 2-D"
    if dtype not in LANES:
        return f"dtype {dtype} is not one of {', '.join(LANES)}"
    v, item = LANES[dtype], rows.itemsize
    m, c = rows.shape
    if m == 0 or c == 0:
        return "no rows or no columns"
    if c % v:
        return f"{c} columns are not a multiple of {v} lanes"
    row_stride, col_stride = rows.strides
    if col_stride != item:
        return f"columns are {col_stride} bytes apart, not {item}"
    if row_stride % (v * item) or row_stride < c * item:
        return f"rows are {row_stride} bytes apart: not a multiple of 16 covering {c} columns"
    if address(rows) % 16:
        return "the data pointer is not 16-byte aligned"
    return None


def grid(m: int, cv: int, loads_per_thread: int = LOADS_PER_THREAD) -> tuple[int, int, int]:
    """``(G, TW, rows_per_block)`` of pass 1 on ``m`` rows of ``cv`` vector columns (both >= 1): TW
    vector columns per block (``min(cv, THREADS)``), G row blocks such that each thread loads at
    least about ``loads_per_thread`` vectors and there are at most about :data:`MAX_BLOCKS`
    blocks in all (``ceil(cv / TW)`` column tiles each); no row block is empty."""
    tw = min(cv, THREADS)
    tiles = -(-cv // tw)
    per_pass = THREADS // tw
    g = max(1, min(-(-m // (per_pass * loads_per_thread)), MAX_BLOCKS // tiles))
    rows_per_block = -(-m // g)
    return -(-m // rows_per_block), tw, rows_per_block


def column_sums(xp, rows, loads_per_thread: int = LOADS_PER_THREAD):
    """Column sums of the 2-D ``(M, C)`` array ``rows``: shape ``(C,)``, rows' dtype (bfloat16 or
    float32), summed in float32 in a fixed order and rounded once (bfloat16: to nearest even).

    ``rows`` may be a pitched view (a channel slice of a wider channels-last buffer): its rows are
    read where they lie. ``loads_per_thread``: pass 1's geometry (:func:`grid`; the default is
    what autotune runs, other values are ``scripts/bias_grad_bench.py --sweep``'s). Raises
    ShapeError when :func:`declines` gives a reason (the caller asks it first and takes another
    method)."""
    why = declines(rows)
    if why is not None:
        raise ShapeError(f"colsum_vector.column_sums: {why}")
    dtype = dtype_name(rows.dtype)
    v = LANES[dtype]
    m, c = rows.shape
    src = bits(xp, rows)
    g, tw, rows_per_block = grid(m, c // v, loads_per_thread)
    part_kernel = _kernels(dtype)[0]
    part = xp.empty((g, c), dtype=xp.float32)
    out = xp.empty(c, dtype=src.dtype)
    ld = src.strides[0] // src.itemsize
    tiles = -(-(c // v) // tw)
    part_kernel((g, tiles), (THREADS,), (src, part, xp.int64(m), xp.int64(ld), xp.int32(c // v), xp.int32(tw),
                                         xp.int64(rows_per_block)))
    finish(xp, part, out, dtype)
    return unbits(out, rows.dtype)


def finish(xp, part, out, dtype: str) -> None:
    """Pass 2 (``opgraph_colsum_vec_final``): the column sums of the float32 partials ``part``
    ``(G, C)`` (C-contiguous, G >= 1), added in a fixed order and rounded once, written into
    ``out``: a contiguous ``(C,)`` array in :func:`~.storage.bits` form of ``dtype`` (a key of
    :data:`LANES`: uint16 bits for bfloat16). Shared with the fused ReLU gradient's sums
    (:mod:`.colsum_relu`), whose pass 1 writes the same partials."""
    g, c = part.shape
    _kernels(dtype)[1]((-(-c // FINAL_BLOCK[0]),), FINAL_BLOCK, (part, out, xp.int64(g), xp.int64(c)))


__all__ = ["BLOCK_PARTIALS", "FINAL_BLOCK", "LANES", "LOADS_PER_THREAD", "MAX_BLOCKS", "REVISION", "THREADS",
           "column_sums", "declines",
           "finish", "grid", "source"]
