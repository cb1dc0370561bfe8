"""The vector kernels that give each thread one item: their CUDA text, lane by lane and in bfloat16 pairs.

A thread owns ``V`` consecutive channels (lanes) of one pixel, 16 bytes
(:func:`lanes`), or with ``pixels`` ``P`` neighbouring output columns of one
row: the window scans (``fwd``, ``arg``, ``scan`` storing both: :func:`_scan`,
:func:`_scan_pairs`),
the gather of max pooling's gradient (``bwd``: :func:`_gather`,
:func:`_gather_pairs`), the take at saved winners (``take``: :func:`_take`,
:func:`_take_bits`) and average pooling (``avg``, ``avg_bwd``), each a list of
statements that :func:`_source` puts in a grid-stride loop under the window's
compile-time constants. The loops over a window are
:mod:`.pool_vector_window`'s; why the kernels exist and what they compute:
:mod:`.pool_vector`.
"""

from __future__ import annotations

import functools
import math

from opgraph.ops.pool_indices import MASKED

from .codegen.storage import DEVICE_HELPERS, lit, storage_of, vector_load, vector_store
from .pool_vector_window import _COVERING, _PADDING, _WINDOW, DIVISOR, _over_covering, _over_window


def lanes(dtype: str) -> int:
    """V: the elements of ``dtype`` in one 16-byte word."""
    return 16 // storage_of(dtype).itemsize


def _sums(v: int) -> str:
    return " ".join(f"CT a{j} = 0;" for j in range(v))


def _byte_word(v: int) -> str:
    """The integer holding V window-index bytes (V-aligned)."""
    return "unsigned long long" if v == 8 else "unsigned int"


_OUT_PIXEL = "((n * QH + p) * QW + q) * C + cv * V"  # the (dense) output of the thread's pixel


