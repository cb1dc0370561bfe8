"""The CUDA text of the ``tile`` kernels: the bfloat16 scan, take and gather from shared-memory tiles.

Why the tiles, their limits and shapes: :mod:`.pool_vector_tile`. The kernels
they stand beside, whose results they give bit for bit (``_scan``,
``_scan_pairs``, ``_gather``, ``_gather_pairs``, ``_take_bits``), and the pair
helpers they use (:data:`PAIR_HELPERS`): :mod:`.pool_vector_lanes`.
"""

from __future__ import annotations

import functools

from opgraph.ops.pool_indices import MASKED

from .codegen.storage import DEVICE_HELPERS, storage_of
from .pool_vector_lanes import PAIR_HELPERS, _scan
from .pool_vector_tile import TileShape
from .pool_vector_window import _PADDING

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


def _scan_tile(relu: bool, window: tuple, t: TileShape, slow: list[str], keep_max: bool = False) -> list[str]:
    """The ``arg`` scan of bfloat16 from a shared-memory tile (``tile`` variant);
    with ``keep_max`` the ``scan`` kind, which also stores each output's 8
    maxima into ``y``, one 16-byte store beside the 8-byte index store.

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
    The staging is :func:`_stage_tile`'s.

    ``keep_max``: the maxima stored are the winners' own bits, taken by the
    same masks as the indices (a row's ``rv``, an output's ``v``; one ``LOP3``
    per pair beside the index's), not ``max.NaN``'s words, which may order
    -0.0 below +0.0 where the first of a tie of zeros is the one max pooling
    gives (``pool_vector_lanes._scan_pairs``). ``slow`` then stores both."""
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
        if keep_max:  # the row's first maximum's bits (its first cell to start: as rb)
            lines.append(" ".join(f"unsigned int rv{r}_{j} = rb{r}_{j};" for j in range(4)))
        for dw in range(1, kw):
            lines += [f"{{ const uint4 e = col[{(r * iw + dw) * t.groups}];",
                      "  const unsigned int ew[4] = {e.x, e.y, e.z, e.w};"]
            for j in range(4):
                keep = f" rv{r}_{j} = (gt & ew[{j}]) | (~gt & rv{r}_{j});" if keep_max else ""
                lines.append(f"  {{ const unsigned int gt = og_bf2_gt(ew[{j}], rb{r}_{j}); "
                             f"rb{r}_{j} = og_bf2_max(ew[{j}], rb{r}_{j}); "
                             f"rk{r}_{j} = (gt & {_hexu((r * kw + dw) * 0x10001)}) | (~gt & rk{r}_{j});{keep} }}")
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
            if keep_max:  # a first row of -inf holds -inf's bits: the maximum whichever cell wins
                body.append(f"  unsigned int v{j} = rv{r0}_{j};")
            body.append(f"  {{ const unsigned int gt = og_bf2_gt(rb{r0}_{j}, 0xff80ff80u); "
                        f"k{j} = (gt & rk{r0}_{j}) | (~gt & kf); }}")
        for dh in range(1, kh):
            r = r0 + dh
            for j in range(4):
                keep = f" v{j} = (gt & rv{r}_{j}) | (~gt & v{j});" if keep_max else ""
                body.append(f"  {{ const unsigned int gt = og_bf2_gt(rb{r}_{j}, b{j}); "
                            f"b{j} = og_bf2_max(rb{r}_{j}, b{j}); k{j} = (gt & rk{r}_{j}) | (~gt & k{j});{keep} }}")
        ks = [f"(k{j} - {_hexu(r0 * kw * 0x10001)})" for j in range(4)]
        if relu:  # MASKED where the winner is not > 0
            ks = [f"({k} | (~og_bf2_gt(b{j}, 0u) & {MASKED * 0x10001:#x}u))" for j, k in enumerate(ks)]
        out = f"((n * QH + oh0 + {i}) * QW + oq) * C + cv * V"
        body += [f"  if (oh0 + {i} < (int)QH && oq < (int)QW) {{",
                 "    if (og_bf2_nan(b0) | og_bf2_nan(b1) | og_bf2_nan(b2) | og_bf2_nan(b3)) "
                 f"nanmask |= {1 << i}u;",
                 f"    else {'{ ' if keep_max else ''}*reinterpret_cast<unsigned long long*>(arg + {out}) =",
                 f"        (unsigned long long)og_byte_perm({ks[0]}, {ks[1]}, 0x6420u)",
                 f"        | ((unsigned long long)og_byte_perm({ks[2]}, {ks[3]}, 0x6420u) << 32);",
                 *([f"      *reinterpret_cast<uint4*>(y + {out}) = make_uint4(v0, v1, v2, v3); }}"]
                   if keep_max else []),
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
    ``scan`` (the same, storing the maxima too: ``MaxPool2dScan``), ``take``
    (:func:`_take_tile`) or ``bwd`` (:func:`_gather_tile`) of bfloat16, for the window ``(kh, kw, sh, sw)``
    and the tile ``t`` (compile-time constants: every loop unrolls). One block per
    tile (no grid-stride loop: blocks that finish make room for others)."""
    kh, kw, sh, sw = window
    st = storage_of("bfloat16")
    sizes = "IDX QH, IDX QW, IDX H, IDX W, IDX C, IDX XP" if kind != "bwd" else \
        "IDX QH, IDX QW, IDX OH, IDX OW, IDX C, IDX GP"
    tiles = "IDX CBLOCKS"
    if kind in ("arg", "scan"):
        slow, out = _scan(st, 8, kind, relu)
        body = _scan_tile(relu, window, t, slow, keep_max=kind == "scan")
        params = f"const {st.ctype}* __restrict__ x, {out}"
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
