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

All sizes, strides and offsets are kernel arguments, so one compiled kernel
serves every shape with the same rank, element size, bounds and vector form.
Views of CuPy arrays are passed as they are: the pointer of a view is its
first element.
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
def _plan(shape, dst_strides, src_shape, src_strides, lo, itemsize: int, fill: int, aligned: bool):
    """``(name, source, params, blocks)`` of one copy signature (cached: the launch
    path then only builds the argument tuple)."""
    ndim = len(shape)
    bounded = tuple(l != 0 or s != d for l, s, d in zip(lo, src_shape, shape))
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
                                       address(dst) % 16 == 0 and address(src) % 16 == 0)
    view = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32, 8: xp.uint64}[item]
    compiled(text, name)((blocks, 1, 1), (THREADS, 1, 1),
                         params.arguments({"src": src.view(view), "dst": dst.view(view)}))
    return dst


__all__ = ["collapse", "fill_bits", "copy_into"]
