"""Backward-filter of a depthwise convolution on channels-last tensors: a
deterministic two-pass reduction, 16 bytes of channels per thread, the
geometry compiled in.

For x ``(N, C, H, W)`` and gy ``(N, C, Ho, Wo)``, both channels-last, the
weight gradient of a depthwise convolution (``groups`` = C, one filter per
channel, multiplier 1) is::

    dw[c, 0, kh, kw] = sum over n, oh, ow of
                       gy[n, c, oh, ow] * x[n, c, oh * SH - PT + kh * DH, ow * SW - PL + kw * DW]

taps outside x counting zero (the forward's gather, summed over the output
positions instead of the taps; Dumoulin & Visin, "A guide to convolution
arithmetic for deep learning", 2016, section 2). It is a reduction of
``N * Ho * Wo`` products per (channel, tap), reading x and gy once: memory-bound.

Structure (no atomics, so the result is the same on every run):

* pass 1 (``opgraph_dw_wgrad_*``): a grid of ``(chunks, channel tiles)``
  blocks. Block ``(b, t)`` owns a chunk of ``RPC`` consecutive (n, oh) output
  rows and ``CB`` groups of ``V`` consecutive channels (``V = 16 /
  itemsize``: 8 bfloat16 or float16, 4 float32, 2 float64, moved as 16-byte
  words; ``V = 1``, scalar loads, where C is not a multiple of V or x or gy is
  not 16-byte aligned). Its threads are ``(channel group, kernel-row group g,
  worker k)``, channel groups fastest (a warp reads whole lines). A worker
  walks the chunk's strips of ``P`` output pixels of one row (``k, k + K,
  ...``); per strip it loads the P gy words once and, per kernel row of its
  group (rows ``g, g + G, ...``), each distinct x column the strip's (pixel,
  tap) pairs touch once (the column plan, :func:`_columns`: a 3x3/1 strip of
  2 pixels loads 4 x words per kernel row for 6 products), accumulating
  ``ceil(KH / G) * KW * V`` sums in registers (float32; float64 for
  float64). ``G`` (:func:`_row_groups`) is the fewest groups that keep those
  sums within 288 bytes: 3x3 bfloat16 G = 1 (72 floats), 5x5 bfloat16 G = 5
  (40), 5x5 float32 G = 2 (60); with the P gy vectors, an x word and the
  indices about 110-130 registers. Then the block sums its K workers' values
  tap by tap in shared memory (``BLOCK * V`` values), worker 0 first, and
  writes one partial per (chunk, tap, channel): ``part[b, tap, c]``;
* pass 2 (``opgraph_dw_wgrad_sum_*``): 256-thread blocks of 8 (tap, channel)
  columns by 32 lanes; lane l sums chunks ``l, l + 32, ...`` in order, then
  lane 0 the 32 lane sums in order, rounds once to the storage dtype
  (bfloat16 to nearest even: ``codegen.storage``) and stores dw at ``c * kH
  * kW + kh * kW + kw``: OIHW and cuDNN's KRSC (channels-last) order agree
  for one input channel per filter; the result is the channels-last view
  cuDNN's backward-filter returns.

The number of chunks fills about :data:`TARGET_BLOCKS` blocks (132 SMs, a
few blocks each), no more than the rows, and keeps the partials' traffic
within a quarter of x's and gy's bytes. Sums are in a fixed order for a
given (chunks, strip width), so a call is deterministic; the autotune
variants (:func:`variants`: 4-pixel strips, twice the chunks) order their
float32 sums differently and agree with the default to rounding. Index
arithmetic is 32-bit when x, gy and the partials are below 2^31 elements,
64-bit otherwise. Kernels compile through CuPy by source text
(``codegen.launch.compiled``), so the tests run them on the CPU emulator.

The ``cuda`` rule of ``Conv2dBackwardFilter`` that runs it is an autotune
candidate beside cuDNN's engines (tag ``depthwise-wgrad``:
``exclude=['depthwise-wgrad']`` turns it off). On the H200 (2026-12-03,
bf16, batch 128, device clock; ``tests/gpu/test_depthwise_wgrad_gpu.py``
passed) it won where cuDNN is slowest: EfficientNet-B0's 5x5/2 layer of 672
channels at 14 x 14, 0.056 ms against cuDNN's 0.767 (its operands take 0.01
ms to copy), and MobileNet-v2's 3x3/2 of 576 channels (0.025 against 0.028);
cuDNN's engine 0 kept the other 17 depthwise shapes of the two models, by
7-60 %.
"""

