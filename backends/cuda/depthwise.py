"""Backward-data of a depthwise convolution on channels-last tensors: 16 bytes of
channels of a strip of dx pixels per CUDA thread, the geometry compiled in.

A depthwise convolution (``groups`` = input channels = output channels, one
filter per channel: MobileNet-v2's and EfficientNet-B0's 3x3 and 5x5 layers)
does ``kH * kW`` multiply-adds per element it reads, so its backward-data is
memory-bound. For dx ``(N, C, H, W)`` and gy ``(N, C, Ho, Wo)``, both
channels-last, and w ``(C, 1, kH, kW)``::

    dx[n, c, i, j] = sum over kh, kw of gy[n, c, oh, ow] * w[c, 0, kh, kw]
    where oh = (i + pad_top - kh * dilation_h) / stride_h, ow likewise,
    for the taps where both divisions are exact and in range

(the transpose of the forward's gather; Dumoulin & Visin, "A guide to
convolution arithmetic for deep learning", 2016, section 4). Gathering per
dx element needs no atomics, so the result is deterministic. Any stride,
dilation and padding, asymmetric included. The ``cuda`` rule of
``Conv2dBackwardData`` offers this kernel to the autotuner beside cuDNN's
engines, so it runs only where it is correct and faster.

Why this form. The first kernel (one thread per dx element, 2-byte loads,
the geometry as run-time arguments: ten integer divisions per element and
four per tap) ran at 4-6 % of the copy bandwidth on the H200 in bf16
(128 x 144 x 56 x 56, 3x3/1: 1.97 ms against 0.43 for cuDNN and a 0.055 ms
copy floor). Now:

* the geometry is compiled into each kernel (``#define``; one NVRTC
  compilation per layer shape, about 17 in MobileNet-v2, cached on disk by
  CuPy), so the divisions are multiply-shifts or shifts and the tap loops
  are straight-line code generated here;
* thread ``t`` owns ``V`` consecutive channels (``V = 16 / itemsize``: 8
  bfloat16 or float16, 4 float32, 2 float64) of ``P`` consecutive pixels of
  one dx row (a strip, ``P`` a multiple of the column stride, 4 by default;
  threads in NHWC order: channel groups fastest, so a warp reads and writes
  whole lines), moving gy and dx as 16-byte words. Where C is not a multiple
  of V or a buffer is not 16-byte aligned the same kernel runs with ``V = 1``
  (one channel per thread, scalar loads: e.g. C = 3);
* only the taps that contribute are visited. Rows: ``kh`` must satisfy
  ``(i + pad_top - kh * dilation_h) % stride_h == 0``, which fixes the
  residue of ``kh`` (a step of ``stride_h / gcd(stride_h, dilation_h)``), so
  a stride-2 3x3 thread visits 1 or 2 kernel rows, not 3. Columns: a strip
  starts at a multiple of the stride, so which (gy column, kw) pairs feed
  which of its pixels is known when the kernel is generated; each gy word
  of a kernel row is loaded once and added into every pixel of the strip it
  feeds (a 3x3/1 strip of 4 loads 6 words per kernel row instead of 12;
  3x3/2: 3 instead of 12, none wasted);
* the weights are transposed once per call into ``(kH * kW, C)`` in the
  compute type by a small kernel (C * kH * kW threads), so a tap's V
  weights are one or two 16-byte loads, and a kernel row's ``kW`` words are
  loaded once per strip (in registers for its P pixels);
* sums are in float32 (float64 for float64), rounded once on the store
  (bfloat16 to nearest even, NaN kept quiet: ``codegen.storage``). float16
  and bfloat16 are read and written as their bits: no cast pass.

Each pixel's taps are summed in one order (kernel rows, then gy columns)
whatever the strip width or thread order, so the autotune variants
(:func:`variants`: 8-pixel strips; threads in tiles of about 4 rows, whose
gy rows then hit the SM's L1 more often than L2) give bit for bit the same
result. Index arithmetic is 32-bit (unsigned for the thread's decomposition)
when dx, gy and the thread count are below 2^31, 64-bit otherwise. Kernels
are compiled through CuPy by source text (``codegen.launch.compiled``), so
the tests run them on the CPU emulator of the CUDA text.
"""

