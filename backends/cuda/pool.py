"""CuPy kernels of our own for max and average pooling, forward and backward.

Functions mirror ``opgraph.backends.reference.pool`` (same arguments, same
keyword names as the op fields) and follow SEMANTICS.md (Pooling) exactly:

* output extent ``opgraph.params.pool_out_size`` (ceil_mode rounds up, then a
  window starting at or beyond ``in + pad_begin`` is dropped);
* max: padding acts as -inf and never wins a tie; a NaN in a window is the
  window's output and receives its gradient (the first NaN); otherwise the
  gradient goes to the first maximum among the window's input cells in
  row-major order, so every window's gradient sums to its output gradient
  and an all -inf window routes it to a real cell;
* average: the divisor counts input plus explicit padding cells
  (``count_include_pad``; never the ceil_mode overhang) or input cells only.

One thread per output cell (forward) or per input cell (backward: it gathers
from every window that covers it, so there are no atomics and results are
deterministic). Inputs are read through explicit strides, so NCHW and NHWC
(a channels-last view) run without a transpose; outputs come back in the
input's layout. Index arithmetic is 32-bit when every tensor of the call has
fewer than 2^31 elements and 64-bit otherwise: a 64-bit integer division costs
several times a 32-bit one on the GPU, and these kernels divide per thread to
find their cell. The stored argmax is a cell index inside one ``H x W`` plane
(int32; planes over 2^31 cells are refused). float16 computes in float32 and
casts back (whole-tensor casts). bfloat16 computes in float32 inside the
kernels, with no cast pass: they read and write its uint16 bits through the
``LD``/``ST`` macros of :func:`.storage.storage_preamble` (load exact,
store rounded to nearest even); max pooling compares the loaded float32
values (so argmax, ties, -inf and NaN are exactly float32's on the bf16
values) and its output is the winner's bits; the select is a copy of bits;
averages and gradient sums accumulate in float32 and round once.

Max and average pooling of channels-last bfloat16 and float32 have a faster
path, 16 bytes of channels per thread (:mod:`.pool_vector`), which the node
kernels take with the ``vector`` option (an autotune variant) where the
operands qualify.

``specialize=True`` compiles the geometry (channels, extents, window, stride,
padding, layout) into the kernel as constants instead of passing it as
arguments: the divisions by the stride and the window bounds become shifts or
disappear, at the price of one NVRTC compilation per layer shape (CuPy caches
it on disk). The ``cuda`` rules offer both as autotune variants, so the
tuner keeps the specialised kernel only where it is correct and faster.
"""

from __future__ import annotations

import functools

from opgraph.errors import ParameterError, ShapeError

from ..reference.pool import PoolGeometry, geometry, node_geometry

from . import pool_vector
from .storage import bits, dtype_name, in_layout, kernel_tag, logical, physical, storage_preamble, unbits


# Decompose the thread's flat physical index t into (n, c, a, b) of an
# (N, C, A, B) tensor stored NCHW or NHWC (cl); strides of x's planes follow.
_DECOMPOSE = """
    const IDX t = i;
    IDX n, c, a, b;
    if (cl) { c = t % C; IDX r = t / C; b = r % B; r /= B; a = r % A; n = r / A; }
    else    { b = t % B; IDX r = t / B; a = r % A; r /= A; c = r % C; n = r / C; }
    const IDX xc = n * C * H * W + (cl ? c : c * H * W);   // x plane origin
    const IDX xh = cl ? W * C : W, xw = cl ? C : 1;         // x row / column strides
    const IDX oc = n * C * OH * OW + (cl ? c : c * OH * OW); // output plane origin
    const IDX oh_ = cl ? OW * C : OW, ow_ = cl ? C : 1;
"""

# Bodies: x, y, gy, gx, v are T arrays, loaded / stored through LD / ST and
# computed in CT (storage_preamble: float for bfloat16 bits, T otherwise).

#: The geometry every kernel reads: runtime arguments, or constants compiled
#: into the kernel (``specialize=True``, see the module docstring).
_GEO_NAMES = ("C", "H", "W", "OH", "OW", "A", "B", "cl", "kh", "kw", "sh", "sw", "pt", "pb", "pl", "pr")


def _declared(names) -> str:
    """The kernel parameters of the geometry scalars ``names`` (int64; ``cl`` bool)."""
    return ", ".join(("bool " if n == "cl" else "int64 ") + n for n in names)


