"""Channels-last max and average pooling, 16 bytes of channels per thread.

Why: the H200 profile of 2026-12-03 (docs/results/h200-2026-12-03b,
``call1-profile-bf16-winners.json``) has :mod:`.pool`'s kernels, one thread
per element with a 2-byte load per window cell, at 6-14 % of the copy
bandwidth: 7.9 of GoogLeNet's 15.3 ms of steps and 3.7 of VGG-A's 8.9 ms
were max pooling. Here each thread owns ``V`` consecutive channels of one
pixel (``V = 16 / itemsize``: 8 bfloat16, 4 float32) and moves them as one
16-byte word, so a warp reads whole lines of the NHWC rows.

Semantics are :mod:`.pool`'s (SEMANTICS.md, Pooling), lane by lane and bit
for bit: the window is scanned from its first in-bounds cell in row-major
order, a strictly greater value or the first NaN replaces the best (padding
never wins), the output is the winner's bits, and a gradient goes to the
first maximum; overlapping windows' gradients are summed in float32 in
window order (``oh``, then ``ow``) and rounded once.

* :func:`max_pool2d` — one kernel: thread ``(n, oh, ow, c / V)`` scans its
  window and writes ``y``; with ``pixels = P`` (an autotune variant), thread
  ``(n, oh, ow / P, c / V)`` scans ``P`` neighbouring windows of a row,
  loading the cells they share once;
* :func:`max_pool2d_backward` (``relu``: ``MaxPool2dBackwardRelu``, x being
  a ReLU's output, whose mask is the winner's value ``> 0``) — two kernels:
  the window scan again, writing each window's winner as a 1-byte window
  index (plus 128 where the winner fails the ReLU mask), then thread ``(n, h, w, c / V)``
  gathers ``gy`` from every window covering its pixel whose index names it
  (no atomics: deterministic). Reads x, gy and the indices once (the
  window overlap hits the caches), writes gx once;
* :func:`avg_pool2d`, :func:`avg_pool2d_backward` — :mod:`.pool`'s average
  kernels lane by lane (window sums in float32 in row-major order, one
  division by the divisor, one rounding; the backward gathers ``gy / divisor``
  from the covering windows in order). DenseNet-121's transitions (2x2/2)
  ran at 9-10 % of the copy bandwidth on the scalar kernels.

Operands are NHWC at a pixel pitch (the elements between two pixels: ``C``
for a dense tensor, more for a channel slice of a wider concat buffer, which
GoogLeNet's zero-copy concat backward hands the pool as its ``gy``), 16-byte
aligned, ``C`` a multiple of ``V``; :func:`applies` says whether a call
qualifies, and the ``cuda`` rules offer this path as the ``vector`` autotune
variant only where it does (``rules.pool_variants``). Kernels are compiled
through CuPy by source text (``codegen.launch.compiled``), so the tests run
them on the CPU emulator.

**The ``tile`` variant** (REVISION 9; ``rules.vector_pool_variants`` offers
``{"vector": True, "tile": True}`` for the bfloat16 scan and gather of windows
and strides up to :data:`TILE_WINDOW`): :func:`_scan_tile` and
:func:`_gather_tile`. Where the pair kernels stood (H200, GoogLeNet bf16
batch 128, docs/results/h200-2026-12-04c): the scan at 41 % and the gather
at 37 % of the copy bandwidth (4.23 TB/s) over the step, the inception
pools' 3x3/1 scans at about 25 % (3a: 0.053 ms for 58 MB); ncu: ALU 60 %
busy, occupancy 45 %, DRAM far from saturated. Counting instructions
(SASS of both kernels from nvcc 13.0 for sm_90, their fast paths, static
counts per thread's item): a 3x3/1 scan spent about 430 instructions per
output and 16-byte word of channels, 250 of them on the ALU pipe,
which issues a warp instruction every other cycle: at GoogLeNet's sizes that
is 2/3 of the kernel time, so the ALU, and the latency of nine dependent
16-byte loads from L1/L2 per output, bound the kernel, not DRAM. The options
weighed:

* more loads in flight per thread, ``__launch_bounds__`` or fewer registers:
  the pair kernels already issue a window's nine loads back to back (52
  registers, no spills); neither removes ALU work, so at most 10-20 %;
* a shared-memory tile of input rows plus halo per block, loaded once,
  coalesced, then scanned from shared memory: taken. Its gains are in the
  instruction count more than in the bytes: padding is staged as -inf, so
  the compute loops have no bounds tests and every shared-memory address is
  the thread's base plus a constant; the window's maximum and first maximum
  are separable, so each tile row's best over a window's ``KW`` columns is
  computed once and shared by the ``KH / SH`` outputs that hold that row (a
  3x3/1 output costs 9/7 row bests of 2 compares each plus 3 compares down,
  instead of 9 compares);
  indices live in tile coordinates and the first in-bounds cell of a window
  is one integer. SASS of the fast path per output and word: 3x3/1 430 → 160
  instructions (ALU 250 → 110), 3x3/2 430 → 250 (ALU 250 → 150), 2x2/2 300 →
  170 (ALU 160 → 100). Each input word crosses L2 once plus the halo (3x3/1:
  1.5x the input with 7 x 14 output tiles), where the pair scan fetched it
  once per output row whose window holds it (3x) wherever L1 missed;
* the gather from a tile of the covering windows' index bytes and gradients:
  taken. The loader turns each window's 8 index bytes into bfloat16 pairs
  (``prmt``: byte ``k`` becomes the half ``k << 8 | 0x80``, a distinct normal
  number or infinity, never a zero or a NaN), windows outside the pooled
  extent into NaN pairs; a pixel then tests a window with one
  ``set.eq.bf16x2`` per pair of lanes against a constant (the zero-byte test
  and its ``prmt`` in the pair gather: 3 instructions per pair), and the 8
  float32 sums go back to bfloat16 two per ``cvt.rn.bf16x2.f32`` unless one
  is NaN. Per input pixel and word: 3x3/1 680 → 390 instructions (ALU 370 →
  200), 3x3/2 440 → 210, 2x2/2 270 → 145.

Expected on the H200 (not measured yet; ``scripts/pool_variant_bench.py``):
the 3x3/1 scans 2-2.5x faster (3a 0.053 → about 0.022 ms, about 60 % of the
copy bandwidth, where DRAM and the tile's load phase take over), the 3x3/1
and 3x3/2 gathers 1.6-1.9x (3a 0.066 → about 0.036 ms), the 3x3/2 scans
1.1-1.3x (pool2 was at 58 % already), VGG's 2x2/2 1.2-1.5x; GoogLeNet's
pooling steps (argmax 0.535 + gather 0.829 ms) about 0.5 ms less. What
could hold it back: the tile's load phase waits for a block's loads before
any compare (other blocks on the SM overlap it: 10-32 KiB and 32-80
registers per thread, 6-16 blocks per SM), and the 3x3/1 gather's 32 bytes
of shared memory per window and 80 registers leave it 6 blocks of 112
threads per SM (a third of the SM's threads). The tiles' sizes
(:func:`tile_shape`) are reasoned, not measured: ``--sweep`` of the bench
times others.

**The tile take** (REVISION 10; offered as the same ``{"vector": True, "tile":
True}`` variant of ``MaxPool2dTake``, with the same limits): :func:`_take_tile`,
y = x at each lane's saved winner from the tile scan's staging of x
(:func:`_stage_tile`: 16-byte coalesced loads of the input rows plus halo,
-inf outside), instead of :func:`_take_bits`' 8 scattered 2-byte loads per
thread from global memory; :func:`_take_bits`' bits. Expected 1.2-1.4x on
GoogLeNet's takes (0.42 → about 0.32 ms a step; reasoning in its docstring).
"""

from __future__ import annotations

import functools
import math

import attrs

from opgraph.ops.pool_indices import MASKED

from ..reference.pool import PoolGeometry
from ..reference.pool_indices import MAX_WINDOW_CELLS
from .codegen.launch import address, compiled
from .codegen.storage import DEVICE_HELPERS, lit, storage_of, vector_load, vector_store
from .storage import bits

#: the kernels' revision, part of the autotune cache key of the ``vector``
#: variant (``rules.vector_pool_variants``): 1 run-time window loops, 2 unrolled,
#: 3 the max-pool scans over several output columns per thread (``pixels``), 4 the
#: ReLU mask as a mark added to the index (128) instead of the byte 255, 5 the
#: bfloat16 window scan and gather two lanes at a time (``_scan_pairs``, ``_gather_pairs``)
#: and a 1 x 1 plane read at its image stride (``pixel_pitch``), 6 one item per thread
#: (``LAUNCH``), 7 the bfloat16 take moves bits (``_take_bits``), the gather masks two
#: lanes per ``prmt``, 8 the bfloat16 gather compares whole index bytes (windows of
#: 129-255 cells) and the take quiets a signalling NaN as the other kernels do, 9 the
#: ``tile`` variant: the bfloat16 scan and gather from shared-memory tiles (``_scan_tile``,
#: ``_gather_tile``), 10 the ``tile`` variant of the bfloat16 take (``_take_tile``: x staged as
#: the tile scan stages it, ``_stage_tile``, each lane's winner read from shared memory)
REVISION = 10
#: the output columns per thread that autotune tries for the max-pool window
#: scans (``rules.vector_pool_variants``): neighbouring windows of a 3x3/1 pool
#: share 6 of their 9 cells, of a 3x3/2 pool 3, which one thread loads once
PIXELS = (1, 2, 4)
#: dtypes with a vector path (others keep :mod:`.pool`'s kernels)
DTYPES = ("bfloat16", "float32")
THREADS = 256
#: grid-stride loops: at most this many blocks (8 per SM of an H200)
MAX_BLOCKS = 1056
#: the most blocks of a launch's x dimension (CUDA's grid limit)
GRID_X_LIMIT = 2 ** 31 - 1
#: kernels launched otherwise: ``(kind, dtype) -> (threads per block, block cap)``.
#: The bfloat16 pair kernels wait on their loads more than on the ALU (ncu, H200,
#: 2026-12-04: the ALU 60 % busy, occupancy 45 %), and a thread that loops over
#: several items waits for each: one item per thread (no cap) ran GoogLeNet's
#: scans 3-10 % and gathers 6-28 % faster, the scans with 128-thread blocks
#: (docs/results/h200-2026-12-04c/call3/a-pool-launch.log). float32 was not measured.
LAUNCH = {("arg", "bfloat16"): (128, GRID_X_LIMIT), ("bwd", "bfloat16"): (256, GRID_X_LIMIT)}
#: the most cells a window whose winners are indexed may have: a byte's values
#: (``MaxPool2dBackward``); with the ReLU mark (``MaxPool2dBackwardRelu``, the
#: saved-winner ops), ``MASKED`` (``opgraph.ops.pool_indices``: added to a window's
#: index where its winner fails ReLU's mask). The other kernels scan windows of any size.
MAX_CELLS = MAX_WINDOW_CELLS


