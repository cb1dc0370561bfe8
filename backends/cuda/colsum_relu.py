"""The ReLU gradient that also writes its per-channel sums (the bias gradient) in one read of y and gy.

A convolution's bias gradient is ``BiasAddBackward(g)`` of ``g = ReluBackward(y, gy)``, which the
convolutions read too; computed apart, the sums read ``g`` once more and cost a launch
(``opgraph/ops/relu_bias_sums.py``). :func:`relu_backward_sums` writes ``g`` and its column sums
together: pass 1 (``opgraph_colsum_relu_part``) is :mod:`.colsum_vector`'s pass 1 (16-byte loads of
``V`` lanes, blocks of :data:`~.colsum_vector.THREADS` threads over column tiles and row ranges,
the same :func:`~.colsum_vector.grid`) where each gy vector is masked by the matching y vector
before it is added, and the masked vector is also stored to ``g``; pass 2 is
:mod:`.colsum_vector`'s final kernel unchanged (:func:`.colsum_vector.finish`).

The mask is :data:`.relu.RELU_BWD_BODY`'s: gy's bits where ``y > 0`` (compared in float32), else
+0.0, so a NaN y blocks and a NaN gy at an open lane propagates into ``g`` and its channel's sum;
``g`` equals :func:`.relu.relu_backward`'s bit for bit. The sums add the stored lanes in
:mod:`.colsum_vector`'s fixed order (deterministic; the same bits as ``colsum_vector.column_sums(g)``)
in float32, rounded once to the storage dtype, as the bias gradient (SEMANTICS.md).

In place (``out=gy``, the memory pass's step: ``rules.INPLACE``) g is written through gy's own row
pitch by the pass-1 source without ``__restrict__`` (:func:`source`'s ``aliased``): each thread
loads its vectors of y and gy before it stores g's at the same address, and the sums are added
from the registers, so overwriting gy changes no bit of either result. Any other ``out`` must share
no memory with y or gy (:func:`out_is_gy`: a partial overlap, at another pitch or offset, would
have a thread store where another has yet to load); no byte, exactly (:func:`shares_memory`), so
two channel slices of one buffer, whose byte ranges interleave, may be y or gy and ``out``.

Rows are channels-last: y and gy logical ``(N, C, H, W)`` stored NHWC (each dense or a channel
slice of a wider buffer: its own pixel pitch) or 2-D ``(N, C)`` with unit column stride (each its own
row pitch); :func:`declines` says why other arrays take the fallback (:func:`relu_backward_sums_kernel`:
``relu.relu_backward`` then ``colsum.bias_add_backward``). No atomics, no library calls:
capturable into a CUDA graph.

The node kernels of the two ops live here too: :func:`relu_backward_sums_slot_kernel` (allocates
the sums, no launch) and :func:`relu_backward_sums_kernel` (fills them and returns ``g``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from opgraph.errors import ShapeError
from opgraph.types import numpy_dtype

from . import colsum, colsum_vector, relu
from .codegen.launch import address
from .colsum_vector import BLOCK_PARTIALS, LANES, LOADS_PER_THREAD, THREADS
from .pool_vector import pixel_pitch
from .storage import bits, dtype_name, logical, unbits

# No REVISION: the rule lists one variant (``kernel_sources.one_variant`` over this module,
# ``rules.KERNEL_MODULES``), whose fingerprint keys any decision autotune caches for it on this
# module's code and what it imports (an edit tunes them again, no bump needed).

# One 16-byte vector of each operand: the y words ``m`` mask the gy words ``q`` into ``o``, whose
# lanes the thread adds to its V float sums. bfloat16 packs two lanes per 32-bit word (the low
# lane in the low half: little-endian), each the high half of a float32 when shifted there.
_MASK = {
    "bfloat16": """
            const unsigned int wy[4] = {m.x, m.y, m.z, m.w}, wg[4] = {q.x, q.y, q.z, q.w};
            unsigned int wo[4];
            #pragma unroll
            for (int k = 0; k < 4; ++k) {
                const unsigned int keep = (__uint_as_float(wy[k] << 16) > 0.0f ? 0x0000ffffu : 0u)
                                        | (__uint_as_float(wy[k] & 0xffff0000u) > 0.0f ? 0xffff0000u : 0u);
                wo[k] = wg[k] & keep;
                acc[2 * k] += __uint_as_float(wo[k] << 16);
                acc[2 * k + 1] += __uint_as_float(wo[k] & 0xffff0000u);
            }
            const uint4 o = make_uint4(wo[0], wo[1], wo[2], wo[3]);""",
    "float32": """
            const uint4 o = make_uint4(__uint_as_float(m.x) > 0.0f ? q.x : 0u, __uint_as_float(m.y) > 0.0f ? q.y : 0u,
                                       __uint_as_float(m.z) > 0.0f ? q.z : 0u, __uint_as_float(m.w) > 0.0f ? q.w : 0u);
            acc[0] += __uint_as_float(o.x); acc[1] += __uint_as_float(o.y);
            acc[2] += __uint_as_float(o.z); acc[3] += __uint_as_float(o.w);""",
}
_STORE_T = {"bfloat16": "unsigned short", "float32": "float"}

# Block (b, t): vector columns [t*TW, (t+1)*TW) over rows [b*rows_per_block, ...), thread row ty
# taking rows ty, ty+RP, ...; then thread row 0 adds the thread rows' sums in order (as
# colsum_vector's pass 1, whose partials this writes). y, gy and g each have their own row pitch
# (elements, a multiple of V; g's is C = CV*V when it is new, gy's when g is gy's buffer). 64-bit
# indices. RESTRICT is __restrict__ unless g is gy's own memory (out_is_gy), an in-place step: each
# thread reads its vectors before it stores to the same address, which is safe without the promise.
_SOURCE = r"""
constexpr int V = LANES;
typedef STORE_T ST;
extern "C" __global__ void __launch_bounds__(THREADS) opgraph_colsum_relu_part(
        const ST* RESTRICT y, const ST* RESTRICT gy, ST* RESTRICT g, float* __restrict__ part,
        long long M, long long ldy, long long ldg, long long ldo, int CV, int TW, long long rows_per_block) {
    __shared__ float red[THREADS * V];
    const int t = threadIdx.x, tx = t % TW, ty = t / TW, RP = THREADS / TW;
    const int cv = blockIdx.y * TW + tx;
    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = (r0 + rows_per_block < M) ? r0 + rows_per_block : M;
    float acc[V];
    #pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
    if (ty < RP && cv < CV) {
        const uint4* py = reinterpret_cast<const uint4*>(y + (r0 + ty) * ldy) + cv;
        const uint4* pg = reinterpret_cast<const uint4*>(gy + (r0 + ty) * ldg) + cv;
        uint4* po = reinterpret_cast<uint4*>(g + (r0 + ty) * ldo) + cv;
        const long long sy = (long long)RP * (ldy / V), sg = (long long)RP * (ldg / V), so = (long long)RP * (ldo / V);
        #pragma unroll 4
        for (long long r = r0 + ty; r < r1; r += RP, py += sy, pg += sg, po += so) {
            const uint4 m = *py, q = *pg;
MASK
            *po = o;
        }
    }
BLOCK_PARTIALS
"""


def source(dtype: str, aliased: bool = False) -> str:
    """CUDA source of pass 1 for ``dtype`` (a key of :data:`~.colsum_vector.LANES`):
    ``opgraph_colsum_relu_part(y, gy, g, part, long long M, long long ldy, long long ldg,
    long long ldo, int CV, int TW, long long rows_per_block)`` (row pitches in elements). With
    ``aliased`` y, gy and g are not ``__restrict__``: g may be gy's buffer (an in-place step).
    Raises KeyError for another dtype."""
    return (_SOURCE.replace("BLOCK_PARTIALS\n", BLOCK_PARTIALS).replace("MASK", _MASK[dtype])
            .replace("STORE_T", _STORE_T[dtype]).replace("RESTRICT", "" if aliased else "__restrict__")
            .replace("LANES", str(LANES[dtype])).replace("THREADS", str(THREADS)))


@functools.lru_cache(maxsize=None)
def _kernel(dtype: str, aliased: bool = False):
    """Pass 1 compiled for ``dtype`` (one NVRTC module per dtype and aliasing, built on first use)."""
    import cupy
    return cupy.RawModule(code=source(dtype, aliased)).get_function("opgraph_colsum_relu_part")


def rows(a):
    """The ``(M, C)`` rows view of ``a`` (a view, never a copy), or None: a 4-D logical
    ``(N, C, H, W)`` array stored channels-last (dense or a channel slice: its pixels one pitch
    apart, ``pool_vector.pixel_pitch``) as ``(N*H*W, C)``; a 2-D ``(N, C)`` array as itself."""
    if a.ndim == 2:
        return a
    if a.ndim == 4 and pixel_pitch(a) is not None:
        return a.transpose(0, 2, 3, 1).reshape(-1, a.shape[1])  # pixels one pitch apart: a view
    return None


def declines_types(y, gy) -> str | None:
    """Why no array of the types ``y`` and ``gy`` (``TensorType``: the values as they run) can
    take the fused path, or None (the arrays' strides and alignment are checked when they run,
    :func:`declines`): the fallback is a ReLU gradient, a bias gradient and a copy, more than
    the two nodes unfused, so the fuse pass leaves such a pair alone."""
    if y.dtype not in LANES:
        return f"{y.dtype} has no 16-byte lanes here (the fused kernel takes {', '.join(LANES)})"
    if not (len(y.shape) == 2 or (len(y.shape) == 4 and y.layout == "NHWC" and gy.layout == "NHWC")):
        return f"{len(y.shape)}-D {y.layout} values: the fused kernel reads 2-D or channels-last 4-D rows"
    if y.shape[1] % LANES[y.dtype]:
        return f"{y.shape[1]} channels are not a multiple of the {LANES[y.dtype]} lanes of a 16-byte load"
    return None


def declines(y, gy) -> str | None:
    """Why :func:`relu_backward_sums` does not take ``(y, gy)``, or None: shapes or dtypes that
    differ, a dtype without 16-byte lanes (:data:`~.colsum_vector.LANES`: float16 and float64
    take the fallback), an array neither 2-D nor 4-D channels-last (NCHW), or rows that are not
    dense runs of 16-byte-aligned vectors (``colsum_vector.declines``: C not a multiple of the
    lanes, a row pitch or data pointer off 16 bytes), or no element."""
    if tuple(y.shape) != tuple(gy.shape):
        return f"y {tuple(y.shape)} and gy {tuple(gy.shape)} differ in shape"
    if y.dtype != gy.dtype:
        return f"y {dtype_name(y.dtype)} and gy {dtype_name(gy.dtype)} differ in dtype"
    for name, a in (("y", y), ("gy", gy)):
        r = rows(a)
        if r is None:
            return f"{name} of shape {tuple(a.shape)} is neither 2-D nor 4-D stored channels-last"
        why = colsum_vector.declines(r)
        if why is not None:
            return f"{name}: {why}"
    return None


#: The steps ``numpy.shares_memory`` may take towards an exact answer (its ``max_work``) before
#: :func:`shares_memory` gives the bounds' one; two channel slices of one buffer take one step,
#: and 10 000 steps take well under a millisecond.
MAX_WORK = 10_000
_TOO_HARD = np.exceptions.TooHardError if hasattr(np, "exceptions") else np.TooHardError


def _extent(a):
    """A NumPy array over ``a``'s bytes as ``numpy.shares_memory`` sees them: its first element's
    address (a CuPy array's device pointer alike), shape, strides and itemsize. Never read:
    ``shares_memory`` only does arithmetic on addresses."""
    return np.asarray(SimpleNamespace(__array_interface__={
        "version": 3, "shape": tuple(a.shape), "strides": tuple(a.strides), "typestr": f"|V{a.itemsize}",
        "data": (address(a), True)}))


def shares_memory(xp, a, b, max_work: int = MAX_WORK) -> bool:
    """Whether ``a`` and ``b`` (NumPy or CuPy arrays) share a byte: ``xp.may_share_memory``'s
    bounds first (what was asked alone before, so that two interleaved channel slices of one
    buffer counted as sharing), then ``numpy.shares_memory``'s exact answer on their addresses,
    shapes and strides (:func:`_extent`; no device work: ``cupy.shares_memory``'s exact test
    copies every element's address to the device and synchronises, which a captured step
    cannot), within ``max_work`` steps; beyond them the bounds' answer, True (conservative)."""
    if not xp.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(_extent(a), _extent(b), max_work=max_work))
    except _TOO_HARD:
        return True


def _same_memory(a, b) -> bool:
    """``a`` and ``b`` are views of the same elements: one first element, shape and strides."""
    return address(a) == address(b) and tuple(a.shape) == tuple(b.shape) and tuple(a.strides) == tuple(b.strides)


def out_is_gy(xp, y, gy, out) -> bool:
    """Whether ``out`` is gy's own memory (an in-place step: the pass-1 source without
    ``__restrict__``), after checking that it may be written at all: True where ``out`` has gy's
    first element and strides (and y is then gy's memory too or shares none of it), False where
    ``out`` is None or shares no memory with y or gy (:func:`shares_memory`: exact, so a channel
    slice of the buffer gy or y is another channel slice of may be ``out``; the bounds of the two
    arrays alone refused it).

    Raises:
        ValueError: ``out`` overlaps y or gy otherwise (another pitch or offset, or y's memory
        rather than gy's), or is gy's memory while y partly overlaps it: a thread would store
        where another has yet to load, so the result would depend on scheduling."""
    if out is None:
        return False
    where = "colsum_relu.relu_backward_sums: out"
    if _same_memory(out, gy):
        if not _same_memory(y, gy) and shares_memory(xp, y, gy):
            raise ValueError(f"{where} is gy's memory, which y partly overlaps: g would overwrite y "
                             "before every thread has read it; pass y and gy as one array or apart")
        return True
    for name, a in (("y", y), ("gy", gy)):
        if shares_memory(xp, out, a):
            raise ValueError(f"{where} overlaps {name} without being gy's own memory (its first element and "
                             f"strides: out {tuple(out.strides)} at {address(out):#x}, {name} "
                             f"{tuple(a.strides)} at {address(a):#x}): the kernel would race; pass gy itself "
                             "(in place) or an array sharing no memory with y or gy")
    return False


def _new_output(xp, y, storage_dtype):
    """``(g, g_rows)``: a new dense channels-last array of y's logical shape (``(N, C, H, W)``
    view of an ``(N, H, W, C)`` buffer, or ``(N, C)``) in ``storage_dtype``, and its rows."""
    if y.ndim == 4:
        n, c, h, w = y.shape
        buf = xp.empty((n, h, w, c), dtype=storage_dtype)
        return logical(buf, True), buf.reshape(-1, c)
    out = xp.empty(y.shape, dtype=storage_dtype)
    return out, out


def relu_backward_sums(xp, y, gy, sums=None, loads_per_thread: int = LOADS_PER_THREAD, out=None):
    """``(g, sums)``: ``g = ReluBackward(y, gy)`` (gy's bits where ``y > 0``, else +0.0; y's
    logical shape, dense channels-last, gy's dtype) and its per-channel sums ``(C,)`` in gy's
    dtype (float32 sums rounded once), in one read of y and gy.

    Args:
        y, gy: bfloat16 or float32 arrays of one shape and dtype that :func:`declines` takes.
        sums: the ``(C,)`` array to write the sums into (contiguous, gy's dtype), or None for a
            new one.
        loads_per_thread: pass 1's geometry (``colsum_vector.grid``).
        out: the array ``g`` is written into, through its own row pitch, and returned as ``g``:
            gy's own memory (an in-place step: each thread reads its vectors of y and gy before it
            stores to the same address; its first element and strides, :func:`out_is_gy`) or an
            array sharing no memory with y or gy; y's shape and gy's dtype, rows :func:`declines`
            takes. None: a new dense channels-last array.

    Raises:
        ShapeError: :func:`declines` gives a reason for ``(y, gy)`` or ``(y, out)`` (the caller
        asks it first and falls back), or ``sums`` is not a contiguous ``(C,)`` array of gy's dtype.
        ValueError: ``out`` overlaps y or gy without being gy's memory (:func:`out_is_gy`).
    """
    why = declines(y, gy) or (None if out is None else declines(y, out))
    if why is not None:
        raise ShapeError(f"colsum_relu.relu_backward_sums: {why}")
    return _fused(xp, y, gy, sums, loads_per_thread, out, out_is_gy(xp, y, gy, out))


def _fused(xp, y, gy, sums, loads_per_thread: int = LOADS_PER_THREAD, out=None, aliased: bool = False):
    """:func:`relu_backward_sums` on arrays :func:`declines` has taken (asked once per call);
    ``aliased``: ``out`` is gy's memory (:func:`out_is_gy`, asked by the caller)."""
    dtype = dtype_name(gy.dtype)
    v = LANES[dtype]
    yr, gr = bits(xp, rows(y)), bits(xp, rows(gy))
    m, c = gr.shape
    if sums is None:
        sums = unbits(xp.empty(c, dtype=gr.dtype), gy.dtype)
    elif tuple(sums.shape) != (c,) or sums.dtype != gy.dtype or not sums.flags.c_contiguous:
        raise ShapeError(f"colsum_relu.relu_backward_sums: sums {sums.dtype} {tuple(sums.shape)} is not a "
                         f"contiguous ({c},) {dtype}")
    g, g_rows = _new_output(xp, y, gr.dtype) if out is None else (out, bits(xp, rows(out)))
    groups, tw, rows_per_block = colsum_vector.grid(m, c // v, loads_per_thread)
    part = xp.empty((groups, c), dtype=xp.float32)
    tiles = -(-(c // v) // tw)
    _kernel(dtype, aliased)(
        (groups, tiles), (THREADS,),
        (yr, gr, g_rows, part, xp.int64(m), xp.int64(yr.strides[0] // yr.itemsize),
         xp.int64(gr.strides[0] // gr.itemsize), xp.int64(g_rows.strides[0] // g_rows.itemsize),
         xp.int32(c // v), xp.int32(tw), xp.int64(rows_per_block)))
    colsum_vector.finish(xp, part, bits(xp, sums), dtype)
    return (g if out is not None else unbits(g, gy.dtype)), sums


# ---- node kernels (ctx, op, *arrays) of opgraph/ops/relu_bias_sums.py

def relu_backward_sums_slot_kernel(ctx, op, y, gy):
    """``ReluBackwardSumsSlot`` node: a new uninitialised contiguous ``(C,)`` array in the node's
    dtype (``ctx.out_type``; without one, gy's), which the node's ``ReluBackwardSums`` reader
    fills. No kernel runs (capturable: an allocation from the current pool); bfloat16 is
    allocated as its uint16 bits and viewed."""
    dtype = numpy_dtype(ctx.out_type.dtype) if ctx.out_type is not None else gy.dtype
    (c,) = ctx.out_shape(op, y, gy)
    return unbits(ctx.xp.empty(c, dtype=ctx.xp.uint16 if dtype_name(dtype) == "bfloat16" else dtype), dtype)


def relu_backward_sums_kernel(ctx, op, y, gy, sums, *, out=None):
    """``ReluBackwardSums`` node: ``g = ReluBackward(y, gy)`` returned and its per-channel sums
    written into ``sums`` in place (float32 rounded once to sums' dtype). The fused kernels
    (:func:`relu_backward_sums`) where :func:`declines` gives no reason (for ``out`` too) and
    ``sums`` is a contiguous ``(C,)`` of gy's dtype; else ``relu.relu_backward`` then the bias
    gradient's column sums (``colsum.bias_add_backward``) copied into ``sums`` (NCHW, float16,
    float64, an unaligned slice, C not a multiple of the lanes). ``out``: gy itself for an
    in-place step (``rules.INPLACE``: position 1, never the slot), or an array sharing no memory
    with y or gy (:func:`out_is_gy`), written through its own strides and returned; the sums are
    those of ``g`` as written either way.

    Raises:
        ShapeError: y and gy of different shapes, or sums not ``(C,)``.
        ValueError: ``out`` overlaps y or gy without being gy's memory, on either path."""
    c = gy.shape[1] if gy.ndim >= 2 else None
    if tuple(sums.shape) != (c,):
        raise ShapeError(f"relu_backward_sums: sums {tuple(sums.shape)} is not ({c},) for gy {tuple(gy.shape)}")
    xp = ctx.xp
    aliased = out_is_gy(xp, y, gy, out)  # the fallback's elementwise kernel would race as well
    if (declines(y, gy) is None and (out is None or declines(y, out) is None) and sums.dtype == gy.dtype
            and sums.flags.c_contiguous):
        return _fused(xp, y, gy, sums, out=out, aliased=aliased)[0]
    g = relu.relu_backward(xp, y, gy, out=out)
    s = colsum.bias_add_backward(xp, g)
    if s.dtype == sums.dtype:
        bits(xp, sums)[...] = bits(xp, s)  # bfloat16 copied as its bits (CuPy may not copy bfloat16)
    else:
        sums[...] = s
    return g


__all__ = ["declines_types", "declines", "out_is_gy", "shares_memory", "MAX_WORK", "relu_backward_sums", "relu_backward_sums_kernel",
           "relu_backward_sums_slot_kernel", "rows", "source"]