_GEO = _declared(_GEO_NAMES)

# Forward max: (a, b) = (oh, ow). First in-bounds cell, then strictly greater
# values or the first NaN replace it (NaN never leaves: v > NaN is false).
_MAX = _DECOMPOSE + """
    const IDX h0 = a * sh - pt, w0 = b * sw - pl;
    const IDX hs = h0 > 0 ? h0 : 0, ws = w0 > 0 ? w0 : 0;
    const IDX he = h0 + kh < H ? h0 + kh : H, we = w0 + kw < W ? w0 + kw : W;
    CT best = LD(x[xc + hs * xh + ws * xw]);
    IDX win = hs * W + ws;
    for (IDX h = hs; h < he; ++h)
        for (IDX w = ws; w < we; ++w) {
            const CT v = LD(x[xc + h * xh + w * xw]);
            if (v > best || (v != v && best == best)) { best = v; win = h * W + w; }
        }
    ST(y[t], best);
    STORE
"""

# Forward average: the count is clipped to [-pad_begin, in + pad_end) or [0, in).
_AVG = _DECOMPOSE + """
    const IDX h0 = a * sh - pt, w0 = b * sw - pl;
    const IDX hs = h0 > 0 ? h0 : 0, ws = w0 > 0 ? w0 : 0;
    const IDX he = h0 + kh < H ? h0 + kh : H, we = w0 + kw < W ? w0 + kw : W;
    CT acc = 0;
    for (IDX h = hs; h < he; ++h)
        for (IDX w = ws; w < we; ++w) acc += LD(x[xc + h * xh + w * xw]);
    ST(y[t], acc / (CT)divisor(h0, w0, H, W, kh, kw, pt, pb, pl, pr, include_pad));
"""

#: an average's divisor, shared with the vector kernels (``pool_vector.DIVISOR``)
_DIVISOR = pool_vector.DIVISOR

# Backward: (a, b) = (h, w) of an input cell; windows oh in
# [ceil((h + pt - kh + 1) / sh), floor((h + pt) / sh)] cover it.
_WINDOWS = _DECOMPOSE + """
    const IDX hp = a + pt, wp = b + pl;
    const IDX oh0 = hp < kh ? 0 : (hp - kh) / sh + 1, ow0 = wp < kw ? 0 : (wp - kw) / sw + 1;
    const IDX oh1 = hp / sh < OH - 1 ? hp / sh : OH - 1, ow1 = wp / sw < OW - 1 ? wp / sw : OW - 1;
    CT acc = 0;
"""

_MAX_BWD = _WINDOWS + """
    const int me = (int)(a * W + b);
    for (IDX oh = oh0; oh <= oh1; ++oh)
        for (IDX ow = ow0; ow <= ow1; ++ow) {
            const IDX o = oc + oh * oh_ + ow * ow_;
            if (arg[o] == me) acc += LD(gy[o]);
        }
    ST(gx[xc + a * xh + b * xw], acc);
"""

_AVG_BWD = _WINDOWS + """
    for (IDX oh = oh0; oh <= oh1; ++oh)
        for (IDX ow = ow0; ow <= ow1; ++ow)
            acc += LD(gy[oc + oh * oh_ + ow * ow_]) /
                   (CT)divisor(oh * sh - pt, ow * sw - pl, H, W, kh, kw, pt, pb, pl, pr, include_pad);
    ST(gx[xc + a * xh + b * xw], acc);
"""

_SELECT = _DECOMPOSE + """
    const IDX cell = arg[t];
    y[t] = v[xc + (cell / W) * xh + (cell % W) * xw];
"""


_INT32_LIMIT = 2 ** 31 - 1


def _wide(*arrays) -> bool:
    """Whether the call needs 64-bit index arithmetic (see the module docstring)."""
    return max(a.size for a in arrays) >= _INT32_LIMIT


