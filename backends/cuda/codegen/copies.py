"""Generated strided copies: concat, slice, pad and their gradients, layout changes.

One kernel template moves elements between two strided views of the same
logical iteration shape D (the destination's)::

    dst[coords] = inside ? src[coords - lo] : fill,
    inside = all(0 <= coords - lo < src.shape)

iterating in the destination's memory order (so writes are coalesced), with
the source read through its strides. Without ``lo`` every element is inside
(a plain copy: a concat input into its channel slice of the output, a slice,
a crop, a transpose). Adjacent axes that are contiguous in both views and
unbounded are merged first (an NHWC channel slice of ``(N, H, W, C)`` becomes
``(N*H*W, c)`` rows). When the innermost axis is contiguous in both, its
extent, its offsets and both base addresses are multiples of 16 bytes, the
copy moves 16-byte words; otherwise one element per thread. Elements are
copied as bits (no conversion), and ``fill`` is the storage's bit pattern of
the value (rounded to the dtype on the host: ``-inf`` stays ``-inf``).

**Transposes** (:func:`transpose_form`): a plain copy whose merged axes, in
the destination's order, end with one of destination stride 1 (A) while
another (B) has source stride 1 reads the source at a large stride in that
loop, one sector per element (the classifier's ``Flatten`` of an NHWC
activation, ``(N, H*W, C) -> (N, C, H*W)``, and its gradient's ``Reshape``
back ran at 16-21 % of the copy bandwidth on the H200, bf16). Such a copy,
both axes at least :data:`MIN_RUN` long, runs a shared-memory tiled kernel
instead: a block of 8 warps takes tiles of at most ``TILE x TILE`` elements
(A and B each split evenly into runs of at most :data:`TILE`: an axis of 36
is one run, 100 two of 50), each warp reads rows of the tile along B (lanes
along the source's contiguous axis: 32 consecutive elements per access, up
to ``TILE / 32`` per row), every load of the thread issued before the first
is stored into the tile, then after ``__syncthreads`` writes rows along A
(the destination's contiguous axis) from the tile's columns. The tile's rows
are padded (:func:`tile_pitch`) so that a warp reading a column hits 32
banks, for every element size. Edge tiles check their extents; the other
(batch) axes come from the tile's number, a grid-stride loop over the tiles.
Elements of 1, 2, 4 and 8 bytes, as bits; 64-bit indices when the reach
needs them, as the element kernel. :data:`TILED` ``= False`` keeps the
element kernel for them (benchmarks).

All sizes, strides and offsets are kernel arguments, so one compiled kernel
serves every shape with the same rank, element size, bounds and vector form
(tiled: the same element size and number of batch axes). Views of CuPy arrays
are passed as they are: the pointer of a view is its first element.
"""

from __future__ import annotations

import functools
import hashlib
import math

import numpy as np

from opgraph.types import numpy_dtype

from .emit import Params
from .kernels import THREADS, source
from .launch import address, compiled
from . import plan

#: Blocks a copy launches at most (grid-stride beyond): a copy has no
#: per-channel work to spread, so it keeps the many small blocks the sweeps
#: used before their cap came down to ``plan.MAX_SWEEP_BLOCKS``.
COPY_BLOCKS = 4224

#: element size -> C type the copy moves.
_BITS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}

