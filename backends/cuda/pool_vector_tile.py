"""The ``tile`` variant of the vector kernels: which windows it takes, its tiles' shapes and shared memory.

The kernels' text is :mod:`.pool_vector_tile_kernels`' (``_scan_tile``,
``_gather_tile``, ``_take_tile``, ``_stage_tile``), the one-item-per-thread
kernels they replace :mod:`.pool_vector_lanes`' (``_scan_pairs``,
``_gather_pairs``, ``_take_bits``); :mod:`.pool_vector` launches them.

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

import attrs

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


def tile_smem(kind: str, window: tuple, t: TileShape) -> int:
    """Shared-memory bytes of one block of a ``kind`` launch (``arg``, ``take`` or ``bwd``) over
    tile ``t`` with ``window = (kh, kw, sh, sw)``: the scan's (and the take's) input rows and
    columns under ``t``'s outputs, 16 bytes per cell and channel group; the gather's windows
    covering ``t``'s pixels, 16 bytes of index pairs plus 16 of gradients each
    (``pool_vector_tile_kernels._gather_tile``). Raises nothing; a block over
    :data:`TILE_SMEM` is what :func:`tile_shape` avoids."""
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
    columns, then fewer groups, until the tile fits :data:`TILE_SMEM`.
    ``window = (kh, kw, sh, sw)``; extents in pixels; ``groups`` in 16-byte channel
    groups (8 bfloat16 channels each). Raises ValueError for ``groups < 1`` or an
    extent below 1 (the launch asks for neither)."""
    if groups < 1 or min(extent) < 1:
        raise ValueError(f"tile_shape: groups={groups} and extent={tuple(extent)} must be at least 1")
    step = (window[2], window[3]) if kind == "bwd" else (1, 1)

    def split(n: int, s: int, pieces: int) -> int:  # ceil(n / pieces), rounded up to a multiple of s
        return -(-(-(-n // pieces)) // s) * s

    h_pieces, w_pieces = -(-extent[0] // TILE_ROWS), -(-extent[1] // TILE_COLS)
    threads = TILE_THREADS
    while True:
        rows, cols = split(extent[0], step[0], h_pieces), split(extent[1], step[1], w_pieces)
        most = max(1, threads // cols)
        t = TileShape(rows, cols, max(d for d in range(1, min(groups, most) + 1) if groups % d == 0))
        if tile_smem(kind, window, t) <= TILE_SMEM or (t.rows, t.cols, t.groups) == (*step, 1):
            return t
        if rows > step[0]:
            h_pieces += 1
        elif cols > step[1]:
            w_pieces += 1
        else:
            threads = cols * t.groups - 1