from __future__ import annotations

import functools

from opgraph.errors import ShapeError
from opgraph.types import numpy_dtype

from .codegen.launch import address, compiled
from .codegen.storage import DEVICE_HELPERS, storage_of, vector_load
from .kernel_sources import fingerprinted
from .depthwise import declines, lanes, operand_dtypes
from .storage import dtype_name

#: the kernels' revision, part of the autotune cache key (:func:`variants`)
#: (an edit of the kernels' code needs no bump: its fingerprint is in the key too, ``kernel_sources``)
REVISION = 1
THREADS = 256
#: default strip width (output pixels of one row per worker and step)
PIXELS = 2
#: pass 1 blocks aimed at: the H200's 132 SMs, about 4 blocks each
TARGET_BLOCKS = 528
#: bytes of sums one thread may hold in registers (:func:`_row_groups`)
ACC_BYTES = 288
#: channel groups of one block at most (a block's channel tile)
TILE = 32
#: pass 2: (tap, channel) columns and chunk lanes of a block
SUM_COLS, SUM_LANES = 8, 32
_INT32_LIMIT = 2 ** 31 - 1


def variants(op, in_types, device):
    """The autotune variants of the ``cuda`` rule of ``Conv2dBackwardFilter``:
    the default (:data:`PIXELS`-pixel strips, chunks for :data:`TARGET_BLOCKS`
    blocks); 4-pixel strips (fewer x loads per product, more registers);
    twice the chunks (more blocks, more partials). Its ``revision``
    (:data:`REVISION`) is part of the autotune cache key."""
    return [{}, {"pixels": 4}, {"chunks": 2}]


variants.revision = REVISION
#: the kernels' source, part of the autotune cache key too: an edit re-tunes without a REVISION bump
variants.fingerprint = fingerprinted(__name__)


# ---------------------------------------------------------------- planning

def _columns(pixels: int, kw: int, sw: int, dw: int) -> list[tuple[int, list]]:
    """The column plan of a strip: ``[(d, [(p, k), ...])]``, x column ``ow0 * SW
    - PL + d`` feeding pixel ``ow0 + p`` through tap ``k`` (``d = p * sw + k *
    dw``); each (p, k) appears once, each d once, in increasing d."""
    plan: dict[int, list] = {}
    for p in range(pixels):
        for k in range(kw):
            plan.setdefault(p * sw + k * dw, []).append((p, k))
    return sorted(plan.items())