#: Whether a plain copy that transposes takes the tiled kernel (module docstring). False
#: forces the element kernel: only ``scripts/copy_bench.py`` (old against new) and tests set it.
TILED = True
#: Largest tile extent along each of the two transposed axes (elements); the tile of one
#: copy splits each axis evenly (``ceil(d / ceil(d / TILE))``: 36 stays 36, 100 is 2 x 50).
TILE = 64
#: Shortest extent of either transposed axis the tiled kernel takes (a guess, not timed): below
#: it a warp of the tiled kernel keeps fewer than a quarter of its lanes busy on that side,
#: while the element kernel's reads of 32 consecutive destination elements fall in runs of at
#: least 4 source elements (or, the short axis being B, read a source of rows that short).
MIN_RUN = 8
#: Warps of a block: a warp moves rows of the tile, 32 lanes along a row.
WARPS = THREADS // 32
#: element size -> blocks per SM the tiled kernel is compiled for (``__launch_bounds__``): 8
#: (the SM's 2,048 threads) holds it to 32 registers with its 16 loads in flight (no spill,
#: nvcc 13 for sm_90); 8-byte elements need twice the registers for them and their tile takes
#: 33 KB of shared memory, so 4. 64-bit indices need 40 registers: 6.
_MIN_BLOCKS = {1: 8, 2: 8, 4: 8, 8: 4}


def _element_strides(a) -> tuple:
    return tuple(s // a.itemsize for s in a.strides)


def collapse(dims, dst, src, lo, bounded):
    """Merge adjacent axes (outer first) that are contiguous in both views and
    unbounded (the source's extent there is the destination's).

    Returns the lists ``(dims, dst_strides, src_strides, lo, bounded)``."""
    axes = [list(t) for t in zip(dims, dst, src, lo, bounded)]
    out = axes[:1]
    for d, ds, ss, lo_k, b in axes[1:]:
        last = out[-1]
        if not b and not last[4] and last[1] == ds * d and last[2] == ss * d:
            last[0] *= d
            last[1], last[2] = ds, ss
        else:
            out.append([d, ds, ss, lo_k, b])
    return [list(col) for col in zip(*out)] if out else [[], [], [], [], []]


def fill_bits(value: float, dtype: str) -> int:
    """The bit pattern of ``value`` rounded to storage ``dtype``, as an unsigned integer."""
    arr = np.asarray(value, dtype=numpy_dtype(dtype))
    return int(arr.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[arr.itemsize]))


def _kernel(ndim: int, vector: bool, bounded: tuple, params: Params, fill: str) -> str:
    """The copy kernel body for ``ndim`` merged axes (the innermost carries the vector)."""
    lines = ["    const IDX gtid = (IDX)blockIdx.x * blockDim.x + threadIdx.x;",
             f"    for (IDX v = gtid; v < NV; v += (IDX)gridDim.x * blockDim.x) {{", "        IDX rest = v;"]
    dst_terms, src_terms, inside = [], [], []
    for k in range(ndim - 1, -1, -1):
        if k:
            lines += [f"        const IDX q{k} = {params.div('rest', f'D{k}', params.items[f'DV{k}'][2])};",
                      f"        const IDX x{k} = rest - q{k} * DV{k};", f"        rest = q{k};"]
        else:
            lines.append("        const IDX x0 = rest;")
        dst_terms.append(f"x{k} * DS{k}")
        if bounded[k]:
            lines.append(f"        const IDX y{k} = x{k} - LO{k};")  # wraps below 0: fails y < SD
            inside.append(f"(unsigned long long)y{k} < (unsigned long long)SD{k}")
            src_terms.append(f"y{k} * SS{k}")
        else:
            src_terms.append(f"x{k} * SS{k}")
    read = f"src[{' + '.join(src_terms)}]"
    value = f"({' && '.join(inside)}) ? {read} : {fill}" if inside else read
    lines += [f"        dst[{' + '.join(dst_terms)}] = {value};", "    }"]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=4096)
