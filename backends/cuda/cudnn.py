"""cuDNN lowering of convolution (forward, backward-data, backward-filter) on CuPy arrays.

Runs through NVIDIA's cuDNN frontend (the Python ``cudnn`` module of
``nvidia-cudnn-frontend``); graphs are built once per signature by
:mod:`.cudnn_graph`. Every parameter form of SEMANTICS.md is accepted:
stride, dilation, groups (incl. depthwise; cuDNN reads the group count off the
weight shape), and asymmetric padding. The frontend takes asymmetric padding
natively (pre/post padding) but on cuDNN 9.19 some wgrad engines compute it
wrong, so asymmetric padding is legalized (:func:`route`): cuDNN pads the
symmetric part, the remainder is explicit zero padding of the image operand
(x, or a larger dx that is cropped). A fused epilogue without a fusion engine
falls back to the unfused graph plus a CuPy epilogue. The route taken is
remembered per signature.

Options (``ctx.options`` of a ``Lowered`` node, or keywords):

* ``precision``: ``'fp32'`` (float32, TF32 engines excluded), ``'tf32'``,
  ``'bf16'``, ``'fp16'``; inputs are rounded to the precision's I/O type on
  the device and the result is returned in the input dtype; compute and
  accumulation are float32. Default: the arrays' own dtype
  (float32 -> fp32, float16 -> fp16, bfloat16 -> bf16).
* ``engine``: cuDNN plan index (see :func:`variants`); default: the first plan
  in heuristic order that builds.

Layouts: a 4-D array is NCHW when C-contiguous and NHWC when it is a
``(0, 3, 1, 2)`` view of a C-contiguous NHWC buffer; the other operands are
put in the same layout and the result comes back in it (logical NCHW shape).
Batch size 0 gives an empty output (zeros for the weight gradient) without
calling cuDNN.
"""

from __future__ import annotations

from opgraph.errors import LoweringError, ShapeError
from opgraph.params import conv_out_size
from opgraph.types import is_channels_last as _channels_last, to_layout

from . import cudnn_graph as cg
from .storage import like, unbits

_DTYPES = ("float32", "float16", "bfloat16")
_DEFAULT_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_ROUTES: dict = {}  # requested signature -> (plan, CuPy epilogue, explicit padding)


def default_precision(dtype_name: str) -> str:
    """The precision that keeps ``dtype_name`` as the I/O type."""
    return _DEFAULT_PRECISION[dtype_name]


# ----------------------------------------------------------------- layouts, dtypes

def _strides(shape, cl: bool) -> tuple:
    """Canonical element strides of an NCHW-shaped tensor stored NCHW or NHWC."""
    n, c, h, w = shape
    return (c * h * w, 1, w * c, c) if cl else (c * h * w, h * w, w, 1)