def _scan(st, v: int, kind: str, relu: bool, pixels: int = 1) -> tuple[list[str], str]:
    """Max pooling's window scan (``fwd``: store the maximum; ``arg``: its window
    index; ``scan``: both, ``y`` then ``arg``, from the one scan): the first
    in-bounds cell starts the scan, then a strictly greater value or the first
    NaN replaces the best. With ``relu`` the index is marked (:data:`MASKED`)
    where the best is not > 0; the stored maximum is never masked.

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
        if kind in ("fwd", "scan"):
            body += ["    " + line for line in vector_store(st, "y", "o", [best(i, j) for j in range(v)], f"y{i}")]
        if kind in ("arg", "scan"):
            marks = [f"({best(i, j)} > (CT)0 ? k{i}_{j} : (k{i}_{j} | {MASKED}))" if relu else f"k{i}_{j}"
                     for j in range(v)]
            body.append(f"    *reinterpret_cast<{word}*>(arg + o) = "
                        + " | ".join(f"(({word}){m} << {8 * j})" for j, m in enumerate(marks)) + ";")
        body.append("}")
    if kind == "fwd":
        return body, f"{st.ctype}* __restrict__ y"
    if kind == "scan":
        return body, f"{st.ctype}* __restrict__ y, unsigned char* __restrict__ arg"
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


def _scan_pairs(v: int, relu: bool, pixels: int, slow: list[str], keep_max: bool = False) -> list[str]:
    """The ``arg`` scan of bfloat16 lanes two at a time (:data:`PAIR_HELPERS`);
    with ``keep_max`` the ``scan`` kind, which also stores each window's
    maximum into ``y`` (16 bytes per output pixel, beside its 8 index bytes).

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
    lane scan's.

    The stored maximum (``keep_max``) is not ``max.NaN``'s word but a fourth
    instruction per cell and pair, a ``LOP3`` taking the cell's bits where
    the same mask is set: the first maximum's own bits, as :func:`_scan`
    stores them. ``max.NaN`` may order -0.0 below +0.0, and the first of a
    tie of zeros is the one max pooling gives (SEMANTICS.md, Pooling); the
    maximum word still serves the comparisons (equal in value) and the NaN
    test."""
    words, word = v // 2, _byte_word(v)
    cell = [f"const uint4 c = *reinterpret_cast<const uint4*>(x + xb + ((IDX)h * W + w) * XP);",
            "const unsigned int words[4] = {c.x, c.y, c.z, c.w};"]

    def update(i: int) -> list[str]:
        lines = [f"if (cw - {i} * SW >= 0 && cw - {i} * SW < KW) {{",
                 f"    const unsigned int kk = (unsigned int)(dh * KW + cw - {i} * SW) * 0x00010001u;"]
        for j in range(words):
            keep = f" yp{i}_{j} = (gt & words[{j}]) | (~gt & yp{i}_{j});" if keep_max else ""
            lines += [f"    {{ const unsigned int gt = og_bf2_gt(words[{j}], bp{i}_{j}); "
                      f"bp{i}_{j} = og_bf2_max(words[{j}], bp{i}_{j}); kp{i}_{j} = (gt & kk) | (~gt & kp{i}_{j});"
                      f"{keep} }}"]
        return lines + ["}"]

    body = ["const int h0 = (int)p * SH - pt, w0 = (int)q * PIX * SW - pl;",
            "const IDX xb = n * H * W * XP + cv * V;",
            "const int fh = h0 < 0 ? -h0 : 0;  // the windows' first in-bounds row"]
    for i in range(pixels):  # the window's first in-bounds cell, in both halves
        body += [f"const unsigned int kf{i} = (unsigned int)(fh * KW + (w0 + {i} * SW < 0 ? -(w0 + {i} * SW) : 0))"
                 " * 0x00010001u;",
                 *(f"unsigned int bp{i}_{j} = 0xff80ff80u, kp{i}_{j} = kf{i};" for j in range(words)),
                 # the maximum's bits: -inf until a cell beats it (a window of -inf stores -inf)
                 *(f"unsigned int yp{i}_{j} = 0xff80ff80u;" for j in range(words) if keep_max)]
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
                 *([f"        *reinterpret_cast<uint4*>(y + o) = make_uint4("
                    + ", ".join(f"yp{i}_{j}" for j in range(words)) + ");"] if keep_max else []),
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


@functools.lru_cache(maxsize=None)
def _source(kind: str, dtype: str, wide: bool, window: tuple, relu: bool = False,
            pixels: int = 1, masked: bool = True) -> tuple[str, str]:
    """``(name, source)`` of one kernel: ``fwd`` (y), ``arg`` (window indices),
    ``scan`` (both from one scan: ``MaxPool2dScan``), ``bwd`` (the gather),
    ``take`` (x at the saved winners; ``masked`` for
    both: what a marked index means, :func:`_take`, :func:`_gather`), ``avg``
    or ``avg_bwd`` (average pooling), for the
    window ``(kh, kw, sh, sw, mh, mw)`` (compile-time constants: the loops
    unroll; ``mh x mw``: the most windows covering one input pixel, at most
    ``ceil(kh / sh) x ceil(kw / sw)`` and at most the pooled extent, so that a
    global pooling's gradient, one window, does not test 49 of them).
    Every thread loop walks pixels ``(n, p, q)`` of a ``QH x QW`` grid, ``V``
    channels ``cv * V`` at a time: the output's for the forward kernels, the
    input's for the backward ones; ``pixels`` (``fwd``, ``arg``, ``scan``): ``P``
    consecutive output columns per thread, ``q`` running over ``ceil(QW / P)``
    groups (:func:`_scan`)."""
    kh, kw, sh, sw, mh, mw = window
    st, v = storage_of(dtype), lanes(dtype)
    x_in = f"const {st.ctype}* __restrict__ x"
    reads_x = "IDX TOTAL, IDX CV, IDX QW, IDX QH, IDX H, IDX W, IDX C, IDX XP"
    reads_gy = "IDX TOTAL, IDX CV, IDX QW, IDX QH, IDX OH, IDX OW, IDX C, IDX GP"
    if kind in ("fwd", "arg", "scan"):
        body, out = _scan(st, v, kind, relu, pixels)
        if kind in ("arg", "scan") and dtype == "bfloat16":
            body = _scan_pairs(v, relu, pixels, slow=body, keep_max=kind == "scan")
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
    if pixels != 1 and kind not in ("fwd", "arg", "scan"):
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
