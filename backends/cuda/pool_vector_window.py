"""The pooling window in the vector kernels' CUDA text: its run-time parameters and the unrolled loops.

Shared by the kernels of :mod:`.pool_vector_lanes` and :mod:`.pool_vector_tile_kernels`:
the run-time padding every kernel takes (:data:`_PADDING`; the launch passes
it, ``pool_vector._padding``), the average's divisor (:data:`DIVISOR`, also
:mod:`.pool`'s), and the statements that walk a window's cells or the windows
covering a pixel, unrolled over the compile-time window (``KH``, ``KW``,
``SH``, ``SW``, ``MH``, ``MW``).
"""

from __future__ import annotations

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