@functools.lru_cache(maxsize=None)
def _compiled(name, in_params, out_params, body, preamble, wide, geometry=None, names=_GEO_NAMES):
    """The CuPy kernel: geometry (scalars called ``names``) as trailing int
    arguments (``geometry`` None) or compiled in as constants (``geometry`` =
    their values, e.g. the :func:`_geo` tuple). Cached, so a launch builds no
    source string."""
    import cupy
    typedef = f"typedef {'long long' if wide else 'int'} IDX;\n"
    if geometry is None:
        in_params += ", " + _declared(names)
        if not wide:  # the geometry too: one int64 operand makes the whole expression 64-bit
            in_params = in_params.replace("int64 ", "int32 ")
    else:
        name += "_const"
        body = "".join(f"    const {'bool' if n == 'cl' else 'IDX'} {n} = "
                       f"{('true' if v else 'false') if n == 'cl' else int(v)};\n"
                       for n, v in zip(names, geometry)) + body
    return cupy.ElementwiseKernel(in_params, out_params, body, f"opgraph_{name}_{'i64' if wide else 'i32'}",
                                  preamble=typedef + preamble)


def _run(name, in_params, ins, out_params, outs, body, geo, *, size, arrays, storage, preamble="",
         specialize=False, geometry_names=_GEO_NAMES):
    """Launch kernel ``name`` over ``size`` threads: inputs ``ins`` (declared by
    ``in_params``, geometry excluded), then the geometry ``geo`` (:func:`_geo`),
    then the outputs. Index width from ``arrays``; with ``specialize`` the
    geometry is compiled in as constants (one kernel per shape). ``storage``
    (dtype name) is what the ``T`` arrays hold: it picks the LD/ST/CT macros
    (:func:`.storage.storage_preamble`) and tags the name
    (``_bf16``). ``geometry_names`` name the scalars of ``geo`` in the body
    (default the pooling kernels' :data:`_GEO_NAMES`)."""
    wide = _wide(*arrays)
    name += kernel_tag(storage)
    preamble = storage_preamble(storage) + preamble
    if specialize:
        _compiled(name, in_params, out_params, body, preamble, wide, geo, geometry_names)(*ins, *outs, size=size)
    else:
        _compiled(name, in_params, out_params, body, preamble, wide, None, geometry_names)(*ins, *geo, *outs,
                                                                                         size=size)


def _prepare(xp, x, what):
    if x.ndim != 4:
        raise ShapeError(f"{what}: x must be 4-D NCHW, got shape {x.shape}")
    if x.shape[2] * x.shape[3] >= 2 ** 31:
        raise ShapeError(f"{what}: an H x W plane of {x.shape[2] * x.shape[3]} cells exceeds 2^31")
    buf, cl = physical(xp, bits(xp, x))
    return _computable(xp, buf), cl, x.dtype


def _computable(xp, buf):
    """A physical buffer as the pooling kernels take it: float16 converted to
    float32; bfloat16 stays its bits (:func:`bits` was applied before placing)."""
    return buf.astype(xp.float32) if buf.dtype == xp.float16 else buf


def _storage(dtype) -> str:
    """What the kernels' ``T`` arrays hold for a caller's ``dtype`` (:func:`_computable`):
    float32 for float16, the dtype itself otherwise (bfloat16: its bits)."""
    name = dtype_name(dtype)
    return {"float16": "float32"}.get(name, name)


def _finish(xp, out, cl, dtype):
    """A kernel's output buffer as the caller's ``dtype`` (float16 cast back,
    bfloat16 viewed from its bits), logical NCHW view."""
    out = logical(out, cl)
    return out.astype(xp.float16) if dtype_name(dtype) == "float16" else unbits(out, dtype)


def _geo(c, g: PoolGeometry, cl, ab):
    """Scalar kernel arguments of ``c`` channels pooled as ``g``; ``ab`` is the
    (A, B) extent the threads walk."""
    (pt, pb), (pl, pr) = g.padding
    (h, w), out, k, s = g.in_hw, g.out, g.kernel, g.stride
    return (c, h, w, out[0], out[1], ab[0], ab[1], cl, k[0], k[1], s[0], s[1], pt, pb, pl, pr)


def _called(x_shape, kernel_size, stride, padding, ceil_mode) -> PoolGeometry:
    """The geometry of a call outside a graph: parameters in any form,
    canonicalised and checked once (``reference.pool.geometry``).

    Raises:
        ShapeError: ``x_shape`` is not 4-D; ParameterError, ShapeError: as
            ``reference.pool.geometry``.
    """
    if len(x_shape) != 4:
        raise ShapeError(f"pooling: x must be 4-D NCHW, got shape {tuple(x_shape)}")
    k, s, pad, out = geometry(x_shape[2:], kernel_size, stride, padding, ceil_mode)
    return PoolGeometry(k, s, pad, tuple(x_shape[2:]), out)