def _plan(shape, dst_strides, src_shape, src_strides, lo, itemsize: int, fill: int, aligned: bool,
          tiled: bool = True):
    """``(name, source, params, blocks)`` of one copy signature (cached: the launch
    path then only builds the argument tuple): the tiled kernel where ``tiled`` and
    the copy is a transpose (:func:`transpose_form`), else the element kernel."""
    ndim = len(shape)
    bounded = tuple(l != 0 or s != d for l, s, d in zip(lo, src_shape, shape))
    form = transpose_form(shape, dst_strides, src_strides, bounded) if tiled else None
    if form is not None:
        return _tiled_plan(*form, itemsize)
    order = sorted(range(ndim), key=lambda a: -dst_strides[a])  # the destination's memory order
    dims, ds, ss, lo_o, b = collapse(*([seq[a] for a in order] for seq in (shape, dst_strides, src_strides, lo,
                                                                        bounded)))
    # the source's extent of each merged axis: the destination's, unless the axis is bounded
    by_dim = iter(src_shape[a] for a in order if bounded[a])
    sd = [next(by_dim) if bk else d for d, bk in zip(dims, b)]
    per = 16 // itemsize
    vector = (per > 1 and aligned and ds[-1] == 1 and ss[-1] == 1 and dims[-1] % per == 0 and lo_o[-1] % per == 0
              and sd[-1] % per == 0 and all(x % per == 0 for x in ds[:-1] + ss[:-1]))
    lanes = per if vector else 1
    total = math.prod(dims)
    reach = max([total] + [sum((d - 1) * abs(x) for d, x in zip(dims, st)) + 1 for st in (ds, ss)])
    params = Params(reach >= plan.INT32_LIMIT)
    params.pointer("src", "ELEM", "src")
    params.pointer("dst", "ELEM", "dst", const=False)
    params.scalar("NV", total // lanes)
    for k, (d, dstride, sstride) in enumerate(zip(dims, ds, ss)):
        unit = lanes if k == len(dims) - 1 else 1  # the innermost axis counts vectors
        params.scalar(f"DV{k}", d // unit)
        params.scalar(f"DS{k}", dstride // lanes if unit == 1 else 1)  # in ELEMs (16-byte words when vector)
        params.scalar(f"SS{k}", sstride // lanes if unit == 1 else 1)
        if b[k]:
            params.scalar(f"LO{k}", lo_o[k] // unit)
            params.scalar(f"SD{k}", sd[k] // unit)
    if vector:
        words = _repeat(fill, itemsize)
        fill_text = f"make_uint4({words[0]}u, {words[1]}u, {words[2]}u, {words[3]}u)"
    else:
        fill_text = params.scalar("fill", fill, _BITS[itemsize])
    body = _kernel(len(dims), vector, tuple(b), params, fill_text)
    draft = f"typedef {'uint4' if vector else _BITS[itemsize]} ELEM;\n" + source("KERNEL", "float", params, body)
    name = f"opgraph_gen_copy_{hashlib.sha1(draft.encode()).hexdigest()[:12]}"
    blocks = max(1, min(-(-(total // lanes) // THREADS), COPY_BLOCKS))
    return name, draft.replace("void KERNEL(", f"void {name}("), params, blocks


def transpose_form(shape, dst_strides, src_strides, bounded):
    """``(dims, dst_strides, src_strides, b)`` of a plain copy (no bounded axis) that
    is a batched 2-D transpose, else None: its axes of extent > 1 in the
    destination's memory order, merged (:func:`collapse`), where the innermost
    has destination stride 1 and another, axis ``b``, has source stride 1
    (every stride non-negative), both at least :data:`MIN_RUN` long."""
    if any(bounded):
        return None
    keep = [a for a in range(len(shape)) if shape[a] > 1]
    if any(dst_strides[a] < 0 or src_strides[a] < 0 for a in keep):
        return None
    order = sorted(keep, key=lambda a: -dst_strides[a])
    dims, ds, ss, _, _ = collapse(*([seq[a] for a in order] for seq in (shape, dst_strides, src_strides,
                                                                        [0] * len(shape), [False] * len(shape))))
    if len(dims) < 2 or ds[-1] != 1 or ss[-1] == 1 or 1 not in ss[:-1]:
        return None
    b = ss.index(1)
    if min(dims[-1], dims[b]) < MIN_RUN:
        return None
    return tuple(dims), tuple(ds), tuple(ss), b


def tile_pitch(itemsize: int, width: int = TILE) -> int:
    """Elements per row of the shared tile (> ``width``): the tile is read down a
    column (consecutive rows, one column) by a warp, so consecutive rows must start
    in different banks: rows of an odd number of 4-byte words (1-, 2-, 4-byte
    elements), or of an odd number of elements (8-byte ones, which a warp reads 16
    lanes at a time, each in two banks)."""
    p = width + 1
    while not (p % 2 if itemsize == 8 else p * itemsize % 4 == 0 and p * itemsize // 4 % 2):
        p += 1
    return p


def _split(d: int) -> int:
    """The tile extent along an axis of extent ``d``: ``d`` in the fewest runs of at most TILE, evened."""
    return -(-d // -(-d // TILE))


def _rows(rows: str, cols: str, statement: str, pointer: str = "") -> list:
    """Unrolled loops over a warp's rows of the tile (``w + 8 i``, up to ``rows``:
    a warp-uniform exit) and a lane's columns (``lane + 32 c``, up to ``cols``),
    stepping ``pointer`` on by a row of the warp's after each row."""
    step = f", {pointer} += STEP_{pointer}" if pointer else ""
    return ["#pragma unroll", f"        for (int i = 0; i < {TILE // WARPS}; ++i{step}) {{",
            f"            if (w + {WARPS} * i >= {rows}) break;",
            "#pragma unroll", f"            for (int c = 0; c < {TILE // 32}; ++c) {{",
            f"                if (lane + 32 * c < {cols}) {statement};", "            }", "        }"]


def _tiled_kernel(batch: int, pitch: int, params: Params) -> str:
    """The tiled transpose's body (module docstring) for ``batch`` axes besides A and B."""
    lines = [f"    __shared__ ELEM tile[{TILE * pitch}];  // tile[a * {pitch} + b]",
             "    const IDX lane = threadIdx.x & 31, w = threadIdx.x >> 5;",
             f"    const IDX STEP_sp = {WARPS} * SSA, STEP_dp = {WARPS} * DSB;",
             "    for (IDX k = blockIdx.x; k < NT; k += gridDim.x) {",
             "        IDX rest = k;"]
    # the tile's number: its a-tile fastest, then its b-tile, then the batch axes from the innermost out
    axes = [("NTA", "a0", " * TA"), ("NTB", "b0", " * TB")] + [(f"D{n}", f"x{n}", "") for n in range(batch - 1, -1, -1)]
    for k, (size, coord, scale) in enumerate(axes):
        if k < len(axes) - 1:
            lines += [f"        const IDX q{k} = {params.div('rest', size, params.items[size + 'V'][2])};",
                      f"        const IDX {coord} = (rest - q{k} * {size}V){scale};", f"        rest = q{k};"]
        else:
            lines.append(f"        const IDX {coord} = rest{scale};")
    src = " + ".join(["(a0 + w) * SSA", "b0 + lane"] + [f"x{n} * SS{n}" for n in range(batch)])
    dst = " + ".join(["(b0 + w) * DSB", "a0 + lane"] + [f"x{n} * DS{n}" for n in range(batch)])
    lines += ["        const IDX na = DA - a0 < TA ? DA - a0 : TA, nb = DB - b0 < TB ? DB - b0 : TB;  // edge tiles",
              f"        const ELEM* sp = src + ({src});  // (a0 + w, b0 + lane)",
              f"        ELEM* dp = dst + ({dst});  // (b0 + w, a0 + lane)",
              f"        ELEM r[{TILE // WARPS}][{TILE // 32}];  // every load issued before the first is used",
              *_rows("na", "nb", "r[i][c] = sp[32 * c]", "sp"),
              *_rows("na", "nb", f"tile[(w + {WARPS} * i) * {pitch} + lane + 32 * c] = r[i][c]"),
              "        __syncthreads();",
              *_rows("nb", "na", f"dp[32 * c] = tile[(lane + 32 * c) * {pitch} + w + {WARPS} * i]", "dp"),
              "        __syncthreads();  // before the next tile overwrites this one",
              "    }"]
    return "\n".join(lines) + "\n"


def _tiled_plan(dims, ds, ss, b: int, itemsize: int):
    """``(name, source, params, blocks)`` of the tiled transpose of :func:`transpose_form`'s
    ``(dims, ds, ss, b)``: A the innermost axis, B axis ``b``, the rest batch axes."""
    a = len(dims) - 1
    batch = [k for k in range(len(dims)) if k not in (a, b)]
    ta, tb = _split(dims[a]), _split(dims[b])
    nta, ntb = -(-dims[a] // ta), -(-dims[b] // tb)
    tiles = nta * ntb * math.prod(dims[k] for k in batch)
    reach = max([tiles] + [sum((d - 1) * x for d, x in zip(dims, st)) + 1 for st in (ds, ss)])
    params = Params(reach >= plan.INT32_LIMIT)
    params.pointer("src", "ELEM", "src")
    params.pointer("dst", "ELEM", "dst", const=False)
    for name, value in (("NT", tiles), ("TA", ta), ("TB", tb), ("DA", dims[a]), ("DB", dims[b]),
                        ("SSA", ss[a]), ("DSB", ds[b]), ("NTAV", nta), ("NTBV", ntb)):
        params.scalar(name, value)
    for n, k in enumerate(batch):
        params.scalar(f"D{n}V", dims[k])
        params.scalar(f"SS{n}", ss[k])
        params.scalar(f"DS{n}", ds[k])
    body = _tiled_kernel(len(batch), tile_pitch(itemsize), params)
    draft = f"typedef {_BITS[itemsize]} ELEM;\n" + source("KERNEL", "float", params, body)
    name = f"opgraph_gen_copy_t_{hashlib.sha1(draft.encode()).hexdigest()[:12]}"
    blocks_per_sm = min(_MIN_BLOCKS[itemsize], 6 if params.wide else 8)
    text = draft.replace("void KERNEL(", f"void __launch_bounds__({THREADS}, {blocks_per_sm}) {name}(")
    return name, text, params, max(1, min(tiles, COPY_BLOCKS))


def _repeat(bits: int, itemsize: int) -> tuple:
    """A 16-byte word of ``bits`` repeated, as four 32-bit words (x, y, z, w)."""
    word = 0
    for k in range(16 // itemsize):
        word |= bits << (8 * itemsize * k)
    return tuple((word >> (32 * q)) & 0xFFFFFFFF for q in range(4))


def copy_into(xp, dst, src, lo=None, fill: float = 0.0):
    """``dst[c] = src[c - lo]`` where inside ``src``, else ``fill`` (module docstring);
    ``dst`` and ``src`` are arrays or views of one dtype and rank (``lo`` None:
    the same shape, every element copied). Returns ``dst``.

    Raises:
        ValueError: ranks or dtypes differ, or (without ``lo``) the shapes do.
    """
    if dst.ndim != src.ndim or dst.dtype != src.dtype or (lo is None and dst.shape != src.shape):
        raise ValueError(f"copy_into: {src.shape} {src.dtype} -> {dst.shape} {dst.dtype}")
    if dst.size == 0:
        return dst
    lo = tuple(int(v) for v in lo) if lo is not None else (0,) * dst.ndim
    item = dst.itemsize
    bits = fill_bits(fill, dst.dtype.name) if any(lo) or src.shape != dst.shape else 0
    name, text, params, blocks = _plan(tuple(dst.shape), _element_strides(dst), tuple(src.shape),
                                       _element_strides(src), lo, item, bits,
                                       address(dst) % 16 == 0 and address(src) % 16 == 0, TILED)
    view = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32, 8: xp.uint64}[item]
    compiled(text, name)((blocks, 1, 1), (THREADS, 1, 1),
                         params.arguments({"src": src.view(view), "dst": dst.view(view)}))
    return dst


__all__ = ["TILED", "TILE", "MIN_RUN", "collapse", "transpose_form", "tile_pitch", "fill_bits", "copy_into"]
