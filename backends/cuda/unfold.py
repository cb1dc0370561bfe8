"""The ``unfold`` lowering: convolutions with few input channels on
channels-last tensors, a generated im2col kernel and one cuBLAS product
(``cublasGemmEx``, fp32 accumulation), forward with its bias and activation,
and backward-filter. Its rules (``backends/cuda/rules.py``) are tagged
``unfold`` and ``im2col``, the latter shared with the xp ``gemm`` lowering:
``exclude=['im2col']`` leaves no unfolding lowering, ``exclude=['unfold']``
this one only.

Why: cuDNN's fast engines read 16-byte channel rows (``align8`` in their
names: C a multiple of 8 for 2-byte storage, 4 for float32). An ImageNet
stem has C = 3, so every engine falls back to slow paths: on the H200 (bf16,
batch 128, device clock, 2026-12-03) OverFeat's 11x11/4 ``conv1`` took 1.18
ms forward and 0.55 ms backward-filter for 28 GFLOP (25 TFLOP/s, 3 % of the
matrix peak), ResNet-50's 7x7/2 stem 0.96 and 0.63 ms. Unfolded, the same
convolution is a GEMM of a tall ``(N*Ho*Wo, C*kH*kW)`` matrix, which cuBLAS
runs near the matrix peak; the unfolding is a copy of a few hundred MB.

The unfolding (the Caffe lowering; Chellapilla, Puri & Simard 2006, "High
performance convolutional neural networks for document processing"), with
the reduction index in channels-last order so that each kernel row of a
window is one contiguous run of ``kW * C`` input elements::

    cols[m, (p * kW + q) * C + c] = x[n, ih, iw, c]
        with m = (n * Ho + oh) * Wo + ow, ih = oh * SH - PT + p * DH, iw = ow * SW - PL + q * DW

(zero outside the input), ``K = C * kH * kW`` columns padded to ``KP``, a
multiple of 8 (16-byte rows, as cuBLAS's tensor-core kernels want them).

* forward: ``y[m, o] = cols[m, :] . wk[o, :]`` with ``wk[o, (p * kW + q) *
  C + c] = w[o, c, p, q]``. The output ``(N*Ho*Wo, O)`` row-major is y in
  NHWC. A bias rides in the padding: ``cols[m, K] = 1`` and ``wk[o, K] =
  b[o]``, so it is added in the fp32 accumulator and the result rounded
  once, as cuDNN's fused epilogue does; ReLU / ReLU6 then clip in place
  (NaN propagates: SEMANTICS.md);
* backward-filter: ``dwk = gy^T @ cols`` (``(O, N*Ho*Wo) @ (N*Ho*Wo, KP)``,
  fp32), rounded once to the storage dtype; its first K columns are the
  weight gradient in cuDNN's channels-last KRSC order, returned as the
  OIHW view of it.

``chunks`` (an autotune variant) unfolds and multiplies the rows in that
many pieces through one smaller buffer: less workspace, and a piece of a few
tens of MB may stay in the 50 MB L2 between the two kernels; backward-filter
accumulates the pieces' products in fp32 (cuBLAS's beta = 1).

The product runs on our own cuBLAS handle (:func:`.cublas.gemm_ex_into`):
captured into CUDA graphs when nvmath-python is installed. Its operands are
in the precision's storage (:data:`opgraph.precision.IO_DTYPE`; bfloat16
storage in ``bf16`` is read as it is, float32 storage in ``bf16`` is rounded
first), its output the storage itself where that is the operands' type, else
float32, converted once. The unfolding kernel copies bits (no arithmetic),
so one kernel serves every 2-byte dtype; it compiles through CuPy by source
text (``codegen.launch.compiled``) and runs on the tests' CPU emulator.
"""

from __future__ import annotations

import functools

from opgraph import precision as precisions
from opgraph.errors import ShapeError
from opgraph.ops.conv_fused import ACTIVATIONS, epilogue_steps
from opgraph.types import numpy_dtype

from ..reference.conv import conv_geometry, geometry_of
from .codegen.launch import compiled
from .codegen.storage import DEVICE_HELPERS, lit, storage_of
from .cublas import gemm_ex_into
from .kernel_sources import fingerprinted
from .storage import dtype_name, like