from __future__ import annotations

import functools
import math

from opgraph.errors import ShapeError
from opgraph.types import is_float, numpy_dtype

from .codegen.launch import address, compiled
from .codegen.storage import DEVICE_HELPERS, storage_of, vector_load, vector_store
from .kernel_sources import fingerprinted
from .storage import dtype_name

#: the kernels' revision, part of the autotune cache key (:func:`variants`):
#: 1 one thread per element, run-time geometry; 2 vectors of channels, strips
#: of pixels, geometry compiled in
#: (an edit of the kernels' code needs no bump: its fingerprint is in the key too, ``kernel_sources``)
REVISION = 2
THREADS = 256
#: the default strip width (dx pixels of one row per thread, rounded to a multiple of the column stride)
PIXELS = 4
#: 32-bit arithmetic limit (tap offsets, element counts)
_INT32_LIMIT = 2 ** 31 - 1


def lanes(dtype: str) -> int:
    """V of the vector path: the elements of ``dtype`` in one 16-byte word."""
    return 16 // storage_of(dtype).itemsize


def declines(gy_shape, w_shape, groups: int, input_shape, gy_layout: str | None, padding=((0, 0), (0, 0)),
             dilation=(1, 1), role: str = "output gradient") -> str | None:
    """Why the ``cuda`` rule does not take this node, or None: it takes
    channels-last depthwise convolutions of multiplier 1 (the kernel itself
    takes any layout, copying others to channels-last first). ``gy_shape``
    is the gather's source (named ``role`` in the message: the forward's
    source is its input), ``input_shape`` its output, both ``(N, C, H, W)``."""
    c = input_shape[1]
    if not (groups == c == w_shape[0] == gy_shape[1] and w_shape[1] == 1):
        return (f"not a depthwise convolution of multiplier 1 (groups={groups}, input channels {c}, "
                f"weight {tuple(w_shape)})")
    if gy_layout != "NHWC":
        return (f"the depthwise kernel takes channels-last (NHWC) tensors, the {role} is "
                + (gy_layout or "of no declared layout"))
    reach = [(k - 1) * d + p[0] + n for k, d, p, n in zip(w_shape[2:], dilation, padding, input_shape[2:])]
    if max(reach) >= _INT32_LIMIT:  # the tap arithmetic h + PT - kh * DH, whatever the tensors' sizes
        return f"padding {tuple(padding)} and dilation {tuple(dilation)} reach beyond 32-bit tap arithmetic"
    if c * w_shape[2] * w_shape[3] >= _INT32_LIMIT:  # the weights' transpose indexes in 32 bits
        return f"a weight of {c * w_shape[2] * w_shape[3]} elements (32-bit indexing takes under 2^31)"
    return None


def variants(op, in_types, device):
    """The autotune variants of the ``cuda`` rule: strips of :data:`PIXELS`
    pixels, threads ordered row by row (the default); the same in tiles of
    about 4 rows (a tile's threads share the gy rows they read, so more of the
    kernel-row overlap hits the SM's L1 instead of L2); tiles of 4 rows of
    8-pixel strips (fewer loads per pixel, more registers). Its ``revision``
    (:data:`REVISION`) is part of the autotune cache key, so decisions timed
    against older kernels are tuned again."""
    return [{}, {"rows": 4}, {"pixels": 8, "rows": 4}]


variants.revision = REVISION
#: the kernels' source, part of the autotune cache key too: an edit re-tunes without a REVISION bump
variants.fingerprint = fingerprinted(__name__)


# ---------------------------------------------------------------- code generation