def _row_groups(kh: int, kw: int, v: int, itemsize: int) -> int:
    """G: the fewest kernel-row groups whose ``ceil(kh / G) * kw * v`` sums of
    ``itemsize`` bytes fit :data:`ACC_BYTES` (at most ``kh``: one row each)."""
    return next((g for g in range(1, kh + 1) if -(-kh // g) * kw * v * itemsize <= ACC_BYTES), kh)  # kh: too_large


def too_large(kh: int, kw: int, dtype: str) -> str | None:
    """Why a ``kh x kw`` kernel does not fit this kernel's plan, or None: one
    kernel row's sums of the vector path (``kw * V`` in the compute type) must
    fit :data:`ACC_BYTES`, and the row groups (one row each at most) a block of
    :data:`THREADS` threads (else the plan would spill, or find no block)."""
    acc = 8 if dtype == "float64" else 4
    row = kw * lanes(dtype) * acc
    if row > ACC_BYTES or kh > THREADS:
        return (f"a {kh}x{kw} kernel is beyond the generated kernel's plan (one kernel row's sums take {row} "
                f"bytes of the {ACC_BYTES} a thread holds, and at most {THREADS} kernel rows)")
    return None


def _plan(c: int, v: int, g: int) -> tuple[int, int, int]:
    """``(CB, tiles, K)``: channel groups per block, channel tiles, workers per block."""
    cv = c // v
    tiles = -(-cv // TILE)
    cb = -(-cv // tiles)
    while cb * g > THREADS:  # one worker at least
        tiles += 1
        cb = -(-cv // tiles)
    return cb, tiles, max(1, THREADS // (cb * g))


def _chunks(rows: int, tiles: int, factor: int, in_bytes: int, taps: int, c: int, acc_size: int) -> int:
    """Pass 1's chunks of output rows (module docstring)."""
    want = -(-TARGET_BLOCKS * factor // tiles)
    cap = max(1, in_bytes // (8 * taps * c * acc_size))  # partials within a quarter of the input
    return max(1, min(rows, want, cap * factor))


# ---------------------------------------------------------------- code generation

@functools.lru_cache(maxsize=None)
def _source(dtype: str, geo: tuple, v: int, pixels: int, g: int, cb: int, k: int, rpc: int, wide: bool):
    """``(pass 1 name, pass 2 name, source)`` of one layer shape: ``geo`` = (N,
    C, H, W, HO, WO, KH, KW, SH, SW, PT, PL, DH, DW), ``v`` lanes, strips of
    ``pixels``, ``g`` kernel-row groups, ``cb`` channel groups and ``k``
    workers per block, ``rpc`` output rows per chunk, 64-bit indices if ``wide``."""
    n, c, h, w, ho, wo, kh, kw, sh, sw, pt, pl, dh, dw = geo
    st = storage_of(dtype)
    ct = "double" if dtype == "float64" else "float"
    mr = -(-kh // g)
    block = cb * g * k
    defines = dict(C=c, H=h, W=w, HO=ho, WO=wo, KH=kh, KW=kw, SH=sh, SW=sw, PT=pt, PL=pl, DH=dh, DW=dw, V=v,
                   P=pixels, NS=-(-wo // pixels), CV=c // v, CB=cb, G=g, K=k, BLOCK=block, RPC=rpc, NR=n * ho,
                   NT=kh * kw, SC=SUM_COLS, SL=SUM_LANES)
    acc = [[[f"a{m}_{j}_{q}" for q in range(v)] for j in range(kw)] for m in range(mr)]
    tail = wo % pixels != 0
    body = ["__shared__ CT red[BLOCK * V];",
            "const int t = threadIdx.x;",
            "const int cvl = t % CB, g = (t / CB) % G, k = t / (CB * G);",
            "const int cv = blockIdx.y * CB + cvl;",
            "const IDX c0 = (IDX)cv * V;",
            "const int r0 = blockIdx.x * RPC;",
            "const int items = (NR - r0 < RPC ? NR - r0 : RPC) * NS;",
            *(f"CT {a} = 0;" for m in acc for j in m for a in j),
            "if (cv < CV) {",
            "  for (int i = k; i < items; i += K) {",
            "    const int rl = i / NS, s = i - rl * NS;",
            "    const int row = r0 + rl, nn = row / HO, oh = row - nn * HO;",
            "    const int ow0 = s * P;",
            "    const IDX gb = ((IDX)row * WO + ow0) * C + c0;"]
    for p in range(pixels):
        lines, vals = vector_load(st, "gy", f"gb + {p} * C", v, f"y{p}")
        body += [*(f"    CT g{p}_{q} = 0;" for q in range(v)),
                 f"    if ({'ow0 + %d < WO' % p if tail else 'true'}) {{",
                 *("      " + x for x in lines), *(f"      g{p}_{q} = {x};" for q, x in enumerate(vals)), "    }"]
    plan = _columns(pixels, kw, sw, dw)
    for m in range(mr):
        cols = []
        for d, feeds in plan:
            lines, vals = vector_load(st, "x", "(xb + iw) * C + c0", v, "xv")
            fma = []
            for p, j in feeds:
                adds = [f"{acc[m][j][q]} += g{p}_{q} * x{q};" for q in range(v)]
                fma += [f"if (ow0 + {p} < WO) {{ " + " ".join(adds) + " }"] if tail and p else adds
            cols += [f"{{ const int iw = iw0 + {d};", "  if ((unsigned)iw < (unsigned)W) {",
                     *("    " + x for x in lines), *(f"    const CT x{q} = {x};" for q, x in enumerate(vals)),
                     *("    " + x for x in fma), "} }"]
        body += [f"    {{ const int kh = g + {m} * G, ih = oh * SH - PT + kh * DH;",
                 "      if (kh < KH && (unsigned)ih < (unsigned)H) {",
                 "        const IDX xb = ((IDX)nn * H + ih) * W;",
                 "        const int iw0 = ow0 * SW - PL;",
                 *("        " + x for x in cols), "    } }"]
    body += ["  }", "}"]
    # the block's sums, tap slot by tap slot: worker 0 first, then 1, ... (a fixed order)
    for m in range(mr):
        for j in range(kw):
            body += [*(f"red[t * V + {q}] = {acc[m][j][q]};" for q in range(v)),
                     "__syncthreads();",
                     "for (int o = t; o < CB * G * V; o += BLOCK) {",
                     "  const int q = o % V, gc = o / V, cl = gc % CB, gg = gc / CB;",
                     f"  const int kr = gg + {m} * G, cw = blockIdx.y * CB + cl;",
                     "  if (kr < KH && cw < CV) {",
                     "    CT sum = red[o];",
                     "    for (int kk = 1; kk < K; ++kk) sum += red[kk * (CB * G * V) + o];",
                     f"    part[((IDX)blockIdx.x * NT + kr * KW + {j}) * C + (IDX)cw * V + q] = sum;",
                     "  }", "}",
                     "__syncthreads();"]
    tag = f"{dtype}_{'i64' if wide else 'i32'}_v{v}_k{kh}x{kw}s{sh}x{sw}_p{pixels}g{g}"
    name, sname = f"opgraph_dw_wgrad_{tag}", f"opgraph_dw_wgrad_sum_{tag}"
    params = f"const {st.ctype}* __restrict__ x, const {st.ctype}* __restrict__ gy, CT* __restrict__ part"
    # pass 2: column col = tap * C + c (coalesced partial reads), lane l sums chunks l, l + SL, ...
    sum_kernel = (f'extern "C" __global__ void {sname}(const CT* __restrict__ part, {st.ctype}* __restrict__ dw, '
                  "int NCH) {\n"
                  "    __shared__ CT lane_sums[SC * SL];\n"
                  "    const int t = threadIdx.x, lane = t / SC, col = blockIdx.x * SC + t % SC;\n"
                  "    CT s = 0;\n"
                  "    if (col < NT * C)\n"
                  "        for (int b = lane; b < NCH; b += SL) s += part[(IDX)b * (NT * C) + col];\n"
                  "    lane_sums[t] = s;\n"
                  "    __syncthreads();\n"
                  "    if (lane == 0 && col < NT * C) {\n"
                  "        CT total = lane_sums[t];\n"
                  "        for (int l = 1; l < SL; ++l) total += lane_sums[l * SC + t];\n"
                  "        const int tap = col / C, c = col - tap * C;\n"
                  f"        dw[c * NT + tap] = {st.store('total')};\n"
                  "    }\n}\n")
    text = (f"typedef {ct} CT;\ntypedef {'long long' if wide else 'int'} IDX;\n"
            + "".join(f"#define {key} {val}\n" for key, val in defines.items()) + DEVICE_HELPERS + "\n"
            + f'extern "C" __global__ void {name}({params}) {{\n'
            + "".join(f"    {line}\n" for line in body) + "}\n" + sum_kernel
            + "".join(f"#undef {key}\n" for key in defines))  # nothing leaks into a source compiled after it
    return name, sname, text


def _raw(xp, a):
    """``a`` as the kernels take it: bfloat16 and float16 as their uint16 bits (a view)."""
    return a.view(xp.uint16) if a.dtype.itemsize == 2 else a


def conv2d_backward_filter(xp, x, gy, *, stride, padding, dilation, groups, weight_shape, pixels=PIXELS,
                           chunks=1):
    """``dL/dw`` of a depthwise convolution (module docstring): x ``(N, C, H,
    W)`` and gy ``(N, C, Ho, Wo)`` (channels-last, or copied to it) ->
    ``weight_shape`` ``(C, 1, kH, kW)`` in x's dtype, stored as cuDNN's
    channels-last backward-filter stores it (``(C, kH, kW, 1)`` in memory,
    the same order as OIHW). ``padding`` is ``((top, bottom), (left,
    right))``. ``pixels``: output pixels of a strip; ``chunks``: a factor on
    the number of row chunks; both are the autotune variants' options
    (:func:`variants`). A batch of 0 gives zeros. Formula: Dumoulin & Visin
    (2016), as the module docstring writes it.

    Raises:
        ShapeError: not a depthwise convolution of multiplier 1, a geometry
            beyond 32-bit tap arithmetic, a kernel beyond the plan
            (:func:`too_large`), operands of different dtypes, or gy not of the
            forward output's shape.
    """
    why = (declines(gy.shape, weight_shape, groups, x.shape, "NHWC", padding, dilation)
           or too_large(int(weight_shape[2]), int(weight_shape[3]), dtype_name(x.dtype)))
    if why:
        raise ShapeError(f"depthwise conv2d_backward_filter: {why}")
    if x.dtype != gy.dtype:
        raise ShapeError(f"depthwise conv2d_backward_filter: input {x.dtype} and output gradient {gy.dtype} differ")
    n, c, h, wd = (int(v) for v in x.shape)
    kh, kw = (int(k) for k in weight_shape[2:])
    (pt, pb), (pl, pr) = ((int(a), int(b)) for a, b in padding)
    sh, sw = (int(s) for s in stride)
    dh, dw = (int(d) for d in dilation)
    ho, wo = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if tuple(gy.shape) != (n, c, ho, wo):
        raise ShapeError(f"depthwise conv2d_backward_filter: output gradient {tuple(gy.shape)}, "
                         f"the forward output is {(n, c, ho, wo)}")
    dtype = dtype_name(x.dtype)
    # the NHWC buffers: the operands' own memory when channels-last, else copies
    xb = xp.ascontiguousarray(_raw(xp, x).transpose(0, 2, 3, 1))
    gb = xp.ascontiguousarray(_raw(xp, gy).transpose(0, 2, 3, 1))
    out = xp.empty((c, kh, kw, 1), dtype=xb.dtype)
    if n == 0 or ho <= 0 or wo <= 0:
        out[...] = 0
    else:
        v = lanes(dtype)
        if c % v or address(xb) % 16 or address(gb) % 16:
            v = 1
        acc_size = 8 if dtype == "float64" else 4
        g = _row_groups(kh, kw, v, acc_size)
        cb, tiles, k = _plan(c, v, g)
        pixels = max(1, min(int(pixels), wo))
        nch = _chunks(n * ho, tiles, max(1, int(chunks)), xb.nbytes + gb.nbytes, kh * kw, c, acc_size)
        rpc = -(-n * ho // nch)
        nch = -(-n * ho // rpc)
        part = xp.empty(nch * kh * kw * c, dtype=xp.float64 if dtype == "float64" else xp.float32)
        wide = max(xb.size, gb.size, part.size) >= _INT32_LIMIT
        name, sname, text = _source(dtype, (n, c, h, wd, ho, wo, kh, kw, sh, sw, pt, pl, dh, dw), v, pixels, g,
                                    cb, k, rpc, wide)
        compiled(text, name)((nch, tiles), (cb * g * k,), (xb, gb, part))
        compiled(text, sname)((-(-kh * kw * c // SUM_COLS),), (SUM_COLS * SUM_LANES,),
                              (part, out.reshape(-1), xp.int32(nch)))
    res = out.view(numpy_dtype(dtype)) if out.dtype.itemsize == 2 else out
    return res.transpose(0, 3, 1, 2)


def conv2d_backward_filter_kernel(ctx, op, x, gy):
    """The ``cuda`` rule's kernel of ``Conv2dBackwardFilter`` (:func:`conv2d_backward_filter`;
    the :func:`variants` options ``pixels`` and ``chunks``)."""
    return conv2d_backward_filter(ctx.xp, x, gy, **op.conv_params(), weight_shape=op.weight_shape,
                                  pixels=int(ctx.options.get("pixels", PIXELS)),
                                  chunks=int(ctx.options.get("chunks", 1)))


def check(op, in_types, device) -> str | None:
    """Why the rule declines a node (``depthwise.operand_dtypes`` and ``depthwise.declines``;
    x channels-last too), or None."""
    x, gy = in_types
    why = operand_dtypes(input=x, output_gradient=gy)
    if why:
        return why
    if x.layout != "NHWC":
        return f"the depthwise kernel takes channels-last (NHWC) tensors, the input is {x.layout}"
    return (declines(gy.shape, op.weight_shape, op.groups, x.shape, gy.layout, op.padding, op.dilation)
            or too_large(int(op.weight_shape[2]), int(op.weight_shape[3]), dtype_name(x.dtype)))


__all__ = ["too_large", "conv2d_backward_filter", "conv2d_backward_filter_kernel", "check", "variants", "REVISION", "PIXELS"]