def _out(xp, buf, n, c, hw, cl, dtype=None):
    shape = (n, hw[0], hw[1], c) if cl else (n, c, hw[0], hw[1])
    return xp.empty(shape, dtype=dtype or buf.dtype)


#: How the forward stores each window's winner for a backward kernel: its cell,
#: or (``relu``: the pooled x is a ReLU's output) its cell only where the
#: window's maximum passes ReLU's mask ``> 0``; -1 matches no cell.
_STORE_ARG = {False: "arg[t] = (int)win;", True: "arg[t] = best > (CT)0 ? (int)win : -1;"}


def _max(xp, x, g: PoolGeometry, with_arg, what, specialize=False, relu=False):
    buf, cl, dtype = _prepare(xp, x, what)
    n, c = x.shape[:2]
    y = _out(xp, buf, n, c, g.out, cl)
    arg = _out(xp, buf, n, c, g.out, cl, xp.int32) if with_arg else None
    if y.size:
        body = _MAX.replace("STORE", _STORE_ARG[relu] if with_arg else "")
        outs = "raw T y, raw int32 arg" if with_arg else "raw T y"
        name = ("maxpool_arg" + ("_relu" if relu else "")) if with_arg else "maxpool"
        _run(name, "raw T x", [buf.ravel()], outs,
             [y.ravel(), *([arg.ravel()] if with_arg else [])], body, _geo(c, g, cl, g.out),
             size=y.size, arrays=(buf, y), storage=_storage(dtype), specialize=specialize)
    return y, arg, cl, dtype


def max_pool2d(xp, x, *, kernel_size, stride, padding, ceil_mode, specialize=False):
    """Max pooling of ``(N, C, H, W)`` x -> ``(N, C, Ho, Wo)`` in x's dtype and layout.

    ``specialize`` compiles the geometry in (module docstring); same result.
    Raises ParameterError / ShapeError as the reference. Source: SEMANTICS.md.
    """
    return _max_pool(xp, x, _called(x.shape, kernel_size, stride, padding, ceil_mode), specialize)


def _max_pool(xp, x, g, specialize, vector=False, pixels=1):
    if vector and x.ndim == 4 and pool_vector.applies(g, x) is None:
        return pool_vector.max_pool2d(xp, x, g, pixels)
    y, _, cl, dtype = _max(xp, x, g, False, "max_pool2d", specialize)
    return _finish(xp, y, cl, dtype)


def max_pool2d_backward(xp, x, gy, *, kernel_size, stride, padding, ceil_mode, specialize=False):
    """Input gradient of max pooling: ``(N, C, H, W)`` in gy's dtype, x's layout.

    Recomputes each window's argmax from ``x`` (one kernel), then every input
    cell gathers the gradients of the windows it won (a second kernel).
    Reading the forward's output instead of recomputing was measured slower
    on the H200 (``scripts/gpu_kernel_bench.py``; history in docs/performance.md).

    Raises ShapeError when gy is not the pooled shape of x.
    """
    g = _called(x.shape, kernel_size, stride, padding, ceil_mode)
    return _max_backward(xp, x, gy, g, specialize, False)


def max_pool2d_backward_relu(xp, x, gy, *, kernel_size, stride, padding, ceil_mode, specialize=False):
    """``relu_backward(x, max_pool2d_backward(x, gy))`` (the ``MaxPool2dBackwardRelu``
    op; x is the ReLU's output) with the cost of :func:`max_pool2d_backward` alone:
    a winner holds its window's maximum, so ReLU's mask is one test per window
    in the argmax kernel. ``(N, C, H, W)`` in gy's dtype, x's layout.

    Raises ShapeError when gy is not the pooled shape of x.
    """
    g = _called(x.shape, kernel_size, stride, padding, ceil_mode)
    return _max_backward(xp, x, gy, g, specialize, True)