def lanes(dtype: str) -> int:
    """V: the elements of ``dtype`` in one 16-byte word."""
    return 16 // storage_of(dtype).itemsize


def pixel_pitch(a) -> int | None:
    """The elements between two consecutive pixels of ``a`` (logical NCHW, stored
    channels-last: a dense NHWC tensor or a channel slice of one), or None when
    ``a`` is not stored that way."""
    n, c, h, w = a.shape
    sn, sc, sh, sw = (s // a.itemsize for s in a.strides)
    if any(s % a.itemsize for s in a.strides) or (c > 1 and sc != 1):
        return None
    # the stride of an extent of 1 is arbitrary (NumPy and CuPy differ): a 1 x 1
    # plane's pixels are its images, one row's pixels its columns
    pitch = sw if w > 1 else sh if h > 1 else sn if n > 1 else c
    if (h > 1 and sh != w * pitch) or (n > 1 and sn != h * w * pitch) or pitch < c:
        return None
    return pitch


def declines(dtype: str, channels: int, kernel, max_cells: int | None = None) -> str | None:
    """Why the vector kernels cannot pool ``channels`` channels of ``dtype`` with a
    ``kernel`` window whatever the storage (None: they can): the one check of
    the types, shared by :func:`applies` and the ``cuda`` rules' variants.
    ``max_cells``: the kernels index each window's winner in a byte, so its
    window may have at most this many cells (:data:`MAX_CELLS`, :data:`MASKED`)."""
    if dtype not in DTYPES:
        return f"dtype {dtype} (vector kernels: {', '.join(DTYPES)})"
    if max_cells is not None and kernel[0] * kernel[1] > max_cells:
        return f"a {tuple(kernel)} window's winner does not fit a byte index of {max_cells} cells"
    if channels % lanes(dtype):
        return f"channels {channels} not a multiple of {lanes(dtype)}"
    return None


def applies(g: PoolGeometry, *arrays, max_cells: int | None = None) -> str | None:
    """None when the vector kernels take these operands (module docstring):
    :func:`declines` says nothing against their type, and each is 4-D, stored
    channels-last at a pixel pitch that divides by V and 16-byte aligned;
    else why not."""
    dtype = arrays[0].dtype.name
    v = lanes(dtype) if dtype in DTYPES else 1
    for a in arrays:
        why = declines(a.dtype.name, a.shape[1] if a.ndim == 4 else 0, g.kernel, max_cells)
        if why or a.dtype.name != dtype:
            return why or f"mixed dtypes {dtype} and {a.dtype.name}"
        pitch = pixel_pitch(a) if a.ndim == 4 else None
        if pitch is None:  # (a 1 x 1 plane counts: its NHWC and NCHW strides agree)
            return "an operand not stored channels-last"
        if pitch % v or address(a) % 16:
            return f"pitch {pitch} not a multiple of {v}, or not 16-byte aligned"
    return None


def _padding(g: PoolGeometry, include_pad: bool = False) -> tuple:
    """The window's run-time ints every kernel takes: ``pt, pl, pb, pr, inc``
    (its size and stride are compiled in: :func:`_source`)."""
    (pt, pb), (pl, pr) = g.padding
    return (pt, pl, pb, pr, int(include_pad))


#: the window's run-time parameters of every kernel (``_padding``)
_PADDING = "int pt, int pl, int pb, int pr, int inc"

#: an average pooling window's divisor (SEMANTICS.md, Pooling): the cells of
#: window ``(h0, w0)`` inside the input, plus explicit padding when
#: ``include_pad`` (count_include_pad), never the ceil_mode overhang; used by
#: these kernels and ``pool.py``'s (needs ``IDX``)
DIVISOR = """
__device__ IDX divisor(IDX h0, IDX w0, IDX H, IDX W, IDX kh,
                             IDX kw, IDX pt, IDX pb, IDX pl, IDX pr,
                             bool include_pad) {
    const IDX lh = include_pad ? -pt : 0, uh = include_pad ? H + pb : H;
    const IDX lw = include_pad ? -pl : 0, uw = include_pad ? W + pr : W;
    const IDX a0 = h0 > lh ? h0 : lh, a1 = h0 + kh < uh ? h0 + kh : uh;
    const IDX b0 = w0 > lw ? w0 : lw, b1 = w0 + kw < uw ? w0 + kw : uw;
    return (a1 - a0) * (b1 - b0);
}
"""

#: The window's size and stride are compile-time constants of each kernel
#: (``KH``, ``KW``, ``SH``, ``SW``: a model has a few pooling shapes), so the
#: cell and window loops below unroll and every thread issues its window's
#: loads back to back. With run-time bounds each iteration waited for its own
#: load: the H200 profile of 2026-12-03 (docs/results/h200-2026-12-03c) had
#: the stem's 3x3/2 max pooling of ResNet-50 at 37 % of the copy bandwidth
#: forward and 17 % backward, DenseNet-121's at 9 % and 17 %, its 2x2
#: average pooling at 9 %. Out-of-bounds cells are skipped by a test on the
#: unrolled indices, so the scan order (row-major, from the first in-bounds
#: cell) is the run-time loops' and the results are bit for bit the same.

#: the windows covering input pixel (p, q): rows oh0..oh1, columns ow0..ow1
#: (at most ``MH x MW`` of them: ceil(KH / SH) x ceil(KW / SW), and at most the
#: pooled extent: ``_source``)
_COVERING = [
    "const int hp = (int)p + pt, wp = (int)q + pl;",
    "const int oh0 = hp < KH ? 0 : (hp - KH) / SH + 1, ow0 = wp < KW ? 0 : (wp - KW) / SW + 1;",
    "const int oh1 = hp / SH < (int)OH - 1 ? hp / SH : (int)OH - 1;",
    "const int ow1 = wp / SW < (int)OW - 1 ? wp / SW : (int)OW - 1;"]

#: output pixel (p, q)'s window: its first cell (h0, w0), possibly outside the input
_WINDOW = [
    "const int h0 = (int)p * SH - pt, w0 = (int)q * SW - pl;",
    "const IDX xb = n * H * W * XP + cv * V;"]


def _over_window(body: list[str]) -> list[str]:
    """``body`` for every in-bounds input cell ``(h, w)`` of the window
    (``_WINDOW``), row-major, ``k`` its window index; unrolled."""
    return ["#pragma unroll", "for (int dh = 0; dh < KH; ++dh) {", "    #pragma unroll",
            "    for (int dw = 0; dw < KW; ++dw) {",
            "        const int h = h0 + dh, w = w0 + dw, k = dh * KW + dw;",
            "        if (h < 0 || h >= (int)H || w < 0 || w >= (int)W) continue;",
            *("        " + line for line in body), "    }", "}"]


def _over_covering(body: list[str]) -> list[str]:
    """``body`` for every window ``(oh, ow)`` covering the pixel (``_COVERING``), in order; unrolled."""
    return ["#pragma unroll", "for (int i = 0; i < MH; ++i) {", "    const int oh = oh0 + i;",
            "    #pragma unroll", "    for (int j = 0; j < MW; ++j) {", "        const int ow = ow0 + j;",
            "        if (oh > oh1 || ow > ow1) continue;",
            *("        " + line for line in body), "    }", "}"]


def _sums(v: int) -> str:
    return " ".join(f"CT a{j} = 0;" for j in range(v))


def _byte_word(v: int) -> str:
    """The integer holding V window-index bytes (V-aligned)."""
    return "unsigned long long" if v == 8 else "unsigned int"


_OUT_PIXEL = "((n * QH + p) * QW + q) * C + cv * V"  # the (dense) output of the thread's pixel


def _scan(st, v: int, kind: str, relu: bool, pixels: int = 1) -> tuple[list[str], str]:
    """Max pooling's window scan (``fwd``: store the maximum; ``arg``: its window
    index): the first in-bounds cell starts the scan, then a strictly greater
    value or the first NaN replaces the best.

    ``pixels`` (``P``): the thread scans the windows of ``P`` consecutive output
    columns ``q * P + i`` of one row. The cells they share (``KW - SW`` columns
    between neighbours, the whole window but one column for a 3x3/1 pool) are
    loaded once: a row of ``(P - 1) * SW + KW`` cells instead of ``P * KW``.
    Each output still sees its own cells in row-major order, so the result is
    bit for bit the one-pixel scan's."""
    cell, cell_lanes = vector_load(st, "x", "xb + ((IDX)h * W + w) * XP", v, "c")

    def best(i: int, j: int) -> str:
        return f"b{i}_{j}"

    def update(i: int) -> list[str]:  # output i's lanes, for a cell of its window (cw - i * SW = dw)
        return [f"if (cw - {i} * SW >= 0 && cw - {i} * SW < KW) {{",
                f"    const int k = dh * KW + cw - {i} * SW;",
                *(f"    {{ const CT e = {e}; if (!have{i} || e > {best(i, j)} || (e != e && {best(i, j)} == "
                  f"{best(i, j)})) {{ {best(i, j)} = e; k{i}_{j} = k; }} }}" for j, e in enumerate(cell_lanes)),
                f"    have{i} = true;", "}"]

    body = ["const int h0 = (int)p * SH - pt, w0 = (int)q * PIX * SW - pl;",
            "const IDX xb = n * H * W * XP + cv * V;",
            *(f"bool have{i} = false;" for i in range(pixels)),
            *(f"CT {best(i, j)} = (CT)0; int k{i}_{j} = 0;" for i in range(pixels) for j in range(v)),
            "#pragma unroll", "for (int dh = 0; dh < KH; ++dh) {",
            "    const int h = h0 + dh;", "    if (h < 0 || h >= (int)H) continue;",
            "    #pragma unroll", "    for (int cw = 0; cw < (PIX - 1) * SW + KW; ++cw) {",
            "        const int w = w0 + cw;", "        if (w < 0 || w >= (int)W) continue;",
            *("        " + line for line in cell),
            *("        " + line for i in range(pixels) for line in update(i)), "    }", "}"]
    word = _byte_word(v)
    for i in range(pixels):
        body += [f"if (q * PIX + {i} < QW) {{",
                 f"    const IDX o = ((n * QH + p) * QW + q * PIX + {i}) * C + cv * V;"]
        if kind == "fwd":
            body += ["    " + line for line in vector_store(st, "y", "o", [best(i, j) for j in range(v)], f"y{i}")]
        else:
            marks = [f"({best(i, j)} > (CT)0 ? k{i}_{j} : (k{i}_{j} | {MASKED}))" if relu else f"k{i}_{j}"
                     for j in range(v)]
            body.append(f"    *reinterpret_cast<{word}*>(arg + o) = "
                        + " | ".join(f"(({word}){m} << {8 * j})" for j, m in enumerate(marks)) + ";")
        body.append("}")
    if kind == "fwd":
        return body, f"{st.ctype}* __restrict__ y"
    return body, "unsigned char* __restrict__ arg"


#: bfloat16 pairs (``og_bf2_*``: two lanes in one 32-bit word, lane 2j in the low
#: half): NaN-propagating maximum, and ``0xffff`` per half where ``a > b`` or where
#: ``a`` is NaN; ``og_pair_mask(z, b)``: ``0xffff`` in the low half where byte ``b``
#: of ``z`` has its top bit set, in the high half where byte ``b + 1`` has. On
#: sm_90 each is one instruction (PTX ``max.NaN.bf16x2``,
#: ``set.gt.u32.bf16x2``, ``set.nan.u32.bf16x2``, ``prmt`` replicating a byte's
#: sign); elsewhere, and on the tests' CPU emulator (``OPGRAPH_CPU``), the same
#: results from each half's float. Source: PTX ISA 8.x, "Half Precision
#: Comparison Instructions: set" (``.u32`` with ``.bf16x2``: 0xffff per true half,
#: sm_90), "max" (``.NaN``: a NaN operand gives the canonical NaN, sm_80) and
#: "prmt" (the default mode: a selector nibble's bit 3 replicates the chosen
#: byte's sign bit); ``og_pair_mask`` takes an even ``b``.
PAIR_HELPERS = r"""
#if !defined(OPGRAPH_CPU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned int og_bf2_max(unsigned int a, unsigned int b) {
    unsigned int d; asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
__device__ __forceinline__ unsigned int og_bf2_gt(unsigned int a, unsigned int b) {
    unsigned int d; asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
__device__ __forceinline__ unsigned int og_bf2_nan(unsigned int a) {
    unsigned int d; asm("set.nan.u32.bf16x2 %0, %1, %1;" : "=r"(d) : "r"(a)); return d;
}
__device__ __forceinline__ unsigned int og_pair_mask(unsigned int z, unsigned int b) {
    unsigned int d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(z), "r"(0u), "r"((8u + b) * 0x11u | (9u + b) * 0x1100u));
    return d;
}
#else
__device__ __forceinline__ unsigned int og_pair_mask(unsigned int z, unsigned int b) {
    return (((z >> (8u * b + 7u)) & 1u) ? 0xffffu : 0u) | (((z >> (8u * b + 15u)) & 1u) ? 0xffff0000u : 0u);
}
__device__ __forceinline__ float og_bf_half(unsigned int w, int high) {
    return __uint_as_float(high ? (w & 0xffff0000u) : (w << 16));
}
__device__ __forceinline__ unsigned int og_bf2_max(unsigned int a, unsigned int b) {
    unsigned int d = 0;
    for (int high = 0; high < 2; ++high) {
        const float x = og_bf_half(a, high), y = og_bf_half(b, high);
        const unsigned int half = (x != x || y != y) ? 0x7fffu : (((x > y ? a : b) >> (16 * high)) & 0xffffu);
        d |= half << (16 * high);
    }
    return d;
}
__device__ __forceinline__ unsigned int og_bf2_gt(unsigned int a, unsigned int b) {
    return (og_bf_half(a, 0) > og_bf_half(b, 0) ? 0xffffu : 0u)
         | (og_bf_half(a, 1) > og_bf_half(b, 1) ? 0xffff0000u : 0u);
}
__device__ __forceinline__ unsigned int og_bf2_nan(unsigned int a) {
    const float x = og_bf_half(a, 0), y = og_bf_half(a, 1);
    return (x != x ? 0xffffu : 0u) | (y != y ? 0xffff0000u : 0u);
}
#endif
"""


def _scan_pairs(v: int, relu: bool, pixels: int, slow: list[str]) -> list[str]:
    """The ``arg`` scan of bfloat16 lanes two at a time (:data:`PAIR_HELPERS`).

    Why: the H200's counters (ncu, 2026-12-04, GoogLeNet's pools) had the lane
    by lane scan bound by the ALU pipe (82-86 % busy, 12 % of the copy
    bandwidth for a 3x3/1 pool): each lane and cell cost about eight compares
    and selects. Here a cell costs three instructions per pair of lanes: the
    mask of lanes it beats strictly (``og_bf2_gt``), the new maximum, and the
    new index where the mask is set (a ``LOP3``). The best starts at -inf and
    the index at the window's first in-bounds cell, so that cell wins unless a
    later one is strictly greater: :func:`_scan`'s result whenever no lane
    meets a NaN. A NaN propagates into the maximum (``max.NaN``); a thread
    whose maxima hold one runs ``slow`` (:func:`_scan`'s statements), which
    gives the first NaN's index, so every result is bit for bit the lane by
    lane scan's."""
    words, word = v // 2, _byte_word(v)
    cell = [f"const uint4 c = *reinterpret_cast<const uint4*>(x + xb + ((IDX)h * W + w) * XP);",
            "const unsigned int words[4] = {c.x, c.y, c.z, c.w};"]

    def update(i: int) -> list[str]:
        lines = [f"if (cw - {i} * SW >= 0 && cw - {i} * SW < KW) {{",
                 f"    const unsigned int kk = (unsigned int)(dh * KW + cw - {i} * SW) * 0x00010001u;"]
        for j in range(words):
            lines += [f"    {{ const unsigned int gt = og_bf2_gt(words[{j}], bp{i}_{j}); "
                      f"bp{i}_{j} = og_bf2_max(words[{j}], bp{i}_{j}); kp{i}_{j} = (gt & kk) | (~gt & kp{i}_{j}); }}"]
        return lines + ["}"]

    body = ["const int h0 = (int)p * SH - pt, w0 = (int)q * PIX * SW - pl;",
            "const IDX xb = n * H * W * XP + cv * V;",
            "const int fh = h0 < 0 ? -h0 : 0;  // the windows' first in-bounds row"]
    for i in range(pixels):  # the window's first in-bounds cell, in both halves
        body += [f"const unsigned int kf{i} = (unsigned int)(fh * KW + (w0 + {i} * SW < 0 ? -(w0 + {i} * SW) : 0))"
                 " * 0x00010001u;",
                 *(f"unsigned int bp{i}_{j} = 0xff80ff80u, kp{i}_{j} = kf{i};" for j in range(words))]
    body += ["#pragma unroll", "for (int dh = 0; dh < KH; ++dh) {",
             "    const int h = h0 + dh;", "    if (h < 0 || h >= (int)H) continue;",
             "    #pragma unroll", "    for (int cw = 0; cw < (PIX - 1) * SW + KW; ++cw) {",
             "        const int w = w0 + cw;", "        if (w < 0 || w >= (int)W) continue;",
             *("        " + line for line in cell),
             *("        " + line for i in range(pixels) for line in update(i)), "    }", "}",
             "const unsigned int has_nan = " + " | ".join(f"og_bf2_nan(bp{i}_{j})" for i in range(pixels)
                                                      for j in range(words)) + ";",
             "if (has_nan) {", *("    " + line for line in slow), "} else {"]
    for i in range(pixels):
        ks = [f"kp{i}_{j}" for j in range(words)]
        if relu:  # MASKED where the winner is not > 0
            ks = [f"(kp{i}_{j} | (~og_bf2_gt(bp{i}_{j}, 0u) & {MASKED * 0x10001:#x}u))" for j in range(words)]
        # each lane's index is its half's low byte
        packed = [f"((({word})({k}) & 0xffu) << {16 * j}) | ((({word})({k}) & 0xff0000u) >> 8 << {16 * j})"
                  for j, k in enumerate(ks)]
        body += [f"    if (q * PIX + {i} < QW) {{",
                 f"        const IDX o = ((n * QH + p) * QW + q * PIX + {i}) * C + cv * V;",
                 f"        *reinterpret_cast<{word}*>(arg + o) = " + " | ".join(f"({t})" for t in packed) + ";",
                 "    }"]
    return body + ["}"]


def _gather(st, v: int, masked: bool = True) -> list[str]:
    """Max pooling's backward: gy of every covering window whose index names the
    pixel (``masked``: a marked index names none; else its mark is stripped).
    gy is loaded whether or not a lane matches, so that a thread's loads of
    indices and gradients do not wait on each other (the gradient of a window
    read up to ceil(KH / SH) x ceil(KW / SW) times hits the caches)."""
    g, g_lanes = vector_load(st, "gy", "P * GP + cv * V", v, "g")  # gy at its own pitch
    word = _byte_word(v)
    bits_of_index = "0xff" if masked else f"0x{MASKED - 1:x}"
    lane = [f"((m >> {8 * j}) & {bits_of_index}) == me" for j in range(v)]
    return [*_COVERING, _sums(v),
            *_over_covering(["const IDX P = (n * OH + oh) * OW + ow;",
                             "const int me = (hp - oh * SH) * KW + (wp - ow * SW);",
                             f"const {word} m = *reinterpret_cast<const {word}*>(arg + P * C + cv * V);",
                             *g, *(f"if ({t}) a{j} += {e};" for j, (t, e) in enumerate(zip(lane, g_lanes)))]),
            *vector_store(st, "gx", _OUT_PIXEL, [f"a{j}" for j in range(v)], "s")]


def _gather_pairs(masked: bool) -> list[str]:
    """:func:`_gather` for 8 bfloat16 lanes, a 4-byte word of indices at a time.

    Why: the lane by lane gather was bound by the ALU pipe on the H200 (77 %
    busy; ncu, docs/results/h200-2026-12-04c/call1/c-ncu.log.gz): a byte
    extract, a compare and a select per lane and window. Here a window's 8
    index bytes are compared with the pixel's index ``me`` four at a time, by
    the exact zero-byte test (Hacker's Delight, 2nd ed., section 6-1): with
    ``x = m ^ me`` (``masked``: a marked byte, top bit set, never equals an
    index below 128; not ``masked``: the mark cleared first, ``& 0x7f...``),
    ``~(((x & 0x7f...) + 0x7f...) | x)`` has a byte's top bit set exactly where
    that byte of ``x`` is zero (no carry crosses a byte). Each pair of lanes
    then ANDs its two gradients with their bytes' masks (``og_pair_mask``, one
    ``prmt``) and adds each: +0.0 where the window does not name the pixel.
    Adding +0.0 changes a float32 sum only if it is -0.0, which one starting at
    +0.0 never is when rounding to nearest (IEEE 754-2019, 6.3: ``x + -x`` is
    +0.0), so the sums are :func:`_gather`'s bit for bit."""
    body = ["const IDX P = (n * OH + oh) * OW + ow;",
            "const unsigned int me = (unsigned int)((hp - oh * SH) * KW + (wp - ow * SW)) * 0x01010101u;",
            "const unsigned long long m = *reinterpret_cast<const unsigned long long*>(arg + P * C + cv * V);",
            "const uint4 g = *reinterpret_cast<const uint4*>(gy + P * GP + cv * V);",
            "const unsigned int gw[4] = {g.x, g.y, g.z, g.w};"]
    for t, word in enumerate(("(unsigned int)m", "(unsigned int)(m >> 32)")):
        x = f"({word} ^ me)" if masked else f"(({word} ^ me) & 0x7f7f7f7fu)"
        body += [f"const unsigned int x{t} = {x};",
                 f"const unsigned int z{t} = ~(((x{t} & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x{t}) & 0x80808080u;"]
    for pair in range(4):  # lanes 2 * pair and 2 * pair + 1: bytes 2 * pair, 2 * pair + 1 of the indices
        body += [f"{{ const unsigned int mg = gw[{pair}] & og_pair_mask(z{pair // 2}, {2 * (pair % 2)}u);",
                 f"  a{2 * pair} += __uint_as_float(mg << 16);",
                 f"  a{2 * pair + 1} += __uint_as_float(mg & 0xffff0000u); }}"]
    st = storage_of("bfloat16")
    return [*_COVERING, _sums(8), *_over_covering(body),
            *vector_store(st, "gx", _OUT_PIXEL, [f"a{j}" for j in range(8)], "s")]


def _take(st, v: int, masked: bool) -> list[str]:
    """``x`` at each window's saved winner, lane by lane: the index byte names
    cell ``(k / KW, k % KW)`` of the window (its mark stripped, or ``masked``:
    a marked lane is 0); a cell outside the input, or past the window, reads
    -inf. One load per lane, from the window the scan already brought into
    the caches."""
    word = _byte_word(v)
    lines = [*_WINDOW, f"const IDX o = {_OUT_PIXEL};",
             f"const {word} m = *reinterpret_cast<const {word}*>(arg + o);"]
    for j in range(v):
        lines += [f"CT t{j} = {lit(-math.inf)};", "{",
                  f"    const int b = (int)((m >> {8 * j}) & 0xff), k = b & {MASKED - 1};",
                  "    const int h = h0 + k / KW, w = w0 + k % KW;",
                  *([f"    if (b & {MASKED}) t{j} = (CT)0; else"] if masked else []),
                  "    if (k < KH * KW && h >= 0 && h < (int)H && w >= 0 && w < (int)W)",
                  f"        t{j} = {st.load(f'x[xb + ((IDX)h * W + w) * XP + {j}]')};", "}"]
    return lines + vector_store(st, "y", "o", [f"t{j}" for j in range(v)], "y")


#: the most cells of a window whose in-bounds cells :func:`_take_bits` holds as bits of one word
TAKE_BITS_CELLS = 32


def _take_bits(masked: bool) -> list[str]:
    """:func:`_take` for 8 bfloat16 lanes, moving bits: the winner's bits are
    the output (SEMANTICS.md, Pooling), so no lane goes through float and back.

    Why: the lane by lane take was half bound by the ALU on the H200 (53 %
    busy at 48 % of the copy bandwidth; ncu, docs/results/h200-2026-12-04c/
    call1/c-ncu.log.gz): per lane, a window index's four bounds tests, and a
    conversion to float and its rounding back. Here the window's in-bounds
    cells are one word of bits, built once per thread from its rows and
    columns (``valid``, for windows of at most :data:`TAKE_BITS_CELLS` cells),
    so a lane tests one bit; a marked lane (``masked``) is +0.0, an index
    naming no in-bounds cell -inf (0xff80). A signalling NaN is quieted (its
    0x0040 bit set), as every other kernel's float round trip does
    (``storage.BF16_DEVICE``), so the take gives ``MaxPool2d``'s bits."""
    lines = [*_WINDOW, f"const IDX o = {_OUT_PIXEL};",
             "const unsigned long long m = *reinterpret_cast<const unsigned long long*>(arg + o);",
             "unsigned int cols = 0u, valid = 0u;",
             "#pragma unroll", "for (int dw = 0; dw < KW; ++dw)",
             "    if (w0 + dw >= 0 && w0 + dw < (int)W) cols |= 1u << dw;",
             "#pragma unroll", "for (int dh = 0; dh < KH; ++dh)",
             "    if (h0 + dh >= 0 && h0 + dh < (int)H) valid |= cols << (dh * KW);",
             "const IDX x0 = xb + ((IDX)h0 * W + w0) * XP;  // the window's first cell (may be in the padding)"]
    for j in range(8):
        lines += [f"unsigned int t{j} = 0xff80u;", "{",
                  f"    const unsigned int b = (unsigned int)(m >> {8 * j}) & 0xffu, k = b & {MASKED - 1}u;",
                  *([f"    if (b & {MASKED}u) t{j} = 0u; else"] if masked else []),
                  "    if (k < KH * KW && ((valid >> k) & 1u))",
                  f"        t{j} = x[x0 + ((IDX)(k / KW) * W + k % KW) * XP + {j}];",
                  f"    if ((t{j} & 0x7fffu) > 0x7f80u) t{j} |= 0x40u;", "}"]
    words = " ".join(f"ys.{c} = t{2 * q} | (t{2 * q + 1} << 16);" for q, c in enumerate("xyzw"))
    return lines + ["{ uint4 ys; " + words + " *reinterpret_cast<uint4*>(y + o) = ys; }"]


def _average(st, v: int) -> list[str]:
    """``pool.py``'s ``_AVG`` per lane: the window's sum in row-major order, one division, one rounding."""
    cell, cell_lanes = vector_load(st, "x", "xb + ((IDX)h * W + w) * XP", v, "c")
    return [*_WINDOW, _sums(v), *_over_window([*cell, *(f"a{j} += {e};" for j, e in enumerate(cell_lanes))]),
            "const CT d = (CT)divisor(h0, w0, (int)H, (int)W, KH, KW, pt, pb, pl, pr, inc);",
            *vector_store(st, "y", _OUT_PIXEL, [f"a{j} / d" for j in range(v)], "y")]


def _average_backward(st, v: int) -> list[str]:
    """``pool.py``'s ``_AVG_BWD`` per lane: ``gy / divisor`` of the covering windows, in order."""
    g, g_lanes = vector_load(st, "gy", "((n * OH + oh) * OW + ow) * GP + cv * V", v, "g")
    return [*_COVERING, _sums(v),
            *_over_covering(["const CT d = (CT)divisor(oh * SH - pt, ow * SW - pl, (int)QH, (int)QW, KH, KW, "
                             "pt, pb, pl, pr, inc);", *g, *(f"a{j} += {e} / d;" for j, e in enumerate(g_lanes))]),
            *vector_store(st, "gx", _OUT_PIXEL, [f"a{j}" for j in range(v)], "s")]


# ---- the ``tile`` variant: bfloat16 window scan and gather from a shared-memory tile

#: shared memory per block at most (bytes): static shared memory stops at 48 KiB,
#: and a smaller tile leaves room for more blocks per SM (228 KiB on an H200)
TILE_SMEM = 32 * 1024
#: the most rows of a thread's strip (output rows of the scan, input rows of the gather)
TILE_ROWS = 8
#: the most columns of a block's tile
TILE_COLS = 16
#: threads per block at most (the tile's columns times its channel groups)
TILE_THREADS = 128
#: the largest window side and stride the tile kernels unroll
TILE_WINDOW = 4


@attrs.frozen
class TileShape:
    """A block's tile: ``rows`` x ``cols`` pixels (the scan's output pixels, the
    gather's input pixels) by ``groups`` 16-byte channel groups; one thread per
    column and group runs down the ``rows``."""

    rows: int
    cols: int
    groups: int


def tile_declines(dtype: str, kernel, stride) -> str | None:
    """Why the ``tile`` kernels do not take a window (None: they do): bfloat16
    only (the pair instructions), sides and strides of at most :data:`TILE_WINDOW`
    (the kernels unroll every window of a strip)."""
    if dtype != "bfloat16":
        return f"dtype {dtype} (tile kernels: bfloat16)"
    if max(*kernel, *stride) > TILE_WINDOW:
        return f"a {tuple(kernel)} window of stride {tuple(stride)} (tile kernels: sides and strides <= {TILE_WINDOW})"
    return None


def _tile_smem(kind: str, window: tuple, t: TileShape) -> int:
    """Shared bytes of a ``kind`` block: the scan's input rows and columns of
    ``t``'s outputs (the take's too); the gather's windows covering ``t``'s pixels, 16 bytes of
    index pairs plus 16 of gradients each (:func:`_gather_tile`)."""
    kh, kw, sh, sw = window
    if kind != "bwd":
        return ((t.rows - 1) * sh + kh) * ((t.cols - 1) * sw + kw) * t.groups * 16
    return ((kh - 1) // sh + t.rows // sh) * ((kw - 1) // sw + t.cols // sw) * t.groups * 32


@functools.lru_cache(maxsize=None)  # asked at every launch: 2-32 us of Python each time
def tile_shape(kind: str, window: tuple, extent: tuple, groups: int) -> TileShape:
    """The default tile of a ``kind`` launch (``arg``, ``take``: ``extent`` the output's
    ``(OH, OW)``; ``bwd``: the input's ``(H, W)`` from the first multiple of the
    stride in the padding on) over ``groups`` channel groups: at most
    :data:`TILE_COLS` columns and :data:`TILE_ROWS` rows, split evenly (28
    columns: two tiles of 14), the gather's a multiple of the stride (its strips
    then meet the same windows); the most channel groups dividing ``groups``
    that keep a block within :data:`TILE_THREADS`; fewer rows, then fewer
    columns, then fewer groups, until the tile fits :data:`TILE_SMEM`."""
    step = (window[2], window[3]) if kind == "bwd" else (1, 1)

    def split(n: int, s: int, pieces: int) -> int:  # ceil(n / pieces), rounded up to a multiple of s
        return -(-(-(-n // pieces)) // s) * s

    h_pieces, w_pieces = -(-extent[0] // TILE_ROWS), -(-extent[1] // TILE_COLS)
    threads = TILE_THREADS
    while True:
        rows, cols = split(extent[0], step[0], h_pieces), split(extent[1], step[1], w_pieces)
        most = max(1, threads // cols)
        t = TileShape(rows, cols, max(d for d in range(1, min(groups, most) + 1) if groups % d == 0))
        if _tile_smem(kind, window, t) <= TILE_SMEM or (t.rows, t.cols, t.groups) == (*step, 1):
            return t
        if rows > step[0]:
            h_pieces += 1
        elif cols > step[1]:
            w_pieces += 1
        else:
            threads = cols * t.groups - 1


#: the tile kernels' helpers: ``og_bf2_eq`` (0xffff per equal half; PTX
#: ``set.eq.u32.bf16x2``, sm_90), ``og_byte_perm`` (``__byte_perm``: PTX ``prmt``
#: in its default mode), ``og_f2bf2`` (two floats to bfloat16, rounded to nearest
#: even, the first in the low half: PTX ``cvt.rn.bf16x2.f32``, sm_80, whose first
#: source goes to the upper half; the caller keeps NaN away from it, whose bits
#: ``opgraph_bf16_bits`` keeps and ``cvt`` does not); on the CPU emulator the same
#: results from each half's float and :data:`storage.BF16_DEVICE`. Sources: PTX
#: ISA 8.x, "Half Precision Comparison Instructions: set", "prmt", "cvt" (``.bf16x2``:
#: the value converted from the first source is stored in the upper half).
TILE_HELPERS = r"""
#if !defined(OPGRAPH_CPU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned int og_bf2_eq(unsigned int a, unsigned int b) {
    unsigned int d; asm("set.eq.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
#else
__device__ __forceinline__ unsigned int og_bf2_eq(unsigned int a, unsigned int b) {
    return (og_bf_half(a, 0) == og_bf_half(b, 0) ? 0xffffu : 0u)
         | (og_bf_half(a, 1) == og_bf_half(b, 1) ? 0xffff0000u : 0u);
}
#endif
#if !defined(OPGRAPH_CPU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned int og_f2bf2(float lo, float hi) {
    unsigned int d; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d;
}
#else
__device__ __forceinline__ unsigned int og_f2bf2(float lo, float hi) {
    return (unsigned int)opgraph_bf16_bits(lo) | ((unsigned int)opgraph_bf16_bits(hi) << 16);
}
#endif
#if defined(OPGRAPH_CPU)
__device__ __forceinline__ unsigned int og_byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned int r = 0u;
    for (int i = 0; i < 4; ++i) r |= (unsigned int)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
#define __launch_bounds__(...)
#else
#define og_byte_perm __byte_perm
#endif
"""
#: a block's tile: ``blockIdx.x`` its channel block (fastest) and tile column,
#: ``blockIdx.y`` its tile row, ``blockIdx.z`` its image (one unsigned division per
#: thread); a thread's tile column ``tc`` and channel group ``tv`` (fastest)
_TILE_BLOCK = [
    "const unsigned int cbk = blockIdx.x % (unsigned int)CBLOCKS, tj = blockIdx.x / (unsigned int)CBLOCKS;",
    "const int ti = (int)blockIdx.y;",
    "const IDX n = blockIdx.z;",
    "const int tc = (int)threadIdx.x / CB, tv = (int)threadIdx.x % CB;",
    "const IDX cv = (IDX)cbk * CB + tv;"]
#: the most tile rows and images of a launch (CUDA's grid limit in y and z)
GRID_YZ_LIMIT = 65535
#: operands of this many elements or more take the tile kernels with 64-bit offsets
TILE_WIDE_SPAN = 2 ** 31


def _hexu(value: int) -> str:
    return f"{value & 0xffffffff:#010x}u"


def _stage_tile(window: tuple, t: TileShape, prelude=()) -> list[str]:
    """The staging shared by the ``tile`` kernels that read x (:func:`_scan_tile`,
    :func:`_take_tile`), up to the caller's ``__syncthreads``: ``tile`` holds the
    input rows and columns of ``t.rows`` x ``t.cols`` output pixels by ``t.groups``
    16-byte channel groups (``IH`` x ``IW`` cells), -inf outside the input
    (padding, the ceil_mode overhang, past a partial tile); thread ``(tc, tv)``
    loads columns ``tc``, ``tc + TW``, ... of every row, 16 bytes a load, a
    column's loads all issued before its stores. Defines the block
    (``_TILE_BLOCK``), its first output row and column ``oh0``, ``ow0`` and x's
    image base ``xb``; ``prelude``: statements run before the loads (the take's
    index loads, so that they overlap the staging)."""
    kh, kw, sh, sw = window
    ih, iw = (t.rows - 1) * sh + kh, (t.cols - 1) * sw + kw
    body = [f"__shared__ uint4 tile[{ih * iw * t.groups}];", *_TILE_BLOCK,
            "const int oh0 = (int)ti * TH, ow0 = (int)tj * TW;",
            "const int ih0 = oh0 * SH - pt, iw0 = ow0 * SW - pl;",
            "const IDX xb = n * H * W * XP + cv * V, row = W * XP;",
            "const uint4 ninf = make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u);",
            *prelude,
            "// stage the tile: thread (tc, tv) loads columns tc, tc + TW, ... of every row; -inf outside",
            "// (a pointer outside the input is formed, never read)"]
    for c0 in range(0, iw, t.cols):  # a column's loads all issued before its stores
        edge = c0 + t.cols > iw
        body += [f"if ({f'{c0} + tc < IW' if edge else 'true'}) {{",
                 f"  const int c = {c0} + tc, w = iw0 + c;",
                 "  const bool in_w = (unsigned int)w < (unsigned int)W;",
                 "  const unsigned short* const px = x + xb + ((IDX)ih0 * W + w) * XP;",
                 *(f"  const uint4 e{r} = in_w && (unsigned int)(ih0 + {r}) < (unsigned int)H ? "
                   f"*reinterpret_cast<const uint4*>(px + {r} * row) : ninf;" for r in range(ih)),
                 *(f"  tile[({r} * IW + c) * CB + tv] = e{r};" for r in range(ih)), "}"]
    return body


def _scan_tile(relu: bool, window: tuple, t: TileShape, slow: list[str]) -> list[str]:
    """The ``arg`` scan of bfloat16 from a shared-memory tile (``tile`` variant).

    A block stages the input cells of ``t.rows`` x ``t.cols`` output pixels
    and ``t.groups`` channel groups, padding as -inf, then each thread takes
    one output column and channel group down the tile's rows, in two passes
    (the window's maximum and first maximum are separable):

    * per tile row, the best of the column's ``KW`` cells and its index
      (first cell, then a strictly greater one: :func:`_scan_pairs`' three
      pair instructions per cell), computed once and shared by the ``KH / SH``
      outputs whose windows hold that row;
    * per output, the best of its ``KH`` row bests in order, a strictly greater
      one replacing it, from -inf and the window's first in-bounds cell.

    The first maximum in row-major order is the first row's first maximum of
    the rows holding the largest value, which is what the passes find; a
    padding cell (-inf) never beats the start. Indices are kept in tile
    coordinates (row ``r``, column ``dw``: ``r * KW + dw``, one per 16-bit
    half) and the output's first row subtracted at the end. A NaN propagates
    into the maximum (``max.NaN``); an output whose maximum holds one is
    scanned again lane by lane from global memory by ``slow``
    (:func:`_scan`'s statements), so every result is :func:`_scan`'s bit for bit.
    The staging is :func:`_stage_tile`'s."""
    kh, kw, sh, sw = window
    iw = (t.cols - 1) * sw + kw
    body = [*_stage_tile(window, t), "__syncthreads();",
             "const int oq = ow0 + tc;  // the thread's output column",
             "const int fc = oq * SW - pl < 0 ? pl - oq * SW : 0;  // its windows' first in-bounds column",
             "const uint4* const col = tile + tc * SW * CB + tv;",
             "unsigned int nanmask = 0u;"]
    done = 0  # tile rows whose best is computed

    def row(r: int) -> list[str]:
        lines = [f"unsigned int rb{r}_0 = 0u, rb{r}_1 = 0u, rb{r}_2 = 0u, rb{r}_3 = 0u;",
                 *(f"unsigned int rk{r}_{j} = {_hexu(r * kw * 0x10001)};" for j in range(4)),
                 f"{{ const uint4 e = col[{r * iw * t.groups}]; "
                 f"rb{r}_0 = e.x; rb{r}_1 = e.y; rb{r}_2 = e.z; rb{r}_3 = e.w; }}"]
        for dw in range(1, kw):
            lines += [f"{{ const uint4 e = col[{(r * iw + dw) * t.groups}];",
                      "  const unsigned int ew[4] = {e.x, e.y, e.z, e.w};"]
            for j in range(4):
                lines.append(f"  {{ const unsigned int gt = og_bf2_gt(ew[{j}], rb{r}_{j}); "
                             f"rb{r}_{j} = og_bf2_max(ew[{j}], rb{r}_{j}); "
                             f"rk{r}_{j} = (gt & {_hexu((r * kw + dw) * 0x10001)}) | (~gt & rk{r}_{j}); }}")
            lines.append("}")
        return lines

    for i in range(t.rows):
        while done < i * sh + kh:
            body += row(done)
            done += 1
        r0 = i * sh
        body += [f"{{ // output row oh0 + {i}",
                 f"  const int hw = (oh0 + {i}) * SH - pt, fh = hw < 0 ? -hw : 0;",
                 f"  const unsigned int kf = (unsigned int)(({r0} + fh) * KW + fc) * 0x00010001u;"]
        for j in range(4):
            body.append(f"  unsigned int b{j} = rb{r0}_{j}, k{j};")
            body.append(f"  {{ const unsigned int gt = og_bf2_gt(rb{r0}_{j}, 0xff80ff80u); "
                        f"k{j} = (gt & rk{r0}_{j}) | (~gt & kf); }}")
        for dh in range(1, kh):
            r = r0 + dh
            for j in range(4):
                body.append(f"  {{ const unsigned int gt = og_bf2_gt(rb{r}_{j}, b{j}); "
                            f"b{j} = og_bf2_max(rb{r}_{j}, b{j}); k{j} = (gt & rk{r}_{j}) | (~gt & k{j}); }}")
        ks = [f"(k{j} - {_hexu(r0 * kw * 0x10001)})" for j in range(4)]
        if relu:  # MASKED where the winner is not > 0
            ks = [f"({k} | (~og_bf2_gt(b{j}, 0u) & {MASKED * 0x10001:#x}u))" for j, k in enumerate(ks)]
        body += [f"  if (oh0 + {i} < (int)QH && oq < (int)QW) {{",
                 "    if (og_bf2_nan(b0) | og_bf2_nan(b1) | og_bf2_nan(b2) | og_bf2_nan(b3)) "
                 f"nanmask |= {1 << i}u;",
                 "    else *reinterpret_cast<unsigned long long*>("
                 f"arg + ((n * QH + oh0 + {i}) * QW + oq) * C + cv * V) =",
                 f"        (unsigned long long)og_byte_perm({ks[0]}, {ks[1]}, 0x6420u)",
                 f"        | ((unsigned long long)og_byte_perm({ks[2]}, {ks[3]}, 0x6420u) << 32);",
                 "  }", "}"]
    body += ["// the outputs whose maximum holds a NaN, lane by lane from global memory (_scan)",
             "#pragma unroll 1", "for (int i = 0; i < TH; ++i) {",
             "    if (!((nanmask >> i) & 1u)) continue;",
             "    const IDX p = oh0 + i, q = oq;",
             "    {", *("        " + line for line in slow), "    }", "}"]
    return body


def _take_tile(masked: bool, window: tuple, t: TileShape) -> list[str]:
    """The bfloat16 take from a shared-memory tile (``tile`` variant): y = x at
    each lane's saved winner, :func:`_take_bits`' bits.

    The block stages x as :func:`_scan_tile` does (:func:`_stage_tile`: the
    input rows plus halo of ``t.rows`` x ``t.cols`` output pixels, 16-byte
    coalesced loads, -inf outside the input), its threads' index words (8 bytes
    per output) loaded before the staging so that both are in flight together;
    then thread ``(tc, tv)`` walks its output column down the tile's rows and
    takes each lane's winner from shared memory: cell ``(k / KW, k % KW)`` of
    the window, ``k`` the index byte with the ReLU mark stripped (``masked``: a
    marked lane is +0.0). A padding cell reads the staged -inf, which is
    :func:`_take_bits`' 0xff80 for an index naming no in-bounds cell, as is an
    index past the window (``k >= KH * KW``, never read from the tile); a
    signalling NaN is quieted (its 0x0040 bit set) as there.

    Why: :func:`_take_bits` ran at 50.8 % of the copy bandwidth on GoogLeNet
    (0.422 ms a step over its 13 takes, H200, docs/results/h200-2026-12-04d):
    its 8 lanes' 2-byte loads go to up to 8 different window cells, so a warp's
    load instruction touches up to 32 lines of L1 (one wavefront each), 8 such
    per output. Here x crosses L2 → SM once per tile plus its halo as whole
    16-byte words (a warp's load: 4 columns of 128 contiguous bytes with 8
    channel groups), and the lanes' 2-byte reads hit shared memory, at most
    ``32 / CB``-way bank conflicts (the threads of one channel group in a warp
    meet the same banks). Expected (H200, not measured): 1.2-1.4x on the 3x3/1
    and 3x3/2 pools, from about 50 % to 60-70 % of the copy bandwidth, the
    staging phase then bounding it as it bounds the tile scan (46-53 % for
    x + 1 byte; the take moves x + 3 bytes per output behind the same staging):
    GoogLeNet's takes 0.42 → about 0.32 ms a step. Where it loses (small planes,
    partial tiles, as the tile scan on pool3), autotune keeps ``_take_bits``."""
    kh, kw, sh, sw = window
    prelude = ["const int oq = ow0 + tc;  // the thread's output column",
               "const IDX mrow = QW * C;  // an output row of the indices and of y",
               "const IDX o0 = ((n * QH + oh0) * QW + oq) * C + cv * V;  // the thread's first output",
               "// the thread's index words, loaded before the staging (their loads overlap it)",
               *(f"const unsigned long long m{i} = oh0 + {i} < (int)QH && oq < (int)QW ? "
                 f"*reinterpret_cast<const unsigned long long*>(arg + o0 + {i} * mrow) : 0ull;"
                 for i in range(t.rows))]
    body = [*_stage_tile(window, t, prelude), "__syncthreads();",
            "// lane j of cell (r, c) of the thread's columns: col[(r * IW + c) * CB * V + j]",
            "const unsigned short* const col = reinterpret_cast<const unsigned short*>(tile + tc * SW * CB + tv);"]
    for i in range(t.rows):
        body += [f"if (oh0 + {i} < (int)QH && oq < (int)QW) {{ // output row oh0 + {i}"]
        for j in range(8):
            body += [f"  unsigned int t{j} = 0xff80u;",
                     f"  {{ const unsigned int b = (unsigned int)(m{i} >> {8 * j}) & 0xffu, k = b & {MASKED - 1}u;",
                     *([f"    if (b & {MASKED}u) t{j} = 0u; else"] if masked else []),
                     f"    if (k < KH * KW) t{j} = col[({i * sh}u + k / KW) * (IW * CB * V) + k % KW * (CB * V)"
                     f" + {j}];",
                     f"    if ((t{j} & 0x7fffu) > 0x7f80u) t{j} |= 0x40u; }}"]
        words = " ".join(f"ys.{c} = t{2 * q} | (t{2 * q + 1} << 16);" for q, c in enumerate("xyzw"))
        body += [f"  uint4 ys; {words}", f"  *reinterpret_cast<uint4*>(y + o0 + {i} * mrow) = ys;", "}"]
    return body


def _gather_tile(masked: bool, window: tuple, t: TileShape) -> list[str]:
    """The bfloat16 gather from a shared-memory tile (``tile`` variant).

    A block stages every window covering ``t.rows`` x ``t.cols`` input pixels
    and ``t.groups`` channel groups: its 8 gradients (16 bytes) and its 8 index
    bytes as bfloat16 pairs (16 bytes), byte ``k`` becoming the half
    ``k << 8 | 0x80`` (``prmt``: exponent ``2 (k & 127) + 1``, sign ``k >= 128``, so
    each byte is a distinct normal number or infinity, never a zero or a NaN)
    and a window outside the pooled extent the NaN pair (it equals nothing, so
    its gradient words, whatever they hold, are masked to +0.0).
    Then a pixel's test of a window is one ``set.eq.bf16x2`` per pair of lanes
    against the same form of its index in that window ``me`` (a constant of
    the unrolled strip where the stride is 1), instead of a zero-byte test and
    a ``prmt`` (:func:`_gather_pairs`); not ``masked``: the mark is cleared from
    the bytes first. The tile's origin is a multiple of the stride, so each
    strip row meets the same windows. Sums in float32 in window order (``oh``,
    then ``ow``), +0.0 where a window does not name the pixel: :func:`_gather`'s
    bits. The 8 sums become bfloat16 two per ``cvt.rn.bf16x2.f32`` (rounded to
    nearest even, as ``opgraph_bf16_bits``) unless their sum is NaN (a lane is
    NaN, or +inf meets -inf): then lane by lane through ``opgraph_bf16_bits``,
    which keeps a NaN's payload, as the pair gather stores every lane."""
    kh, kw, sh, sw = window
    ah, aw = (kh - 1) // sh, (kw - 1) // sw
    wh, ww = ah + t.rows // sh, aw + t.cols // sw
    jw = -(-kw // sw)  # the most covering windows of a pixel along a row
    n_win = wh * ww * t.groups
    body = [f"__shared__ uint4 s_idx[{n_win}];", f"__shared__ uint4 s_gy[{n_win}];", *_TILE_BLOCK,
            "const int hp0 = (pt / SH) * SH + (int)ti * TH, wp0 = (pl / SW) * SW + (int)tj * TW;  // padded",
            "const int oh_lo = hp0 / SH - AH, ow_lo = wp0 / SW - AW;  // the tile's first covering window",
            "// stage the windows: thread (tc, tv) loads window columns tc, tc + TW, ... of every row"]
    strip = "" if masked else " & 0x7f7f7f7fu"
    body += ["const IDX arg_row = OW * C, gy_row = OW * GP;",
             "const uint4 none = make_uint4(0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu);",
             "// (pointers outside the pooled extent are formed, never read; such a window's gradient",
             "// words are any (NaN pairs): its NaN index pairs mask them out of every sum)"]
    for c0 in range(0, ww, t.cols):  # a column's loads all issued before its stores
        edge = c0 + t.cols > ww
        body += [f"if ({f'{c0} + tc < WW' if edge else 'true'}) {{",
                 f"  const int c = {c0} + tc, ow = ow_lo + c;",
                 "  const bool in_w = (unsigned int)ow < (unsigned int)OW;",
                 "  const IDX P = (n * OH + oh_lo) * OW + ow;",
                 "  const unsigned char* const pa = arg + P * C + cv * V;",
                 "  const unsigned short* const pg = gy + P * GP + cv * V;"]
        for r in range(wh):
            body += [f"  const bool in{r} = in_w && (unsigned int)(oh_lo + {r}) < (unsigned int)OH;",
                     f"  const unsigned long long m{r} = in{r} ? "
                     f"*reinterpret_cast<const unsigned long long*>(pa + {r} * arg_row) : 0ull;",
                     f"  const uint4 g{r} = in{r} ? *reinterpret_cast<const uint4*>(pg + {r} * gy_row) : none;"]
        for r in range(wh):
            body += [f"  s_gy[({r} * WW + c) * CB + tv] = g{r};",
                     f"  if (in{r}) {{",
                     f"    const unsigned int lo = (unsigned int)m{r}{strip}, hi = (unsigned int)(m{r} >> 32){strip};",
                     f"    s_idx[({r} * WW + c) * CB + tv] = make_uint4(og_byte_perm(lo, 0x80808080u, 0x1404u),",
                     "        og_byte_perm(lo, 0x80808080u, 0x3424u), og_byte_perm(hi, 0x80808080u, 0x1404u),",
                     "        og_byte_perm(hi, 0x80808080u, 0x3424u));",
                     f"  }} else s_idx[({r} * WW + c) * CB + tv] = none;"]
        body.append("}")
    body += ["__syncthreads();",
             "// the thread's pixel column: windows qc - j (j = 0, 1, ...), at column rho + j * SW of each",
             "const int rho = (tc + AW * SW) % SW, qc = (tc + AW * SW) / SW;",
             "const uint4* const wi = s_idx + qc * CB + tv;", "const uint4* const wg = s_gy + qc * CB + tv;",
             "const IDX w = (IDX)wp0 + tc - pl;",
             *(f"const unsigned int mj{j} = (unsigned int)((rho + {j * sw}) << 8) * 0x00010001u;"
               for j in range(jw))]
    for l in range(t.rows):
        body += [f"{{ // pixel row hp0 + {l}", "  float " + ", ".join(f"a{q} = 0.f" for q in range(8)) + ";"]
        top = l + ah * sh
        for r in range(max(0, -(-(top - kh + 1) // sh)), top // sh + 1):  # ascending oh
            dh = top - r * sh
            for j in reversed(range(jw)):  # ascending ow
                me = f"{_hexu((((dh * kw) << 8) | 0x80) * 0x10001)} + mj{j}"
                # every rho in [0, SW) gives a column inside the window, or the test stays
                guard = "" if j * sw + sw - 1 < kw else f"if (rho + {j * sw} < KW) "
                body += [f"  {guard}{{ const uint4 ip = wi[{(r * ww - j) * t.groups}], "
                         f"g = wg[{(r * ww - j) * t.groups}]; const unsigned int me = {me};"]
                for q, c in enumerate("xyzw"):
                    body.append(f"    {{ const unsigned int u = g.{c} & og_bf2_eq(ip.{c}, me); "
                                f"a{2 * q} += __uint_as_float(u << 16); "
                                f"a{2 * q + 1} += __uint_as_float(u & 0xffff0000u); }}")
                body.append("  }")
        body += [f"  const IDX h = (IDX)hp0 + {l} - pt;",
                 "  if (h >= 0 && h < QH && w >= 0 && w < QW) {",
                 "    const float s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));",
                 "    uint4 o;",
                 "    if (s != s) {",
                 *(f"      o.{c} = (unsigned int)opgraph_bf16_bits(a{2 * q}) | "
                   f"((unsigned int)opgraph_bf16_bits(a{2 * q + 1}) << 16);" for q, c in enumerate("xyzw")),
                 "    } else {",
                 *(f"      o.{c} = og_f2bf2(a{2 * q}, a{2 * q + 1});" for q, c in enumerate("xyzw")),
                 "    }",
                 "    *reinterpret_cast<uint4*>(gx + ((n * QH + h) * QW + w) * C + cv * V) = o;", "  }", "}"]
    return body


@functools.lru_cache(maxsize=None)
def _tile_source(kind: str, wide: bool, window: tuple, t: TileShape, relu: bool = False,
                 masked: bool = True) -> tuple[str, str]:
    """``(name, source)`` of a ``tile`` kernel: ``arg`` (:func:`_scan_tile`),
    ``take`` (:func:`_take_tile`) or ``bwd`` (:func:`_gather_tile`) of bfloat16, for the window ``(kh, kw, sh, sw)``
    and the tile ``t`` (compile-time constants: every loop unrolls). One block per
    tile (no grid-stride loop: blocks that finish make room for others)."""
    kh, kw, sh, sw = window
    st = storage_of("bfloat16")
    sizes = "IDX QH, IDX QW, IDX H, IDX W, IDX C, IDX XP" if kind != "bwd" else \
        "IDX QH, IDX QW, IDX OH, IDX OW, IDX C, IDX GP"
    tiles = "IDX CBLOCKS"
    if kind == "arg":
        slow, _ = _scan(st, 8, "arg", relu)
        body = _scan_tile(relu, window, t, slow)
        params = f"const {st.ctype}* __restrict__ x, unsigned char* __restrict__ arg"
        extra = (f"#define IH {(t.rows - 1) * sh + kh}\n#define IW {(t.cols - 1) * sw + kw}\n"
                 "#define PIX 1\n")
    elif kind == "take":
        body = _take_tile(masked, window, t)
        params = (f"const {st.ctype}* __restrict__ x, const unsigned char* __restrict__ arg, "
                  f"{st.ctype}* __restrict__ y")
        extra = f"#define IH {(t.rows - 1) * sh + kh}\n#define IW {(t.cols - 1) * sw + kw}\n"
    elif kind == "bwd":
        body = _gather_tile(masked, window, t)
        params = (f"const unsigned char* __restrict__ arg, const {st.ctype}* __restrict__ gy, "
                  f"{st.ctype}* __restrict__ gx")
        ah, aw = (kh - 1) // sh, (kw - 1) // sw
        extra = f"#define AH {ah}\n#define AW {aw}\n#define WH {ah + t.rows // sh}\n#define WW {aw + t.cols // sw}\n"
    else:
        raise ValueError(f"pool_vector: no tile kernel of kind {kind}")
    threads = t.cols * t.groups
    # __launch_bounds__ names the block size only. A minimum of blocks per SM (as many as the
    # shared memory holds) made ptxas (13.0, sm_90) either spill (the 3x3/1 scan capped at 40
    # registers) or take more registers than it needs (up to the cap: 48 → 64), so fewer blocks
    # fit: left to itself it takes 32-80 with no spills, which the shared memory mostly limits
    unmasked = kind in ("bwd", "take") and not masked
    name = (f"opgraph_pool_tile_{kind}{'_relu' if relu else ''}{'_unmasked' if unmasked else ''}_bfloat16_"
            f"{'i64' if wide else 'i32'}_k{kh}x{kw}s{sh}x{sw}_t{t.rows}x{t.cols}x{t.groups}")
    constants = (f"#define KH {kh}\n#define KW {kw}\n#define SH {sh}\n#define SW {sw}\n"
                 f"#define TH {t.rows}\n#define TW {t.cols}\n#define CB {t.groups}\n{extra}")
    text = (f"typedef float CT;\ntypedef {'long long' if wide else 'int'} IDX;\n#define V 8\n{constants}"
            f"{DEVICE_HELPERS}\n{PAIR_HELPERS}\n{TILE_HELPERS}\n"
            f'extern "C" __global__ void __launch_bounds__({threads}) {name}({params}, {sizes}, {tiles}, '
            f"{_PADDING}) {{\n" + "\n".join("    " + line for line in body) + "\n}\n")
    return name, text


@functools.lru_cache(maxsize=None)
def _source(kind: str, dtype: str, wide: bool, window: tuple, relu: bool = False,
            pixels: int = 1, masked: bool = True) -> tuple[str, str]:
    """``(name, source)`` of one kernel: ``fwd`` (y), ``arg`` (window indices),
    ``bwd`` (the gather), ``take`` (x at the saved winners; ``masked`` for
    both: what a marked index means, :func:`_take`, :func:`_gather`), ``avg``
    or ``avg_bwd`` (average pooling), for the
    window ``(kh, kw, sh, sw, mh, mw)`` (compile-time constants: the loops
    unroll; ``mh x mw``: the most windows covering one input pixel, at most
    ``ceil(kh / sh) x ceil(kw / sw)`` and at most the pooled extent, so that a
    global pooling's gradient, one window, does not test 49 of them).
    Every thread loop walks pixels ``(n, p, q)`` of a ``QH x QW`` grid, ``V``
    channels ``cv * V`` at a time: the output's for the forward kernels, the
    input's for the backward ones; ``pixels`` (``fwd``, ``arg``): ``P``
    consecutive output columns per thread, ``q`` running over ``ceil(QW / P)``
    groups (:func:`_scan`)."""
    kh, kw, sh, sw, mh, mw = window
    st, v = storage_of(dtype), lanes(dtype)
    x_in = f"const {st.ctype}* __restrict__ x"
    reads_x = "IDX TOTAL, IDX CV, IDX QW, IDX QH, IDX H, IDX W, IDX C, IDX XP"
    reads_gy = "IDX TOTAL, IDX CV, IDX QW, IDX QH, IDX OH, IDX OW, IDX C, IDX GP"
    if kind in ("fwd", "arg"):
        body, out = _scan(st, v, kind, relu, pixels)
        if kind == "arg" and dtype == "bfloat16":
            body = _scan_pairs(v, relu, pixels, slow=body)
        params = f"{x_in}, {out}, {reads_x}"
    elif kind == "bwd":
        body = _gather_pairs(masked) if dtype == "bfloat16" else _gather(st, v, masked)
        params = (f"const unsigned char* __restrict__ arg, const {st.ctype}* __restrict__ gy, "
                  f"{st.ctype}* __restrict__ gx, {reads_gy}")
    elif kind == "take":
        bits_fit = dtype == "bfloat16" and kh * kw <= TAKE_BITS_CELLS
        body = _take_bits(masked) if bits_fit else _take(st, v, masked)
        params = f"{x_in}, const unsigned char* __restrict__ arg, {st.ctype}* __restrict__ y, {reads_x}"
    elif kind == "avg":
        body, params = _average(st, v), f"{x_in}, {st.ctype}* __restrict__ y, {reads_x}"
    else:
        body = _average_backward(st, v)
        params = f"const {st.ctype}* __restrict__ gy, {st.ctype}* __restrict__ gx, {reads_gy}"
    if pixels != 1 and kind not in ("fwd", "arg"):
        raise ValueError(f"pool_vector: {kind} kernels scan one pixel per thread, not {pixels}")
    unmasked = kind in ("bwd", "take") and not masked
    name = (f"opgraph_pool_vec_{kind}{'_relu' if relu else ''}{'_unmasked' if unmasked else ''}_{dtype}_"
            f"{'i64' if wide else 'i32'}"
            f"_k{kh}x{kw}s{sh}x{sw}m{mh}x{mw}{f'_p{pixels}' if pixels != 1 else ''}")
    constants = (f"#define KH {kh}\n#define KW {kw}\n#define SH {sh}\n#define SW {sw}\n"
                 f"#define MH {mh}\n#define MW {mw}\n#define PIX {pixels}\n")
    loop = ("    const IDX QG = (QW + PIX - 1) / PIX;  // the threads' column groups\n"
            "    for (IDX t = (IDX)blockIdx.x * blockDim.x + threadIdx.x; t < TOTAL;"
            " t += (IDX)gridDim.x * blockDim.x) {\n"
            "        const IDX cv = t % CV; IDX r = t / CV; const IDX q = r % QG; r /= QG; "
            "const IDX p = r % QH; const IDX n = r / QH;\n"
            + "\n".join("        " + line for line in body) + "\n    }\n")
    text = (f"typedef float CT;\ntypedef {'long long' if wide else 'int'} IDX;\n#define V {v}\n{constants}"
            f"{DEVICE_HELPERS}\n{PAIR_HELPERS}\n"
            f"{DIVISOR}\n" f'extern "C" __global__ void {name}({params}, {_PADDING}) {{\n{loop}}}\n')
    return name, text


def _nhwc(xp, shape, dtype):
    """A fresh channels-last array of logical NCHW ``shape`` (bfloat16 through its bits)."""
    from .codegen.launch import empty
    return empty(xp, shape, dtype, "NHWC")


def _span(a) -> int:
    """Elements from ``a``'s first to one past its last (a pitched view reaches further than its size)."""
    n, _, h, w = a.shape
    return n * h * w * pixel_pitch(a)


def _launch(xp, kind, dtype, total, arrays, sizes, g: PoolGeometry, span, relu=False, include_pad=False,
            pixels=1, masked=True):
    """One launch of the kernel for ``g``'s window: ``arrays``, then the ``sizes``
    as IDX, then ``g``'s padding as int; 64-bit indices when ``span`` (the
    largest operand's extent) needs them."""
    wide = max(total * 16 * pixels, span) >= 2 ** 31
    # the gathers' covering windows, clamped by the pooled extent; the other kinds do not use them
    covering = (tuple(min(-(-k // s), o) for k, s, o in zip(g.kernel, g.stride, g.out))
                if kind in ("bwd", "avg_bwd") else (0, 0))
    name, text = _source(kind, dtype, wide, (*g.kernel, *g.stride, *covering), relu, pixels, masked)
    idx = xp.int64 if wide else xp.int32
    threads, cap = LAUNCH.get((kind, dtype), (THREADS, MAX_BLOCKS))
    blocks = max(1, min(-(-total // threads), cap))
    compiled(text, name)((blocks,), (threads,), (*arrays, *map(idx, sizes), *map(xp.int32, _padding(g, include_pad))))


def _tiled(tile, dtype: str, g: PoolGeometry) -> bool:
    """Whether a call asking for ``tile`` (False, True or a :class:`TileShape`) may run the tile kernels."""
    return bool(tile) and tile_declines(dtype, g.kernel, g.stride) is None


def _tile_launch(xp, kind, arrays, sizes, g: PoolGeometry, n: int, cv: int, span: int, tile, relu=False,
                 masked=True) -> bool:
    """One launch of a ``tile`` kernel (:func:`_tile_source`) over image count
    ``n`` and ``cv`` channel groups: ``arrays``, the 6 ``sizes`` (``arg``, ``take``: the
    output's, then the input's extents, C and x's pitch; ``bwd``: the input's,
    the output's, C and gy's pitch), the channel blocks, the padding; blocks
    (channel block and tile column, tile row, image). ``tile``: True
    (:func:`tile_shape`) or a :class:`TileShape`. False, launching nothing,
    where the tile rows or the images exceed the grid's y or z limit."""
    window = (*g.kernel, *g.stride)
    (pt, _), (pl, _) = g.padding
    if kind != "bwd":
        extent = tuple(g.out)
    else:  # the gather's tiles start at the last multiple of the stride in the padding
        extent = (g.in_hw[0] + pt % g.stride[0], g.in_hw[1] + pl % g.stride[1])
    t = tile if isinstance(tile, TileShape) else tile_shape(kind, window, extent, cv)
    if cv % t.groups or (kind == "bwd" and (t.rows % g.stride[0] or t.cols % g.stride[1])):
        raise ValueError(f"pool_vector: tile {t} does not divide {cv} channel groups or the stride {g.stride}")
    tiles_h, tiles_w = -(-extent[0] // t.rows), -(-extent[1] // t.cols)
    if max(tiles_h, n) > GRID_YZ_LIMIT or tiles_w * (cv // t.groups) > GRID_X_LIMIT:
        return False
    wide = span >= TILE_WIDE_SPAN  # every offset is into an operand
    name, text = _tile_source(kind, wide, window, t, relu, masked)
    idx = xp.int64 if wide else xp.int32
    compiled(text, name)((tiles_w * (cv // t.groups), tiles_h, n), (t.cols * t.groups,),
                         (*arrays, *map(idx, [*sizes, cv // t.groups]), *map(xp.int32, _padding(g))))
    return True


def _forward(xp, kind, x, out, g: PoolGeometry, include_pad=False, relu=False, pixels=1, before=(),
             masked=True, tile=False):
    """Launch ``kind`` (``fwd``, ``arg``, ``avg``, ``take``) over the pooled pixels,
    reading x (and ``before``: the take's indices) into ``out``; ``pixels``
    output columns per thread (``fwd``, ``arg``: :func:`_scan`); ``tile``: the
    bfloat16 ``arg`` scan and ``take`` from shared memory (:func:`_scan_tile`,
    :func:`_take_tile`) where the window allows (:func:`tile_declines`)."""
    n, c, h, w = x.shape
    (oh, ow), v = g.out, lanes(x.dtype.name)
    total = n * oh * -(-ow // pixels) * (c // v)
    if not total:
        return out
    if kind in ("arg", "take") and _tiled(tile, x.dtype.name, g) and _tile_launch(
            xp, kind, [bits(xp, x), *before, bits(xp, out)], [oh, ow, h, w, c, pixel_pitch(x)], g, n, c // v,
            max(_span(x), out.size), tile, relu=relu, masked=masked):
        return out
    _launch(xp, kind, x.dtype.name, total, [bits(xp, x), *before, bits(xp, out)],
            [total, c // v, ow, oh, h, w, c, pixel_pitch(x)], g, max(_span(x), out.size), relu, include_pad,
            pixels, masked)
    return out


def _backward(xp, kind, before, gy, gx, g: PoolGeometry, include_pad=False, masked=True, tile=False):
    """Launch ``kind`` (``bwd``, ``avg_bwd``) over the input pixels: ``before`` (the
    window indices, or nothing), then gy, into ``gx``; ``tile``: the bfloat16
    gather from shared memory (:func:`_gather_tile`) where the window allows."""
    n, c, h, w = gx.shape
    (oh, ow), v = g.out, lanes(gy.dtype.name)
    total = n * h * w * (c // v)
    if not total:
        return gx
    if kind == "bwd" and _tiled(tile, gy.dtype.name, g) and _tile_launch(
            xp, kind, [*before, bits(xp, gy), bits(xp, gx)], [h, w, oh, ow, c, pixel_pitch(gy)], g, n, c // v,
            max(_span(gy), gx.size), tile, masked=masked):
        return gx
    _launch(xp, kind, gy.dtype.name, total, [*before, bits(xp, gy), bits(xp, gx)],
            [total, c // v, w, h, oh, ow, c, pixel_pitch(gy)], g, max(_span(gy), gx.size),
            include_pad=include_pad, masked=masked)
    return gx


def max_pool2d(xp, x, g: PoolGeometry, pixels: int = 1):
    """Max pooling of channels-last ``(N, C, H, W)`` x into a new channels-last
    ``(N, C, OH, OW)`` array of x's dtype (``(OH, OW) = g.out``), ``pixels``
    output columns per thread (:data:`PIXELS`; the same bits). Source:
    SEMANTICS.md, Pooling (first maximum, NaN wins, padding never does).

    Raises nothing itself: the caller checks :func:`applies` first (the
    kernels trust the pitch and alignment it checks)."""
    return _forward(xp, "fwd", x, _nhwc(xp, (*x.shape[:2], *g.out), x.dtype), g, pixels=pixels)


def max_pool2d_backward(xp, x, gy, g: PoolGeometry, relu: bool = False, pixels: int = 1, tile=False):
    """Input gradient of max pooling (``relu``: times ReLU's mask of x, the pooled
    ReLU output) of channels-last ``(N, C, H, W)`` x and ``(N, C, OH, OW)`` gy: a
    new channels-last ``(N, C, H, W)`` array of gy's dtype, each window's
    gradient to its first maximum (SEMANTICS.md, Pooling); the window scan
    takes ``pixels`` output columns per thread (:data:`PIXELS`); ``tile`` (True
    or a :class:`TileShape`): the scan and the gather of bfloat16 from
    shared-memory tiles where the window allows (:func:`tile_declines`; the
    same bits).

    Raises:
        ValueError: a :class:`TileShape` ``tile`` that does not divide the
            channel groups (or, for the gather, the stride). Nothing else: the
            caller checks :func:`applies` first."""
    n, c = x.shape[:2]
    arg = _forward(xp, "arg", x, xp.empty((n, *g.out, c), dtype=xp.uint8), g, relu=relu, pixels=pixels, tile=tile)
    return _backward(xp, "bwd", [arg], gy, _nhwc(xp, x.shape, gy.dtype), g, tile=tile)


def indices_apply(idx) -> bool:
    """Whether saved window indices are a dense channels-last uint8 array (as
    :func:`max_pool2d_argmax` writes them), 16-byte aligned: what the take and
    the gather read V bytes at a time."""
    return (idx.dtype.name == "uint8" and idx.ndim == 4 and pixel_pitch(idx) == idx.shape[1]
            and address(idx) % 16 == 0)


def max_pool2d_argmax(xp, x, g: PoolGeometry, relu: bool = False, pixels: int = 1, tile=False):
    """Each window's winner of channels-last ``(N, C, H, W)`` x: a new
    channels-last uint8 ``(N, C, OH, OW)`` array of row-major window indices
    (``relu``: plus :data:`MASKED` where the winner is not > 0), the scan of
    :func:`max_pool2d_backward` (``tile``: as there, and so are its errors:
    ValueError for a :class:`TileShape` that does not divide the channel
    groups; the caller checks :func:`applies` first)."""
    n, c = x.shape[:2]
    arg = _forward(xp, "arg", x, xp.empty((n, *g.out, c), dtype=xp.uint8), g, relu=relu, pixels=pixels, tile=tile)
    return arg.transpose(0, 3, 1, 2)


def max_pool2d_take(xp, x, idx, g: PoolGeometry, masked: bool = False, tile=False):
    """``x`` (channels-last ``(N, C, H, W)``) at each window's saved winner
    ``idx`` (:func:`indices_apply`): a new channels-last ``(N, C, OH, OW)``
    array of x's dtype; a marked index reads 0 with ``masked``; ``tile`` (True
    or a :class:`TileShape`): bfloat16 from a shared-memory tile of x where the
    window allows (:func:`_take_tile`, :func:`tile_declines`; the same bits).

    Raises:
        ValueError: a :class:`TileShape` ``tile`` that does not divide the
            channel groups. Nothing else: the caller checks :func:`applies`
            and :func:`indices_apply` first."""
    return _forward(xp, "take", x, _nhwc(xp, (*x.shape[:2], *g.out), x.dtype), g, before=[idx], masked=masked,
                    tile=tile)


def max_pool2d_backward_indices(xp, idx, gy, g: PoolGeometry, shape, masked: bool = False, tile=False):
    """Input gradient of max pooling from saved winners ``idx``
    (:func:`indices_apply`) and channels-last ``(N, C, OH, OW)`` gy: a new
    channels-last array of ``shape`` and gy's dtype (``masked``: marked
    windows route nothing; ``tile``: the gather from shared-memory tiles, as
    :func:`max_pool2d_backward`).

    Raises:
        ValueError: a :class:`TileShape` ``tile`` that does not divide the
            channel groups or the stride. Nothing else: the caller checks
            :func:`applies` and :func:`indices_apply` first."""
    return _backward(xp, "bwd", [idx], gy, _nhwc(xp, tuple(shape), gy.dtype), g, masked=masked, tile=tile)


def avg_pool2d(xp, x, g: PoolGeometry, count_include_pad: bool):
    """Average pooling of channels-last ``(N, C, H, W)`` x into a new channels-last
    ``(N, C, OH, OW)`` array of x's dtype; the divisor counts explicit padding
    with ``count_include_pad``, never the ceil_mode overhang (SEMANTICS.md,
    Pooling; ``pool.py``'s ``divisor``). Raises nothing itself: the caller
    checks :func:`applies` first."""
    return _forward(xp, "avg", x, _nhwc(xp, (*x.shape[:2], *g.out), x.dtype), g, include_pad=count_include_pad)


def avg_pool2d_backward(xp, gy, g: PoolGeometry, count_include_pad: bool, shape):
    """Input gradient of average pooling of channels-last ``(N, C, OH, OW)`` gy: a
    new channels-last array of ``shape`` (``(N, C, H, W)``) and gy's dtype, each
    cell the sum of ``gy / divisor`` over the windows covering it (SEMANTICS.md,
    Pooling). Raises nothing itself: the caller checks :func:`applies` first."""
    return _backward(xp, "avg_bwd", [], gy, _nhwc(xp, tuple(shape), gy.dtype), g, include_pad=count_include_pad)


__all__ = ["DTYPES", "DIVISOR", "MASKED", "MAX_CELLS", "REVISION", "PIXELS", "TileShape", "tile_declines",
           "tile_shape", "lanes", "pixel_pitch", "declines",
           "applies", "indices_apply", "max_pool2d", "max_pool2d_backward", "max_pool2d_argmax", "max_pool2d_take",
           "max_pool2d_backward_indices", "avg_pool2d", "avg_pool2d_backward"]