def _empty(xp, shape, dtype, cl: bool):
    if cl:
        n, c, h, w = shape
        return xp.empty((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)
    return xp.empty(shape, dtype=dtype)


def _in_layout(xp, a, cl: bool):
    return to_layout(xp, a, "NHWC") if cl else xp.ascontiguousarray(a)


def _cast(xp, a, io: str):
    """``a`` as I/O dtype ``io`` (bfloat16 as its uint16 bits), layout kept:
    :func:`.storage.like`, the storage conversion our kernels use."""
    return like(xp, a, io)


def _uncast(xp, a, io: str, dtype):
    """The output ``a`` (I/O dtype ``io``, bfloat16 as its bits) back in the
    caller's ``dtype`` (a view when it is ``io``)."""
    return unbits(like(xp, unbits(a, io), dtype), dtype)


def _device_id(xp) -> int:
    return xp.cuda.runtime.getDevice()


# ----------------------------------------------------------------- signatures and routes

def signature(kind: str, epilogue: str, shapes, precision: str, padding, stride, dilation,
              cl: bool, device: int = 0) -> cg.ConvSignature:
    """The :class:`~.cudnn_graph.ConvSignature` of a convolution.

    ``shapes`` are the operands' logical NCHW/OIHW shapes in
    :data:`~.cudnn_graph.OPERANDS` order (bias, if any, as ``(1, K, 1, 1)``
    before the output); ``cl`` picks the NHWC strides for every operand
    (the bias is always dense).

    Raises:
        ValueError: unknown precision.
    """
    if precision not in cg.PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {cg.PRECISIONS}")
    strides = tuple((s[1], 1, 1, 1) if epilogue != "none" and i == 2 else _strides(s, cl)
                    for i, s in enumerate(shapes))
    (pt, pb), (pl, pr) = padding
    return cg.ConvSignature(kind, epilogue, tuple(tuple(s) for s in shapes), strides,
                            cg.IO_DTYPE[precision], precision, (pt, pl), (pb, pr),
                            tuple(stride), tuple(dilation), bool(cl), device)


def _split(sig: cg.ConvSignature, keep_symmetric: bool = True):
    """The same convolution with padding split into a symmetric part cuDNN
    applies (``min(pre, post)`` per axis, or none) and an explicit zero
    padding of the image operand (x, or dx for dgrad) by the rest.

    Returns ``(signature, extra)`` with ``extra = ((top, bottom), (left, right))``.
    """
    (pt, pl), (pb, pr) = sig.pre_padding, sig.post_padding
    mh, mw = (min(pt, pb), min(pl, pr)) if keep_symmetric else (0, 0)
    extra = ((pt - mh, pb - mh), (pl - mw, pr - mw))
    dims, strides = list(sig.dims), list(sig.strides)
    i = len(dims) - 1 if sig.kind == "dgrad" else 0  # the image operand: dx, or x
    n, c, h, w = dims[i]
    dims[i] = (n, c, h + sum(extra[0]), w + sum(extra[1]))
    strides[i] = _strides(dims[i], sig.channels_last)
    return sig._replace(dims=tuple(dims), strides=tuple(strides), pre_padding=(mh, mw),
                        post_padding=(mh, mw)), extra


def _unfused(sig: cg.ConvSignature) -> cg.ConvSignature:
    return sig._replace(epilogue="none", dims=sig.dims[:2] + sig.dims[3:],
                        strides=sig.strides[:2] + sig.strides[3:])


#: Whether cuDNN's native pre != post padding is trusted, per operation. On the
#: H200 with cuDNN 9.19 some wgrad engines returned wrong weight gradients for
#: asymmetric padding (docs/gpu.md), so asymmetric padding is legalized: the
#: symmetric part stays native, the rest becomes explicit zero padding.
NATIVE_ASYMMETRIC = {"fprop": False, "dgrad": False, "wgrad": False}


def route(sig: cg.ConvSignature):
    """``(plan, epilogue_left_to_cupy, extra_padding)`` for ``sig``:

    1. the graph of ``sig`` itself when its padding is symmetric (or native
       asymmetric padding is trusted for the operation, :data:`NATIVE_ASYMMETRIC`);
    2. else the split form (:func:`_split`), and as a last resort all padding
       explicit;

    each tried fused first, then without the epilogue (applied by CuPy).
    ``extra_padding`` is None when cuDNN pads everything itself.

    Raises:
        LoweringError: no form builds; the message lists cuDNN's reasons.
    """
    got = _ROUTES.get(sig)
    if got is not None:
        return got
    symmetric = sig.pre_padding == sig.post_padding
    forms = [(sig, None)] if symmetric or NATIVE_ASYMMETRIC[sig.kind] else []
    if not symmetric:
        forms.append(_split(sig))
    if any(sig.pre_padding) or any(sig.post_padding):
        forms.append(_split(sig, keep_symmetric=False))
    tries = [(s, "none", extra) for s, extra in forms]
    if sig.epilogue != "none":
        tries = [t for s, e in forms for t in ((s, "none", e), (_unfused(s), sig.epilogue, e))]
    errors = []
    for s, epi, extra in tries:
        try:
            got = (cg.plan_for(s), epi, extra)
            break
        except LoweringError as exc:
            errors.append(str(exc))
    else:
        raise LoweringError("cuDNN cannot run this convolution in any form: " + " | ".join(errors))
    _ROUTES[sig] = got
    return got


# ----------------------------------------------------------------- the three operations

def _run(xp, kind, epilogue, ins, out_shape, out_dtype, padding, stride, dilation, precision,
         engine, cl):
    """Cast, route, execute; ``ins`` are the operands in signature order."""
    io = cg.IO_DTYPE[precision]
    shapes = [tuple(a.shape) for a in ins] + [tuple(out_shape)]
    if epilogue != "none":
        shapes[2] = (1, out_shape[1], 1, 1)
    sig = signature(kind, epilogue, shapes, precision, padding, stride, dilation, cl, _device_id(xp))
    plan, cupy_epilogue, extra = route(sig)
    ops = [_in_layout(xp, _cast(xp, a, io), cl) if a.ndim == 4 else xp.ascontiguousarray(_cast(xp, a, io))
           for a in ins]
    if extra is not None and kind in ("fprop", "wgrad"):  # zero-pad the image operand
        (et, eb), (el, er) = extra
        t = ops[0].transpose(0, 2, 3, 1) if cl else ops[0]
        t = xp.pad(t, ((0, 0), (et, eb), (el, er), (0, 0)) if cl else ((0, 0), (0, 0), (et, eb), (el, er)))
        ops[0] = t.transpose(0, 3, 1, 2) if cl else t
    if cupy_epilogue != "none":
        ops = ops[:2]
    out = _empty(xp, plan.sig.dims[-1], xp.uint16 if io == "bfloat16" else io, cl)
    index = plan.default if engine is None else int(engine)
    scratch = cg.workspace(plan.ensure(index), plan.sig.device)
    plan.execute([a.data.ptr for a in ops] + [out.data.ptr], index, cg.pointer(scratch))
    if extra is not None and kind == "dgrad":  # crop the explicit padding off dx
        (et, _), (el, _) = extra
        out = _in_layout(xp, out[:, :, et:et + out_shape[2], el:el + out_shape[3]], cl)
    y = _uncast(xp, out, io, out_dtype)
    if cupy_epilogue != "none":
        y += ins[2].reshape(1, -1, 1, 1).astype(y.dtype, copy=False)
        if cupy_epilogue == "bias_relu":
            xp.maximum(y, 0, out=y)
    return y


def _check_dtype(*arrays):
    for a in arrays:
        if a.dtype.name not in _DTYPES:
            raise ShapeError(f"cuDNN convolution takes {_DTYPES}, got dtype {a.dtype}")


def conv2d(xp, x, w, b=None, *, stride, padding, dilation, groups, precision=None, engine=None,
           relu=False):
    """Forward convolution ``y = conv(x, w) (+ b) (then ReLU if relu)`` by cuDNN.

    Args:
        xp: ``cupy``.
        x: ``(N, C, H, W)``; w: ``(K, C/groups, kH, kW)``; b: ``(K,)`` or None.
        stride, dilation: ``(h, w)``; padding ``((top, bottom), (left, right))``;
        groups: int (cuDNN infers it from ``C / w.shape[1]``; checked here).
        precision, engine: see the module docstring.
        relu: fuse a ReLU after the bias (see :func:`conv2d_bias_relu`).

    Returns:
        ``(N, K, Ho, Wo)`` in x's dtype and layout.

    Raises:
        ShapeError: bad dtype or channel counts. LoweringError: cuDNN cannot run it.

    Source: SEMANTICS.md (Convolution); cuDNN ``conv_fprop``.
    """
    _check_dtype(x, w)
    n, c, h, wd = x.shape
    k = w.shape[0]
    if c != w.shape[1] * groups or k % groups:
        raise ShapeError(f"cuDNN conv2d: x {x.shape}, w {w.shape} do not fit groups={groups}")
    out = (n, k) + tuple(conv_out_size(i, kk, s, d, p) for i, kk, s, d, p in
                         zip((h, wd), w.shape[2:], stride, dilation, padding))
    if min(out[2:]) < 1:
        raise ShapeError(f"cuDNN conv2d: output {out} is empty (kernel larger than the padded input)")
    cl = _channels_last(x)
    if n == 0:
        return _empty(xp, out, x.dtype, cl)
    epilogue = "bias_relu" if relu else "bias" if b is not None else "none"
    if relu and b is None:
        b = xp.zeros((k,), dtype=x.dtype)
    ins = [x, w] + ([b] if b is not None else [])
    return _run(xp, "fprop", epilogue, ins, out, x.dtype, padding, stride, dilation,
                precision or default_precision(x.dtype.name), engine, cl)


def conv2d_bias_relu(xp, x, w, b, *, stride, padding, dilation, groups, precision=None, engine=None):
    """``relu(conv(x, w) + b)`` as one cuDNN graph (conv_fprop -> bias -> relu),
    falling back to conv + CuPy bias/ReLU where no fusion engine exists.

    Shapes, options and errors as :func:`conv2d`; ``b`` is required.
    """
    return conv2d(xp, x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups,
                  precision=precision, engine=engine, relu=True)


def conv2d_backward_data(xp, gy, w, *, stride, padding, dilation, groups, input_shape,
                         precision=None, engine=None):
    """``dL/dx`` by cuDNN ``conv_dgrad``: gy ``(N, K, Ho, Wo)``, w ``(K, C/groups, kH, kW)``
    -> ``(N, C, H, W)`` = ``input_shape`` (rows no window touches get 0), in gy's
    dtype and layout. Options and errors as :func:`conv2d`."""
    _check_dtype(gy, w)
    shape = tuple(int(v) for v in input_shape)
    cl = _channels_last(gy)
    if shape[0] == 0:
        return _empty(xp, shape, gy.dtype, cl)
    return _run(xp, "dgrad", "none", [gy, w], shape, gy.dtype, padding, stride, dilation,
                precision or default_precision(gy.dtype.name), engine, cl)


def conv2d_backward_filter(xp, x, gy, *, stride, padding, dilation, groups, weight_shape,
                           precision=None, engine=None):
    """``dL/dw`` by cuDNN ``conv_wgrad``: x ``(N, C, H, W)``, gy ``(N, K, Ho, Wo)`` ->
    ``weight_shape`` ``(K, C/groups, kH, kW)`` in x's dtype, stored in x's layout
    (KRSC for NHWC). Batch size 0 gives zeros. Options and errors as :func:`conv2d`."""
    _check_dtype(x, gy)
    shape = tuple(int(v) for v in weight_shape)
    cl = _channels_last(x)
    if x.shape[0] == 0:
        out = _empty(xp, shape, x.dtype, cl)
        out[...] = 0
        return out
    return _run(xp, "wgrad", "none", [x, gy], shape, x.dtype, padding, stride, dilation,
                precision or default_precision(x.dtype.name), engine, cl)


__all__ = ["conv2d", "conv2d_bias_relu", "conv2d_backward_data", "conv2d_backward_filter",
           "signature", "route", "default_precision"]