#: the kernels' revision, part of the autotune cache key (:func:`variants`); 3: the
#: ``chunks`` variants are listed (revision 2's function did not take the ``precision``
#: its rule's ``option:precision`` tag passes, so autotune had timed the default alone)
#: (an edit of the kernels' code needs no bump: its fingerprint is in the key too, ``kernel_sources``)
REVISION = 3
THREADS = 256
#: the storage dtypes the rule takes (float64 has no precision: the xp lowerings run it)
DTYPES = ("float32", "float16", "bfloat16")
#: 2-byte storage dtype -> the bits of 1.0 (the bias column)
ONE_BITS = {"bfloat16": 0x3F80, "float16": 0x3C00}
#: largest unfolded row (C * kH * kW) the rule takes: beyond it the channels
#: are many and cuDNN's implicit GEMM is the better plan
MAX_K = 1024
_INT32_LIMIT = 2 ** 31 - 1


def variants(op, in_types, device, precision=None):
    """The autotune variants: the rows in 1, 4 or 16 pieces (module docstring),
    for every ``precision``. Their ``revision`` (:data:`REVISION`) is part of
    the autotune cache key."""
    return [{}, {"chunks": 4}, {"chunks": 16}]


variants.revision = REVISION
#: the kernels' source, part of the autotune cache key too: an edit re-tunes without a REVISION bump
variants.fingerprint = fingerprinted(__name__)