def _strip(pixels: int, kw: int, sw: int, pl: int, dw: int) -> tuple[int, list]:
    """The column plan of a strip of ``pixels`` dx pixels starting at a column
    ``w0`` that is a multiple of ``sw``: ``(E, rows)``, gy column ``j`` of the
    strip being ``(w0 + E) / sw + j`` (E a multiple of ``sw``) and ``rows`` the
    list of ``(j, [(kw, p), ...])``: gy column j feeds pixel ``w0 + p`` through
    tap ``kw``. Every (pixel, tap) with an exact division appears once."""
    lo = pl - (kw - 1) * dw  # the smallest w + PL - kw * DW over the strip's pixels and taps
    e = sw * -(-lo // sw)
    plan, j = [], 0
    while e + j * sw <= pixels - 1 + pl:
        feeds = [(k, p) for k in range(kw) if 0 <= (p := e + j * sw - pl + k * dw) < pixels]
        if feeds:
            plan.append((j, feeds))
        j += 1
    return e, plan


def _first_taps(sh: int, dh: int, kh: int) -> list[int]:
    """``first[r]``: the smallest kernel row ``k`` with ``k * dh % sh == r``
    (``kh``, no row, when none exists); the rows of residue r step by
    ``sh / gcd(sh, dh)`` from there."""
    step = sh // math.gcd(sh, dh)
    return [next((k for k in range(step) if k * dh % sh == r), kh) for r in range(sh)]


def _row_start(sh: int, dh: int, kh: int) -> str:
    """The statement defining ``kh0``, the first kernel row feeding dx row ``h`` (``hp = h + PT``)."""
    if sh == 1:
        return "const int kh0 = 0;"
    first = _first_taps(sh, dh, kh)
    if first == list(range(sh)):  # dh % sh == 1 (no dilation): the residue itself
        return "const int kh0 = (int)((unsigned)hp % SH);"
    chain = " : ".join(f"r == {r} ? {k}" for r, k in enumerate(first[:-1])) + f" : {first[-1]}"
    return f"const int r = (int)((unsigned)hp % SH); const int kh0 = {chain};"


def _fewest_idle(want: int, extent: int) -> int:
    """A tile side for ``extent`` near ``want`` (``want / 2`` to ``want``): the one
    leaving the fewest idle threads in the last tile, the larger on a tie."""
    return min(range(max(1, (want + 1) // 2), max(want, 1) + 1), key=lambda t: (-(-extent // t) * t - extent, -t))


def _tiles(c: int, v: int, h: int, strips: int, rows: int) -> tuple[int, int]:
    """``(TH, SEG)``: dx rows and strips of one tile of consecutive threads (one
    row and every strip when ``rows`` is 1; else about ``rows`` rows, and as many
    strips as fill :data:`THREADS` threads with the channel groups)."""
    if rows <= 1:
        return 1, strips
    th = _fewest_idle(rows, h)
    return th, _fewest_idle(max(1, min(strips, THREADS // (c // v * th))), strips)


def _threads_per_image(c: int, v: int, h: int, w: int, pixels: int, rows: int) -> int:
    """The threads of one image: whole tiles (:func:`_tiles`) of strips of ``pixels``."""
    strips = -(-w // pixels)
    th, seg = _tiles(c, v, h, strips, rows)
    return -(-h // th) * th * -(-strips // seg) * seg * (c // v)


@functools.lru_cache(maxsize=None)
def _source(dtype: str, geo: tuple, v: int, pixels: int, rows: int, wide: bool, flip: bool = False,
            bias: bool = False) -> tuple[str, str, str]:
    """``(kernel name, weight-transpose kernel name, source)`` of one layer shape:
    ``geo`` = (C, H, W, HO, WO, KH, KW, SH, SW, PT, PL, DH, DW), ``v`` lanes per
    thread (``lanes(dtype)`` or 1), strips of ``pixels`` (a multiple of SW),
    tiles of about ``rows`` rows (:func:`_tiles`), 64-bit indices if ``wide``.
    ``flip``: the taps transposed in reverse order (kernel rows and columns
    mirrored: the stride-1 forward, ``depthwise_forward``); ``bias``: a
    float32 (float64) vector of C added first, before the taps."""
    c, h, w, ho, wo, kh, kw, sh, sw, pt, pl, dh, dw = geo
    st = storage_of(dtype)
    ct = "double" if dtype == "float64" else "float"
    wst = storage_of("float64" if ct == "double" else "float32")  # the transposed weights
    strips = -(-w // pixels)
    th, seg = _tiles(c, v, h, strips, rows)
    nseg, nth = -(-strips // seg), -(-h // th)
    step_h = sh // math.gcd(sh, dh)
    e, plan = _strip(pixels, kw, sw, pl, dw)
    defines = dict(C=c, H=h, W=w, HO=ho, WO=wo, KH=kh, KW=kw, SH=sh, SW=sw, PT=pt, PL=pl, DH=dh, DW=dw, V=v,
                   P=pixels, NS=strips, CV=c // v, TH=th, SEG=seg, NSEG=nseg, NTH=nth)
    acc = [[f"a{p}_{q}" for q in range(v)] for p in range(pixels)]
    # thread t: channel group cv, strip s, row h of image n; consecutive threads walk the
    # channel groups, then the SEG strips and TH rows of a tile, then the tiles
    body = ["const UIDX t = (UIDX)blockIdx.x * blockDim.x + threadIdx.x;",
            "if (t >= (UIDX)TOTAL) return;",
            "const UIDX cv = t % CV; UIDX r_ = t / CV;",
            "const int sl = (int)(r_ % SEG); r_ /= SEG;",
            "const int hl = (int)(r_ % TH); r_ /= TH;",
            "const int s = (int)(r_ % NSEG) * SEG + sl; r_ /= NSEG;",
            "const int h = (int)(r_ % NTH) * TH + hl; const IDX n = (IDX)(r_ / NTH);",
            *(["if (s >= NS || h >= H) return;"] if nseg * seg > strips or nth * th > h else []),
            "const IDX c0 = (IDX)cv * V;",
            f"const int w0 = s * P, owb = s * (P / SW) + ({e // sw});",
            "const int hp = h + PT;",
            _row_start(sh, dh, kh)]
    if bias:
        lines, vals = vector_load(wst, "bias", "c0", v, "b")
        body += [*lines, *(f"const CT b{q} = {x};" for q, x in enumerate(vals))]
    body += [f"CT {a} = {f'b{q}' if bias else 0};" for row in acc for q, a in enumerate(row)]
    for m in range(-(-kh // step_h)):
        weights = []
        for k in range(kw):
            lines, vals = vector_load(wst, "wr", f"{k} * C", v, f"f{k}")
            weights += [*lines, *(f"const CT f{k}_{q} = {x};" for q, x in enumerate(vals))]
        columns = []
        for j, feeds in plan:
            lines, vals = vector_load(st, "gy", "(gr + ow) * C + c0", v, "g")
            columns += [f"{{ const int ow = owb + {j};", "  if ((unsigned)ow < (unsigned)WO) {",
                        *("    " + x for x in lines), *(f"    const CT g{q} = {x};" for q, x in enumerate(vals)),
                        *(f"    {acc[p][q]} += g{q} * f{k}_{q};" for k, p in feeds for q in range(v)), "} }"]
        body += [f"{{ const int kh = kh0 + {m * step_h}, ty = hp - kh * DH;",
                 "  if (kh < KH && ty >= 0 && ty < HO * SH) {",
                 "    const IDX gr = (n * HO + (int)((unsigned)ty / SH)) * WO;",
                 "    const CT* __restrict__ wr = wt + (IDX)kh * KW * C + c0;",
                 *("    " + x for x in weights), *("    " + x for x in columns), "} }"]
    for p in range(pixels):
        store = vector_store(st, "dx", f"((n * H + h) * W + w0 + {p}) * C + c0", acc[p], f"d{p}")
        body += store if w % pixels == 0 else [f"if (w0 + {p} < W) {{", *store, "}"]
    tag = f"{dtype}_{'i64' if wide else 'i32'}_v{v}_k{kh}x{kw}s{sh}x{sw}_p{pixels}r{th}"
    kind = ("fprop" if flip else "dgrad") + ("_bias" if bias else "")
    name, wname = f"opgraph_dw_{kind}_{tag}", f"opgraph_dw_weights{'_flipped' if flip else ''}_{tag}"
    params = (f"const {st.ctype}* __restrict__ gy, const CT* __restrict__ wt, "
              + ("const CT* __restrict__ bias, " if bias else "") + f"{st.ctype}* __restrict__ dx, IDX TOTAL")
    tap = "(KH * KW - 1 - k)" if flip else "k"
    # the weights (and the bias) in the compute type, the taps transposed to (KH * KW, C)
    weights_kernel = (f'extern "C" __global__ void {wname}(const {st.ctype}* __restrict__ w, '
                      "CT* __restrict__ wt"
                      + (f", const {st.ctype}* __restrict__ b, CT* __restrict__ bt" if bias else "") + ") {\n"
                      "    const int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "    if (t >= C * KH * KW) return;\n"
                      + (f"    if (t < C) bt[t] = {st.load('b[t]')};\n" if bias else "")
                      + "    const int c = t / (KH * KW), k = t - c * (KH * KW);\n"
                      f"    wt[{tap} * C + c] = {st.load('w[t]')};\n}}\n")
    text = (f"typedef {ct} CT;\ntypedef {'long long' if wide else 'int'} IDX;\n"
            f"typedef {'unsigned long long' if wide else 'unsigned int'} UIDX;\n"
            + "".join(f"#define {k} {val}\n" for k, val in defines.items()) + DEVICE_HELPERS + "\n"
            + weights_kernel
            + f'extern "C" __global__ void {name}({params}) {{\n'
            + "".join(f"    {line}\n" for line in body) + "}\n"
            + "".join(f"#undef {k}\n" for k in defines))  # nothing leaks into a source compiled after it
    return name, wname, text


def _pixels(option: int, sw: int, w: int) -> int:
    """The strip width: ``option`` rounded to a multiple of ``sw`` (at least one),
    no wider than the row rounded up to one."""
    p = sw * max(1, round(option / sw))
    return min(p, sw * -(-w // sw))


def _raw(xp, a):
    """``a`` as the kernels take it: bfloat16 and float16 as their uint16 bits (a view)."""
    return a.view(xp.uint16) if a.dtype.itemsize == 2 else a


def conv2d_backward_data(xp, gy, w, *, stride, padding, dilation, groups, input_shape, pixels=PIXELS, rows=1):
    """``dL/dx`` of a depthwise convolution (module docstring): gy ``(N, C, Ho,
    Wo)`` (channels-last, or copied to it), w ``(C, 1, kH, kW)`` -> ``input_shape``
    ``(N, C, H, W)``, channels-last, in gy's dtype. ``padding`` is ``((top,
    bottom), (left, right))``. ``pixels``: dx pixels per thread (the strip,
    rounded to a multiple of the column stride); ``rows``: about how many dx
    rows a tile of consecutive threads covers (1: a whole row each). Both are
    the autotune variants' options (:func:`variants`); the result is the same.

    Raises:
        ShapeError: not a depthwise convolution of multiplier 1, a geometry
            beyond 32-bit tap arithmetic, or operands of different dtypes.
    """
    why = declines(gy.shape, w.shape, groups, input_shape, "NHWC", padding, dilation)
    if why:
        raise ShapeError(f"depthwise conv2d_backward_data: {why}")
    if w.dtype != gy.dtype:
        raise ShapeError(f"depthwise conv2d_backward_data: weight {w.dtype} and output gradient {gy.dtype} differ")
    (pt, _), (pl, _) = padding
    return gather(xp, gy, w, None, out_shape=input_shape, stride=stride, top_left=(pt, pl), dilation=dilation,
                  pixels=pixels, rows=rows, flip=False)


def gather(xp, src, w, b, *, out_shape, stride, top_left, dilation, pixels, rows, flip):
    """The generated gather (module docstring) of ``src`` ``(N, C, HO, WO)`` into
    a new channels-last ``out_shape`` ``(N, C, H, W)`` in src's dtype:
    ``out[n, c, i, j] = b[c] + sum of src[n, c, (i + PT - kh * DH) / SH, ...] *
    w'[c, kh, kw]`` over the taps whose divisions are exact and in range, with
    ``(PT, PL) = top_left`` and ``w'`` the filter ``w`` ``(C, 1, kH, kW)``, or it
    mirrored when ``flip``; ``b`` a vector of C, or None. Operands already
    checked by the caller; ``src`` is copied to channels-last unless it is.
    (The generated code names the source ``gy`` and the output ``dx``, as the
    backward-data it was first written for.)"""
    dtype = dtype_name(src.dtype)
    # the NHWC buffer: src's own memory when channels-last (also where the layout is
    # ambiguous: a batch of 0, one channel, a 1 x 1 plane), else a copy
    buf = xp.ascontiguousarray(_raw(xp, src).transpose(0, 2, 3, 1))
    n, c, h, wd = (int(v) for v in out_shape)
    out = xp.empty((n, h, wd, c), dtype=buf.dtype)
    if out.size:
        pt, pl = (int(p) for p in top_left)
        kh, kw = (int(k) for k in w.shape[2:])
        sh, sw = (int(s) for s in stride)
        geo = (c, h, wd, int(src.shape[2]), int(src.shape[3]), kh, kw, sh, sw, pt, pl,
               *(int(d) for d in dilation))
        v = lanes(dtype)
        if c % v or address(buf) % 16:  # out is a fresh allocation: aligned
            v = 1
        pixels = _pixels(int(pixels), sw, wd)
        total = n * _threads_per_image(c, v, h, wd, pixels, int(rows))
        wide = max(out.size, buf.size, total) >= _INT32_LIMIT
        name, wname, text = _source(dtype, geo, v, pixels, int(rows), wide, bool(flip), b is not None)
        idx = xp.int64 if wide else xp.int32
        ct = xp.float64 if dtype == "float64" else xp.float32
        wt = xp.empty(c * kh * kw, dtype=ct)
        # the filter taps of channel c at c * kH * kW + kh * kW + kw: OIHW and OHWI orders
        # agree when each filter has one input channel
        wbuf = xp.ascontiguousarray(_raw(xp, w)).reshape(-1)
        bias = () if b is None else (xp.ascontiguousarray(_raw(xp, b)), xp.empty(c, dtype=ct))
        compiled(text, wname)((-(-wt.size // THREADS),), (THREADS,), (wbuf, wt, *bias))
        compiled(text, name)((-(-total // THREADS),), (THREADS,), (buf, wt, *bias[1:], out, idx(total)))
    res = out.view(numpy_dtype(dtype)) if out.dtype.itemsize == 2 else out
    return res.transpose(0, 3, 1, 2)


def conv2d_backward_data_kernel(ctx, op, gy, w):
    """The ``cuda`` rule's kernel of ``Conv2dBackwardData`` (:func:`conv2d_backward_data`;
    the :func:`variants` options ``pixels`` and ``rows``)."""
    return conv2d_backward_data(ctx.xp, gy, w, **op.conv_params(), input_shape=op.input_shape,
                                pixels=int(ctx.options.get("pixels", PIXELS)), rows=int(ctx.options.get("rows", 1)))


def operand_dtypes(**operands) -> str | None:
    """Why the depthwise kernels decline their operands' dtypes (each floating,
    all one dtype), or None; ``operands``: name -> type (``output_gradient=gy``)."""
    named = [(k.replace("_", " "), t.dtype) for k, t in operands.items()]
    bad = next((d for _, d in named if not is_float(d)), None)
    if bad is not None:
        return f"the depthwise kernel takes floating dtypes, got {bad}"
    if len({d for _, d in named}) > 1:
        return "the depthwise kernel takes one dtype: " + ", ".join(f"{k} {d}" for k, d in named)
    return None


def check(op, in_types, device) -> str | None:
    """Why the rule declines a node (:func:`operand_dtypes`, :func:`declines`), or None."""
    gy, w = in_types
    why = operand_dtypes(weight=w, output_gradient=gy)
    if why:
        return why
    return declines(gy.shape, w.shape, op.groups, op.input_shape, gy.layout, op.padding, op.dilation)


__all__ = ["declines", "operand_dtypes", "conv2d_backward_data", "conv2d_backward_data_kernel", "check", "variants", "lanes",
           "gather", "REVISION", "PIXELS"]