def _max_backward(xp, x, gy, g, specialize, relu, vector=False, pixels=1, tile=False):
    what = "max_pool2d_backward_relu" if relu else "max_pool2d_backward"
    if tuple(gy.shape) != tuple(x.shape[:2]) + g.out:
        raise ShapeError(f"{what}: gy has shape {gy.shape}, expected {x.shape[:2] + g.out}")
    cells = pool_vector.MASKED if relu else pool_vector.MAX_CELLS  # the ReLU mark takes a bit of the index
    if vector and x.ndim == 4 and pool_vector.applies(g, x, gy, max_cells=cells) is None:
        return pool_vector.max_pool2d_backward(xp, x, gy, g, relu, pixels, tile)
    _, arg, cl, _ = _max(xp, x, g, True, what, specialize, relu)
    gb = _computable(xp, in_layout(xp, bits(xp, gy), cl))
    gx = _out(xp, gb, x.shape[0], x.shape[1], x.shape[2:], cl)
    if gx.size:
        _run("maxpool_bwd", "raw T gy, raw int32 arg", [gb.ravel(), arg.ravel()], "raw T gx", [gx.ravel()],
             _MAX_BWD, _geo(x.shape[1], g, cl, x.shape[2:]), size=gx.size, arrays=(gb, gx),
             storage=_storage(gy.dtype), specialize=specialize)
    return _finish(xp, gx, cl, gy.dtype)


def max_pool2d_select(xp, x, v, *, kernel_size, stride, padding, ceil_mode, specialize=False):
    """``v`` read at each window's winning cell of ``x`` (the adjoint of
    :func:`max_pool2d_backward`): pooled shape, v's dtype, x's layout."""
    return _select(xp, x, v, _called(x.shape, kernel_size, stride, padding, ceil_mode), specialize)


def _select(xp, x, v, g, specialize):
    if tuple(v.shape) != tuple(x.shape):
        raise ShapeError(f"max_pool2d_select: v has shape {v.shape}, x has {x.shape}")
    _, arg, cl, _ = _max(xp, x, g, True, "max_pool2d_select", specialize)
    vb = in_layout(xp, bits(xp, v), cl)  # a copy of elements: float16 stays float16
    y = _out(xp, vb, x.shape[0], x.shape[1], g.out, cl)
    if y.size:
        _run("maxpool_select", "raw T v, raw int32 arg", [vb.ravel(), arg.ravel()], "raw T y", [y.ravel()],
             _SELECT, _geo(x.shape[1], g, cl, g.out), size=y.size, arrays=(vb, y),
             storage=dtype_name(v.dtype), specialize=specialize)
    return unbits(logical(y, cl), v.dtype)


def avg_pool2d(xp, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad, specialize=False):
    """Average pooling of ``(N, C, H, W)`` x -> ``(N, C, Ho, Wo)``, x's dtype and layout;
    padding cells hold 0; divisor as the module docstring. Errors as max_pool2d."""
    g = _called(x.shape, kernel_size, stride, padding, ceil_mode)
    return _avg(xp, x, g, count_include_pad, specialize)


def _avg(xp, x, g, count_include_pad, specialize, vector=False):
    if vector and x.ndim == 4 and pool_vector.applies(g, x) is None:
        return pool_vector.avg_pool2d(xp, x, g, count_include_pad)
    buf, cl, dtype = _prepare(xp, x, "avg_pool2d")
    y = _out(xp, buf, x.shape[0], x.shape[1], g.out, cl)
    if y.size:
        _run("avgpool", "raw T x, bool include_pad", [buf.ravel(), bool(count_include_pad)], "raw T y",
             [y.ravel()], _AVG, _geo(x.shape[1], g, cl, g.out), size=y.size, arrays=(buf, y),
             storage=_storage(dtype), preamble=_DIVISOR, specialize=specialize)
    return _finish(xp, y, cl, dtype)


def avg_pool2d_backward(xp, gy, *, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        input_shape, specialize=False):
    """Input gradient of average pooling: each input cell gathers ``gy / divisor``
    from every window covering it. Returns ``input_shape``, gy's dtype and layout.

    Raises ParameterError (input_shape not 4 entries) or ShapeError (gy's shape).
    """
    shape = tuple(int(v) for v in input_shape)
    if len(shape) != 4:
        raise ParameterError("input_shape", input_shape, "must be an NCHW 4-tuple")
    g = _called(shape, kernel_size, stride, padding, ceil_mode)
    if tuple(gy.shape) != shape[:2] + g.out:
        raise ShapeError(f"avg_pool2d_backward: gy has shape {gy.shape}, expected {shape[:2] + g.out}")
    return _avg_backward(xp, gy, g, count_include_pad, shape, specialize)


