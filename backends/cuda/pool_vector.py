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
* :func:`max_pool2d_scan` — the same kernel storing each window's winner
  index beside its maximum (``MaxPool2dScan``: one read of x where
  :func:`max_pool2d_argmax` then :func:`max_pool2d_take` read it twice);
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

**The ``tile`` variant** (REVISION 9 and 10; ``rules.vector_pool_variants``
offers ``{"vector": True, "tile": True}``): the bfloat16 scan, gather and take
from shared-memory tiles; why, their limits and shapes: :mod:`.pool_vector_tile`.

The modules: this one holds the public functions, the checks of the operands
(:func:`declines`, :func:`applies`, :func:`indices_apply`) and the launches
(the kernel of a call, its grid, 32- or 64-bit offsets). The kernels' text is
built by :mod:`.pool_vector_lanes` (one item per thread: the window scans,
gathers, takes and averages, lane by lane and in bfloat16 pairs;
:func:`_source`) on :mod:`.pool_vector_window`'s loops over a window, and by
:mod:`.pool_vector_tile_kernels` (:func:`_tile_source`) for the tiles that
:mod:`.pool_vector_tile` shapes. The names of theirs that other code asks this
module for are re-exported here.
"""

from __future__ import annotations

from opgraph.ops.pool_indices import MASKED

from ..reference.pool import PoolGeometry
from ..reference.pool_indices import MAX_WINDOW_CELLS
from .codegen.launch import address, compiled
from .pool_vector_lanes import _source, lanes
from .pool_vector_tile import TileShape, tile_declines, tile_shape
from .pool_vector_tile_kernels import _tile_source
from .pool_vector_window import DIVISOR
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
#: ``tile`` variant: the bfloat16 scan and gather from shared-memory tiles
#: (``pool_vector_tile_kernels._scan_tile``, ``_gather_tile``), 10 the ``tile`` variant of the
#: bfloat16 take (``_take_tile``: x staged as
#: the tile scan stages it, ``_stage_tile``, each lane's winner read from shared memory)
#: (an edit of the kernels' code needs no bump: its fingerprint is in the key too, ``kernel_sources``)
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
#: the most tile rows and images of a launch (CUDA's grid limit in y and z)
GRID_YZ_LIMIT = 65535
#: operands of this many elements or more take the tile kernels with 64-bit offsets
TILE_WIDE_SPAN = 2 ** 31
#: kernels launched otherwise: ``(kind, dtype) -> (threads per block, block cap)``.
#: The bfloat16 pair kernels wait on their loads more than on the ALU (ncu, H200,
#: 2026-12-04: the ALU 60 % busy, occupancy 45 %), and a thread that loops over
#: several items waits for each: one item per thread (no cap) ran GoogLeNet's
#: scans 3-10 % and gathers 6-28 % faster, the scans with 128-thread blocks
#: (docs/results/h200-2026-12-04c/call3/a-pool-launch.log). float32 was not measured.
#: The ``scan`` pair kernel (the ``arg`` scan storing the maxima too) takes the
#: ``arg`` scan's launch: the same loads, one more instruction per cell (not measured).
LAUNCH = {("arg", "bfloat16"): (128, GRID_X_LIMIT), ("bwd", "bfloat16"): (256, GRID_X_LIMIT),
          ("scan", "bfloat16"): (128, GRID_X_LIMIT)}
#: the most cells a window whose winners are indexed may have: a byte's values
#: (``MaxPool2dBackward``); with the ReLU mark (``MaxPool2dBackwardRelu``, the
#: saved-winner ops), ``MASKED`` (``opgraph.ops.pool_indices``: added to a window's
#: index where its winner fails ReLU's mask). The other kernels scan windows of any size.
MAX_CELLS = MAX_WINDOW_CELLS


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


def tile_extent(kind: str, g: PoolGeometry) -> tuple[int, int]:
    """The ``(rows, columns)`` in pixels that a ``kind`` tile launch covers (:func:`tile_shape`'s
    ``extent``): the output's ``(OH, OW)`` for the scan and the take (``arg``, ``take``); for the
    gather (``bwd``) the input's ``(H, W)`` from the last multiple of the stride in the top and
    left padding on, where its tiles start. Raises nothing."""
    if kind != "bwd":
        return tuple(g.out)
    (pt, _), (pl, _) = g.padding
    return g.in_hw[0] + pt % g.stride[0], g.in_hw[1] + pl % g.stride[1]


def _tile_launch(xp, kind, arrays, sizes, g: PoolGeometry, n: int, cv: int, span: int, tile, relu=False,
                 masked=True) -> bool:
    """One launch of a ``tile`` kernel (:func:`_tile_source`) over image count
    ``n`` and ``cv`` channel groups: ``arrays``, the 6 ``sizes`` (``arg``, ``scan``, ``take``: the
    output's, then the input's extents, C and x's pitch; ``bwd``: the input's,
    the output's, C and gy's pitch), the channel blocks, the padding; blocks
    (channel block and tile column, tile row, image). ``tile``: True
    (:func:`tile_shape`) or a :class:`TileShape`. False, launching nothing,
    where the tile rows or the images exceed the grid's y or z limit."""
    window = (*g.kernel, *g.stride)
    extent = tile_extent(kind, g)
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
             masked=True, tile=False, after=()):
    """Launch ``kind`` (``fwd``, ``arg``, ``scan``, ``avg``, ``take``) over the pooled pixels,
    reading x (and ``before``: the take's indices) into ``out`` (and ``after``: the
    ``scan``'s indices, physical ``(N, OH, OW, C)``, beside its maxima in ``out``);
    ``pixels`` output columns per thread (``fwd``, ``arg``, ``scan``:
    ``pool_vector_lanes._scan``); ``tile``: the bfloat16 ``arg`` and ``scan`` scans and the
    ``take`` from shared memory (``pool_vector_tile_kernels._scan_tile``, ``_take_tile``) where
    the window allows (:func:`tile_declines`)."""
    n, c, h, w = x.shape
    (oh, ow), v = g.out, lanes(x.dtype.name)
    total = n * oh * -(-ow // pixels) * (c // v)
    if not total:
        return out
    arrays = [bits(xp, x), *before, bits(xp, out), *after]
    if kind in ("arg", "scan", "take") and _tiled(tile, x.dtype.name, g) and _tile_launch(
            xp, kind, arrays, [oh, ow, h, w, c, pixel_pitch(x)], g, n, c // v,
            max(_span(x), out.size), tile, relu=relu, masked=masked):
        return out
    _launch(xp, kind, x.dtype.name, total, arrays,
            [total, c // v, ow, oh, h, w, c, pixel_pitch(x)], g, max(_span(x), out.size), relu, include_pad,
            pixels, masked)
    return out


def _backward(xp, kind, before, gy, gx, g: PoolGeometry, include_pad=False, masked=True, tile=False):
    """Launch ``kind`` (``bwd``, ``avg_bwd``) over the input pixels: ``before`` (the
    window indices, or nothing), then gy, into ``gx``; ``tile``: the bfloat16
    gather from shared memory (``pool_vector_tile_kernels._gather_tile``) where the window allows."""
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


def max_pool2d_scan(xp, x, idx, g: PoolGeometry, relu: bool = False, pixels: int = 1, tile=False):
    """Max pooling of channels-last ``(N, C, H, W)`` x and its winners from one
    scan (``MaxPool2dScan``): returns a new channels-last ``(N, C, OH, OW)``
    array of x's dtype, :func:`max_pool2d`'s bits, and writes into ``idx``
    (uint8 ``(N, C, OH, OW)``, :func:`indices_apply`) :func:`max_pool2d_argmax`'s
    bytes (``relu``: the index plus :data:`MASKED` where the winner is not > 0;
    the maximum is stored unmasked). x is read once: the pair of
    :func:`max_pool2d_argmax` and :func:`max_pool2d_take` reads it twice.
    ``pixels`` output columns per thread (:data:`PIXELS`); ``tile`` (True or a
    :class:`TileShape`): bfloat16 from shared-memory tiles where the window
    allows (:func:`tile_declines`); the same bits either way.

    Raises:
        ValueError: a :class:`TileShape` ``tile`` that does not divide the
            channel groups. Nothing else: the caller checks :func:`applies`
            and :func:`indices_apply` first (the kernels trust the pitch and
            alignment they check)."""
    y = _nhwc(xp, (*x.shape[:2], *g.out), x.dtype)
    return _forward(xp, "scan", x, y, g, relu=relu, pixels=pixels, tile=tile, after=[idx.transpose(0, 2, 3, 1)])


def max_pool2d_take(xp, x, idx, g: PoolGeometry, masked: bool = False, tile=False):
    """``x`` (channels-last ``(N, C, H, W)``) at each window's saved winner
    ``idx`` (:func:`indices_apply`): a new channels-last ``(N, C, OH, OW)``
    array of x's dtype; a marked index reads 0 with ``masked``; ``tile`` (True
    or a :class:`TileShape`): bfloat16 from a shared-memory tile of x where the
    window allows (``pool_vector_tile_kernels._take_tile``, :func:`tile_declines`; the same bits).

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
           "tile_extent", "tile_shape", "lanes", "pixel_pitch", "declines", "applies", "indices_apply", "max_pool2d",
           "max_pool2d_backward", "max_pool2d_argmax", "max_pool2d_scan", "max_pool2d_take",
           "max_pool2d_backward_indices", "avg_pool2d", "avg_pool2d_backward"]