def padded_k(k: int, bias: bool) -> int:
    """KP: ``k`` columns (and one for the bias) rounded up to a multiple of 8."""
    return -(-(k + int(bias)) // 8) * 8


# ---------------------------------------------------------------- the unfolding kernel

@functools.lru_cache(maxsize=None)
def _source(itemsize: int, geo: tuple, kp: int, bias: bool, wide: bool) -> tuple[str, str]:
    """``(name, source)`` of the unfolding kernel of one geometry: ``geo`` =
    (C, H, W, HO, WO, KH, KW, SH, SW, PT, PL, DH, DW); 2- or 4-byte elements;
    64-bit indices if ``wide``. One thread writes one 16-byte word of cols.
    Revision 2 walks a kernel row's run of ``KW * C`` elements without a
    division per element where the width dilation is 1: revision 1's four
    per-element divisions are the likely cost of its 7x7 stem forward taking
    0.81 ms on the H200 where the memory traffic is ~0.4 ms (not yet
    measured apart)."""
    c, h, w, ho, wo, kh, kw, sh, sw, pt, pl, dh, dw = geo
    v = 16 // itemsize
    e = "unsigned short" if itemsize == 2 else "float"  # a float's copy keeps its bits
    defines = dict(C=c, H=h, W=w, HO=ho, WO=wo, KH=kh, KW=kw, SH=sh, SW=sw, PT=pt, PL=pl, DH=dh, DW=dw,
                   K=c * kh * kw, KP=kp, V=v, WORDS=kp // v, BIAS=int(bias), RUN=kw * c)
    tag = (f"b{itemsize}_{'i64' if wide else 'i32'}_c{c}k{kh}x{kw}s{sh}x{sw}p{pt}x{pl}d{dh}x{dw}_{h}x{w}"
           f"o{ho}x{wo}_kp{kp}{'b' if bias else ''}")
    name = f"opgraph_unfold_{tag}"
    if dw == 1:
        # a kernel row's taps are one run of KW * C input elements (module docstring): walk it,
        # checking the columns only where the window overhangs the left or right edge
        element = ["        if (k < K) {",
                   "            const int ih = ih0 + p * DH;",
                   "            if ((unsigned)ih < (unsigned)H && (inside || (unsigned)(iw0 + r / C) < (unsigned)W))",
                   "                val = x[((n * H + ih) * W + iw0) * C + r];",
                   "            if (++r == RUN) { r = 0; ++p; }"]
        setup = ["    const bool inside = iw0 >= 0 && iw0 + KW <= W;",
                 "    int p = (word * V) / RUN, r = word * V - p * RUN;"]
    else:
        element = ["        if (k < K) {",
                   "            const int c = k % C, pq = k / C, q = pq % KW, p = pq / KW;",
                   "            const int ih = ih0 + p * DH, iw = iw0 + q * DW;",
                   "            if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W)",
                   "                val = x[((n * H + ih) * W + iw) * C + c];"]
        setup = []
    body = ["const IDX t = (IDX)blockIdx.x * blockDim.x + threadIdx.x;",
            "if (t >= rows * WORDS) return;",
            "const IDX row = t / WORDS;",
            "const int word = (int)(t - row * WORDS);",
            "const IDX m = m0 + row, nh = m / WO;",
            "const int ow = (int)(m - nh * WO);",
            "const IDX n = nh / HO;",
            "const int oh = (int)(nh - n * HO);",
            "const int ih0 = oh * SH - PT, iw0 = ow * SW - PL;"]
    text = (f"typedef {e} E;\ntypedef {'long long' if wide else 'int'} IDX;\n"
            + "".join(f"#define {key} {val}\n" for key, val in defines.items())
            + f'extern "C" __global__ void {name}(const E* __restrict__ x, E* __restrict__ cols, '
            "IDX m0, IDX rows, E one) {\n"
            + "".join(f"    {line}\n" for line in body) + "".join(f"{line}\n" for line in setup)
            + "    union { uint4 w; E e[V]; } out;\n"
            "    for (int j = 0; j < V; ++j) {\n"
            "        const int k = word * V + j;\n"
            "        E val = 0;\n"
            + "".join(f"{line}\n" for line in element)
            + "        } else if (BIAS && k == K) {\n"
            "            val = one;\n"
            "        }\n"
            "        out.e[j] = val;\n"
            "    }\n"
            "    reinterpret_cast<uint4*>(cols)[t] = out.w;\n"
            "}\n"
            + "".join(f"#undef {key}\n" for key in defines))  # nothing leaks into a source compiled after it
    return name, text


def _unfold(xp, xb, cols, geo: tuple, kp: int, bias: bool, m0: int, rows: int, dtype: str) -> None:
    """Rows ``m0 .. m0 + rows`` of cols (module docstring) into ``cols[:rows]``
    from the packed NHWC bits ``xb``."""
    wide = max(xb.size, (m0 + rows) * kp) >= _INT32_LIMIT
    name, text = _source(xb.itemsize, geo, kp, bias, wide)
    idx = xp.int64 if wide else xp.int32
    one = xp.float32(1.0) if xb.itemsize == 4 else xp.uint16(ONE_BITS[dtype])
    words = rows * (kp // (16 // xb.itemsize))
    compiled(text, name)((-(-words // THREADS),), (THREADS,), (xb, cols, idx(m0), idx(rows), one))


# ---------------------------------------------------------------- the epilogue's activation

@functools.lru_cache(maxsize=None)
def _clip_source(dtype: str, lo, hi) -> tuple[str, str]:
    """``(name, source)`` of an in-place clip to ``[lo, hi]`` (None: unbounded)
    of a 2- or 4-byte float buffer, NaN kept (a comparison with NaN is false)."""
    st = storage_of(dtype)
    steps = ([f"if (v < {lit(lo)}) v = {lit(lo)};"] if lo is not None else []) + \
            ([f"if (v > {lit(hi)}) v = {lit(hi)};"] if hi is not None else [])
    name = f"opgraph_unfold_clip_{dtype}_{'n' if lo is None else str(lo).replace('.', 'p')}_" \
           f"{'n' if hi is None else str(hi).replace('.', 'p')}"
    text = ("typedef float CT;\n" + DEVICE_HELPERS + "\n"
            + f'extern "C" __global__ void {name}({st.ctype}* __restrict__ y, long long size) {{\n'
            "    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i >= size) return;\n"
            f"    float v = {st.load('y[i]')};\n"
            + "".join(f"    {s}\n" for s in steps)
            + f"    y[i] = {st.store('v')};\n"
            "}\n")
    return name, text


def _clip(xp, yb, dtype: str, lo, hi) -> None:
    name, text = _clip_source(dtype, lo, hi)
    compiled(text, name)((-(-yb.size // THREADS),), (THREADS,), (yb, xp.int64(yb.size)))


# ---------------------------------------------------------------- the directions

def _raw(xp, a):
    """``a`` as the unfolding kernel takes it: 2-byte floats as their uint16 bits (a view)."""
    return a.view(xp.uint16) if a.itemsize == 2 else a


def _operand(xp, a, io: str):
    """``a`` (N, C, H, W) in the product's operand storage ``io``
    (:data:`opgraph.precision.IO_DTYPE`), as packed NHWC raw bits: its own
    memory when it is already that, channels-last; else converted or copied."""
    return xp.ascontiguousarray(_raw(xp, like(xp, a.transpose(0, 2, 3, 1), io)))  # converted in NHWC order


def _pieces(m: int, chunks: int) -> list[tuple[int, int]]:
    """``(first row, rows)`` of the ``chunks`` pieces of ``m`` rows."""
    step = -(-m // max(1, min(int(chunks), m)))
    return [(m0, min(step, m - m0)) for m0 in range(0, m, step)]


def _stored(xp, a, io: str, dtype: str):
    """The product's result ``a`` (raw ``io`` bits, or float32) in storage ``dtype``."""
    if a.dtype == xp.float32 and dtype != "float32":
        a = like(xp, a, dtype)
    return a.view(numpy_dtype(dtype)) if a.itemsize == 2 else a


def conv2d_forward(xp, x, w, b=None, *, stride, padding, dilation, groups, precision, activation="none",
                   chunks=1):
    """``y = conv2d(x, w) (+ b)``, then ``activation`` (``'none'``, ``'relu'``,
    ``'relu6'``), for x ``(N, C, H, W)`` and w ``(O, C, kH, kW)``, computed in
    ``precision`` (operands rounded to its storage, fp32 accumulation);
    returns y ``(N, O, Ho, Wo)`` in x's dtype, a channels-last view (module
    docstring: the unfolding and the product). ``padding`` is ``((top,
    bottom), (left, right))``; ``chunks`` is the autotune variant's option.
    Formula: Chellapilla et al. (2006), as the module docstring writes it.

    Raises:
        ShapeError: groups other than 1, or shapes that do not fit (``conv_geometry``).
        ParameterError: an unknown precision.
    """
    g = conv_geometry(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if g.groups != 1:
        raise ShapeError(f"unfold conv2d: groups={g.groups}; the unfolding takes groups=1")
    dtype, io = dtype_name(x.dtype), precisions.IO_DTYPE[precisions.check(precision)]
    k = g.c * g.kh * g.kw
    kp = padded_k(k, b is not None)
    xb = _operand(xp, x, io)
    m = g.n * g.ho * g.wo
    wk = xp.zeros((g.o, kp), dtype=xb.dtype)
    wk[:, :k] = _raw(xp, like(xp, w, io)).transpose(0, 2, 3, 1).reshape(g.o, k)
    if b is not None:
        wk[:, k] = _raw(xp, like(xp, b, io))
    # cuBLAS rounds into the storage when it is the operands' own, else writes float32
    yb = xp.empty((m, g.o), dtype=xb.dtype if dtype == io else xp.float32)
    if m and g.o:
        geo = _geo(g)
        pieces = _pieces(m, chunks)
        cols = xp.empty((pieces[0][1], kp), dtype=xb.dtype)
        for m0, rows in pieces:
            _unfold(xp, xb, cols, geo, kp, b is not None, m0, rows, io)
            gemm_ex_into(xp, cols[:rows], wk, yb[m0:m0 + rows], precision, transpose_b=True)
        lo, hi = ACTIVATIONS[activation]
        if lo is not None or hi is not None:
            _clip(xp, yb, io if dtype == io else "float32", lo, hi)
    return _stored(xp, yb, io, dtype).reshape(g.n, g.ho, g.wo, g.o).transpose(0, 3, 1, 2)


def conv2d_backward_filter(xp, x, gy, *, stride, padding, dilation, groups, weight_shape, precision, chunks=1):
    """``dL/dw`` ``weight_shape`` ``(O, C, kH, kW)`` from x ``(N, C, H, W)`` and
    gy ``(N, O, Ho, Wo)``, computed in ``precision`` (fp32 sums, rounded
    once), in x's dtype, stored as cuDNN's channels-last backward-filter
    stores it (``(O, kH, kW, C)`` in memory; module docstring). A batch of 0
    gives zeros.

    Raises:
        ShapeError: as :func:`conv2d_forward`, or gy not of the forward output's shape.
        ParameterError: an unknown precision.
    """
    g = conv_geometry(x.shape, weight_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if g.groups != 1:
        raise ShapeError(f"unfold conv2d_backward_filter: groups={g.groups}; the unfolding takes groups=1")
    if tuple(gy.shape) != (g.n, g.o, g.ho, g.wo):
        raise ShapeError(f"unfold conv2d_backward_filter: output gradient {tuple(gy.shape)}, "
                         f"the forward output is {(g.n, g.o, g.ho, g.wo)}")
    dtype, io = dtype_name(x.dtype), precisions.IO_DTYPE[precisions.check(precision)]
    k = g.c * g.kh * g.kw
    kp = padded_k(k, False)
    m = g.n * g.ho * g.wo
    dwk = xp.zeros((g.o, kp), dtype=xp.float32)
    if m:
        xb, gb = _operand(xp, x, io), _operand(xp, gy, io).reshape(m, g.o)
        geo = _geo(g)
        pieces = _pieces(m, chunks)
        cols = xp.empty((pieces[0][1], kp), dtype=xb.dtype)
        for i, (m0, rows) in enumerate(pieces):
            _unfold(xp, xb, cols, geo, kp, False, m0, rows, io)
            gemm_ex_into(xp, gb[m0:m0 + rows], cols[:rows], dwk, precision, transpose_a=True, accumulate=i > 0)
    dw = _stored(xp, xp.ascontiguousarray(dwk[:, :k]), io, dtype)
    return dw.reshape(g.o, g.kh, g.kw, g.c).transpose(0, 3, 1, 2)


def _geo(g) -> tuple:
    (pt, _), (pl, _) = g.padding
    return (g.c, g.h, g.w, g.ho, g.wo, g.kh, g.kw, *g.stride, pt, pl, *g.dilation)


# ---------------------------------------------------------------- the rules' kernels, check, workspace

def forward_kernel(ctx, op, x, w, b=None):
    """The ``unfold`` rule's kernel of the forward ops (``Conv2d`` with or
    without a bias, ``Conv2dBiasRelu``, ``Conv2dBiasActivation`` without a
    residual): :func:`conv2d_forward` with the node's epilogue."""
    steps = epilogue_steps(op, 3 if b is not None else 2)
    activation = next((s for s in steps if s in ACTIVATIONS), "none")
    return conv2d_forward(ctx.xp, x, w, b, **op.conv_params(), precision=ctx.options["precision"],
                          activation=activation, chunks=int(ctx.options.get("chunks", 1)))


def backward_filter_kernel(ctx, op, x, gy):
    """The ``unfold`` rule's kernel of ``Conv2dBackwardFilter``."""
    return conv2d_backward_filter(ctx.xp, x, gy, **op.conv_params(), weight_shape=op.weight_shape,
                                  precision=ctx.options["precision"], chunks=int(ctx.options.get("chunks", 1)))


def _direction(op) -> str:
    return "backward_filter" if op.direction == "wgrad" else "forward"


def check(op, in_types, device) -> str | None:
    """Why the rule declines a node, or None. It takes groups = 1, channels-last
    operands of one dtype whose channel rows are not 16-byte multiples (where
    cuDNN's fast engines cannot read them: module docstring), an unfolded row
    of at most :data:`MAX_K` elements, and an epilogue of bias and ReLU /
    ReLU6 at most. (The rows are judged in the storage dtype: a rule's check
    does not see the node's precision.)"""
    direction = _direction(op)
    dtypes = {t.dtype for t in in_types}
    if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES:
        return f"the unfold kernel takes operands of one dtype of {list(DTYPES)}, got {sorted(dtypes)}"
    dtype = next(iter(dtypes))
    if any(t.layout != "NHWC" for t in in_types[:2]):
        return "the unfold kernel takes channels-last (NHWC) tensors"
    if "add" in epilogue_steps(op, len(in_types)):
        return "the unfold kernel has no residual epilogue"
    g = geometry_of(direction, op, in_types)
    if g.groups != 1:
        return f"the unfold kernel takes groups=1, got {g.groups}"
    itemsize = 4 if dtype == "float32" else 2
    if g.c * itemsize % 16 == 0:
        return (f"{g.c} input channels fill 16-byte rows: cuDNN's implicit-GEMM engines read them "
                "without unfolding")
    if g.c * g.kh * g.kw > MAX_K:
        return f"an unfolded row of {g.c * g.kh * g.kw} elements is beyond the rule's {MAX_K}"
    return None


def workspace(op, in_types, options) -> int:
    """Scratch bytes of one call: the unfolded rows of one piece in the
    product's operand storage, and the packed weights (forward) or the fp32
    gradient (backward-filter); where the storage is not the operands' type,
    the converted x (and gy), and the float32 product a 2-byte storage is
    rounded from (forward)."""
    direction = _direction(op)
    g = geometry_of(direction, op, in_types)
    dtype = in_types[0].dtype
    io = precisions.IO_DTYPE.get(dict(options).get("precision"), dtype)
    itemsize = 4 if io == "float32" else 2
    bias = direction == "forward" and len(in_types) > 2
    kp = padded_k(g.c * g.kh * g.kw, bias)
    m = g.n * g.ho * g.wo
    rows = -(-m // max(1, min(int(dict(options).get("chunks", 1)), max(m, 1))))
    total = rows * kp * itemsize + g.o * kp * (itemsize if direction == "forward" else 4)
    if dtype != io:
        total += itemsize * g.n * g.c * g.h * g.w  # x converted
        if direction == "backward_filter":
            total += itemsize * m * g.o  # gy converted
        elif dtype != "float32":
            total += 4 * m * g.o  # the float32 product, rounded into the storage after
    return total


__all__ = ["conv2d_forward", "conv2d_backward_filter", "forward_kernel", "backward_filter_kernel", "check",
           "workspace", "variants", "padded_k", "REVISION", "MAX_K"]