def _avg_backward(xp, gy, g, count_include_pad, shape, specialize, vector=False):
    if vector and gy.ndim == 4 and pool_vector.applies(g, gy) is None:
        return pool_vector.avg_pool2d_backward(xp, gy, g, count_include_pad, shape)
    gb, cl, dtype = _prepare(xp, gy, "avg_pool2d_backward")
    gx = _out(xp, gb, shape[0], shape[1], shape[2:], cl)
    if gx.size:
        _run("avgpool_bwd", "raw T gy, bool include_pad", [gb.ravel(), bool(count_include_pad)], "raw T gx",
             [gx.ravel()], _AVG_BWD, _geo(shape[1], g, cl, shape[2:]), size=gx.size,
             arrays=(gb, gx), storage=_storage(dtype), preamble=_DIVISOR, specialize=specialize)
    return _finish(xp, gx, cl, dtype)


# ---- the kernels of graph nodes (ctx, op, *arrays): the op's canonical fields and
# ---- the node's extents (``reference.pool.node_geometry``), nothing recomputed

def _specialize(ctx) -> bool:
    """The autotune variant's choice (``cuda_rules.pool_variants``)."""
    return bool(ctx.options.get("specialize", False))


def _vector(ctx) -> bool:
    """The ``vector`` variant (``pool_vector``; taken where its operands qualify,
    else these kernels)."""
    return bool(ctx.options.get("vector", False))


def _pixels(ctx) -> int:
    """The ``vector`` max-pool scans' output columns per thread (``pool_vector.PIXELS``)."""
    return int(ctx.options.get("pixels", 1))


def _tile(ctx) -> bool:
    """The ``tile`` variant: the bfloat16 window scan, take and gather of the ``vector``
    kernels from shared-memory tiles (``pool_vector.tile_declines``, ``rules.TILED_POOLS``)."""
    return bool(ctx.options.get("tile", False))


def max_pool2d_kernel(ctx, op, x):
    """``MaxPool2d`` node: :func:`max_pool2d` with the node's geometry."""
    g = node_geometry(op, x.shape[2:], ctx.out_shape(op, x)[2:])
    return _max_pool(ctx.xp, x, g, _specialize(ctx), _vector(ctx), _pixels(ctx))


def max_pool2d_backward_kernel(ctx, op, x, gy):
    """``MaxPool2dBackward`` node: :func:`max_pool2d_backward` with the node's geometry."""
    return _max_backward(ctx.xp, x, gy, node_geometry(op, x.shape[2:], gy.shape[2:]), _specialize(ctx), False,
                         _vector(ctx), _pixels(ctx), _tile(ctx))


def max_pool2d_backward_relu_kernel(ctx, op, x, gy):
    """``MaxPool2dBackwardRelu`` node: :func:`max_pool2d_backward_relu` with the node's geometry."""
    return _max_backward(ctx.xp, x, gy, node_geometry(op, x.shape[2:], gy.shape[2:]), _specialize(ctx), True,
                         _vector(ctx), _pixels(ctx), _tile(ctx))


def max_pool2d_select_kernel(ctx, op, x, v):
    """``MaxPool2dSelect`` node: :func:`max_pool2d_select` with the node's geometry."""
    g = node_geometry(op, x.shape[2:], ctx.out_shape(op, x, v)[2:])
    return _select(ctx.xp, x, v, g, _specialize(ctx))


def avg_pool2d_kernel(ctx, op, x):
    """``AvgPool2d`` node: :func:`avg_pool2d` with the node's geometry."""
    g = node_geometry(op, x.shape[2:], ctx.out_shape(op, x)[2:])
    return _avg(ctx.xp, x, g, op.count_include_pad, _specialize(ctx), _vector(ctx))


def avg_pool2d_backward_kernel(ctx, op, gy):
    """``AvgPool2dBackward`` node: :func:`avg_pool2d_backward` with the node's geometry."""
    shape = tuple(op.input_shape)
    g = node_geometry(op, shape[2:], gy.shape[2:])
    return _avg_backward(ctx.xp, gy, g, op.count_include_pad, shape, _specialize(ctx), _vector(ctx))


__all__ = ["max_pool2d", "max_pool2d_backward", "max_pool2d_backward_relu", "max_pool2d_select",
           "avg_pool2d", "avg_pool2d_backward", "max_pool2d_kernel", "max_pool2d_backward_kernel",
           "max_pool2d_backward_relu_kernel", "max_pool2d_select_kernel", "avg_pool2d_kernel",
           "avg_pool2d_backward_kernel"]
