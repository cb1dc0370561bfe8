"""cuDNN lowering of convolution (forward, backward-data, backward-filter) on CuPy arrays.

Runs through NVIDIA's cuDNN frontend (the Python ``cudnn`` module of
``nvidia-cudnn-frontend``); graphs are built once per signature by
:mod:`.cudnn_graph`. Stride, dilation and groups (incl. depthwise; cuDNN reads
the group count off the weight shape) are native. Padding must be symmetric
per axis: the frontend takes asymmetric pre/post padding, but on cuDNN 9.19
some wgrad engines compute it wrong (docs/gpu.md), so the rules are tagged
``symmetric_padding_only`` and the legalize pass makes the asymmetric excess
an explicit ``Pad`` node before a node gets here; these functions refuse
asymmetric padding rather than pad on their own.

Epilogues (``opgraph/ops/conv_fused.py``), built into the same cuDNN graph
as pointwise ops (:func:`.cudnn_graph.build_graph`): fprop's bias, residual
add and ReLU / ReLU6 (``conv_fprop -> bias -> add -> relu``), dgrad's ReLU
gradient (``conv_dgrad -> relu_backward``). Where no engine fuses an
epilogue, the unfused graph runs and the epilogue follows on CuPy
(``reference.conv_epilogue.apply_epilogue``, the code every other algorithm
runs); :func:`route` picks, and remembers it per signature.

Options (``ctx.options`` of a ``Lowered`` node, or keywords):

* ``precision``: one of :data:`opgraph.precision.PRECISIONS` (``'fp32'``:
  float32, TF32 engines excluded; ``'tf32'``, ``'bf16'``, ``'fp16'``); inputs
  are rounded to the precision's I/O type (:data:`opgraph.precision.IO_DTYPE`)
  on the device and the result is returned in the input dtype; compute and
  accumulation are float32. The rules always pass the precision the lower
  pass resolved; called by hand without one, the arrays' own
  (:data:`opgraph.precision.DEFAULT_PRECISION`: float32 -> fp32, float16 ->
  fp16, bfloat16 -> bf16).
* ``engine``: cuDNN plan index (see :func:`variants`); default: the first plan
  in heuristic order that builds.

Layouts: a 4-D array is NCHW when C-contiguous and NHWC when it is a
``(0, 3, 1, 2)`` view of a C-contiguous NHWC buffer; the other operands are
put in the same layout and the result comes back in it (logical NCHW shape).
Batch size 0 gives an empty output (zeros for the weight gradient) without
calling cuDNN.

Strided output (``out=``, the forward ops: a producer of a zero-copy concat
writes into its channel slice of the concat's buffer, ``Rule.writes_strided_out``):
when ``out``'s dtype is the I/O dtype, the graph's output tensor takes
``out``'s own element strides (a channel slice of an NHWC buffer: ``(HWC', 1,
WC', C')`` for the buffer's C' channels) and cuDNN writes there directly;
the engine asked for is the one of the same name in that graph's plan list
(the autotuner timed the dense graph's), else that graph's default. Otherwise
(a cast, an epilogue left to CuPy) the result is copied into ``out``. The
rules declare it for NHWC outputs only (``cudnn_rules.register_rules``): the
zero-copy plan copies a dense result into an NCHW slice.
"""

from __future__ import annotations

from opgraph import precision as precisions
from opgraph.buffer_views import copy_into
from opgraph.errors import LoweringError, ParameterError, ShapeError
from opgraph.ops.conv_fused import ACTIVATIONS
from opgraph.types import storage_order, to_layout

from ..reference.conv_epilogue import apply_epilogue
from . import cudnn_graph as cg
from .storage import dense_strides, empty_in_layout, like, unbits

_DTYPES = ("float32", "float16", "bfloat16")
_ROUTES: dict = {}  # requested signature -> (plan, CuPy epilogue)


# ----------------------------------------------------------------- layouts, dtypes

def _channels_last(a) -> bool:
    """Whether a convolution reading ``a`` runs NHWC: also for a strided view
    of an NHWC buffer (:func:`~opgraph.types.storage_order`), copied packed
    NHWC by :func:`_in_layout`, as the autotune pass ran it."""
    return storage_order(a) == "NHWC"


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
              cl: bool, device: int = 0, out_strides=None) -> cg.ConvSignature:
    """The :class:`~.cudnn_graph.ConvSignature` of a convolution.

    ``epilogue`` is :func:`.cudnn_graph.epilogue_name` of its steps (``'none'``,
    ``'bias'``, ``'bias_add_relu6'``, ``'drelu'``, ...). ``shapes`` are the
    operands' logical NCHW/OIHW shapes in :data:`~.cudnn_graph.OPERANDS`
    order, the epilogue's operands before the output (the bias as
    ``(1, K, 1, 1)``); ``cl`` picks the NHWC strides for every operand (the
    bias is always dense); ``out_strides`` (element strides) replaces the
    output's, for a strided output view (module docstring).

    Raises:
        ParameterError: unknown precision (:func:`opgraph.precision.check`).
    """
    precisions.check(precision)
    bias = kind == "fprop" and "bias" in cg.epilogue_steps(epilogue)
    strides = tuple((s[1], 1, 1, 1) if bias and i == 2 else dense_strides(s, cl) for i, s in enumerate(shapes))
    if out_strides is not None:
        strides = strides[:-1] + (tuple(int(v) for v in out_strides),)
    (pt, pb), (pl, pr) = padding
    return cg.ConvSignature(kind, epilogue, tuple(tuple(s) for s in shapes), strides,
                            precisions.IO_DTYPE[precision], precision, (pt, pl), (pb, pr),
                            tuple(stride), tuple(dilation), bool(cl), device)


def _unfused(sig: cg.ConvSignature) -> cg.ConvSignature:
    """The same convolution without its epilogue (nor the epilogue's operands)."""
    return sig._replace(epilogue="none", dims=sig.dims[:2] + sig.dims[-1:],
                        strides=sig.strides[:2] + sig.strides[-1:])


def route(sig: cg.ConvSignature):
    """``(plan, epilogue_left_to_cupy)`` for ``sig``: the graph of ``sig``
    itself, or, where no engine fuses its epilogue, the graph without it
    (the epilogue then applied by CuPy; ``'none'`` when cuDNN does it all).

    Raises:
        LoweringError: neither builds; the message lists cuDNN's reasons.
    """
    got = _ROUTES.get(sig)
    if got is not None:
        return got
    tries = [(sig, "none")]
    if sig.epilogue != "none":
        tries.append((_unfused(sig), sig.epilogue))
    errors = []
    for s, epi in tries:
        try:
            got = (cg.plan_for(s), epi)
            break
        except LoweringError as exc:
            errors.append(str(exc))
    else:
        raise LoweringError("cuDNN cannot run this convolution in any form: " + " | ".join(errors))
    _ROUTES[sig] = got
    return got


# ----------------------------------------------------------------- the three operations

def _require_symmetric(kind: str, padding) -> None:
    """Refuse asymmetric padding (module docstring: the legalize pass makes its
    excess explicit, the rules being tagged ``symmetric_padding_only``)."""
    if any(p[0] != p[1] for p in padding):
        raise LoweringError(f"cuDNN {kind}: padding {tuple(padding)} is asymmetric; cuDNN 9.19 is not "
                            "trusted with it (docs/gpu.md): the legalize pass makes the excess an "
                            "explicit Pad node (rule tag symmetric_padding_only)")


def _engine_in(plan, sig: cg.ConvSignature, engine):
    """The index in ``plan`` (a strided-output graph of ``sig``'s convolution)
    of the engine ``engine`` names in the dense graph of ``sig`` (by cuDNN's
    plan name), or ``plan``'s default when it has none of that name."""
    if engine is None:
        return plan.pick_default()
    dense, _ = route(sig._replace(strides=sig.strides[:-1] + (dense_strides(sig.dims[-1], sig.channels_last),)))
    name = dense.name(int(engine))
    found = next((i for i in range(plan.count) if plan.name(i) == name), None)
    return plan.pick_default() if found is None else found


def _run(xp, kind, steps, ins, out_shape, out_dtype, padding, stride, dilation, precision,
         engine, cl, out=None):
    """Cast, route, execute; ``ins`` are the operands in signature order (the
    epilogue's after the first two), ``steps`` the epilogue's; ``out``: a
    view to write the result into (module docstring), or None."""
    _require_symmetric(kind, padding)
    io = precisions.IO_DTYPE[precision]
    shapes = [tuple(a.shape) for a in ins] + [tuple(out_shape)]
    if "bias" in steps:
        shapes[2] = (1, out_shape[1], 1, 1)
    direct = out is not None and out.dtype.name == io
    sig = signature(kind, cg.epilogue_name(steps), shapes, precision, padding, stride, dilation, cl,
                    _device_id(xp), tuple(v // out.itemsize for v in out.strides) if direct else None)
    plan, cupy_epilogue = route(sig)
    ops = [_in_layout(xp, _cast(xp, a, io), cl) if a.ndim == 4 else xp.ascontiguousarray(_cast(xp, a, io))
           for a in (ins if cupy_epilogue == "none" else ins[:2])]
    target = out if direct else empty_in_layout(xp, plan.sig.dims[-1], xp.uint16 if io == "bfloat16" else io, cl)
    index = _engine_in(plan, sig, engine) if direct else plan.default if engine is None else int(engine)
    scratch = cg.workspace(plan.ensure(index), plan.sig.device)
    plan.execute([a.data.ptr for a in ops] + [target.data.ptr], index, cg.pointer(scratch))
    y = target if direct else _uncast(xp, target, io, out_dtype)
    if cupy_epilogue != "none":
        y = apply_epilogue(xp, steps, y, ins[2:])
    if out is not None and y is not out:
        copy_into(out, y)
        return out
    return y


def _check_dtype(*arrays):
    for a in arrays:
        if a.dtype.name not in _DTYPES:
            raise ShapeError(f"cuDNN convolution takes {_DTYPES}, got dtype {a.dtype}")


def _precision(precision, dtype) -> str:
    """The precision asked, or without one the storage's own (module docstring)."""
    return precisions.DEFAULT_PRECISION[dtype.name] if precision is None else precision


def conv2d(xp, x, w, b=None, r=None, *, stride, padding, dilation, groups, out_shape, precision=None,
           engine=None, activation="none", out=None):
    """Forward convolution ``y = act(conv(x, w) (+ b) (+ r))`` by cuDNN, the
    epilogue in the same graph where an engine fuses it.

    Args:
        xp: ``cupy``.
        x: ``(N, C, H, W)``; w: ``(K, C/groups, kH, kW)``; b: ``(K,)`` or None.
        r: a residual addend of the output's shape, or None.
        stride, dilation: ``(h, w)``; padding ``((top, bottom), (left, right))``,
        symmetric per axis; groups: int (cuDNN infers it from ``C / w.shape[1]``;
        checked here).
        out_shape: the output shape ``(N, K, Ho, Wo)``, as the node's type
            inference computed it (``Conv2d.infer``; never recomputed here).
        precision, engine: see the module docstring.
        activation: ``'none'``, ``'relu'`` or ``'relu6'``
            (``opgraph.ops.conv_fused.ACTIVATIONS``), after the bias and ``r``.
        out: a view of ``out_shape`` in x's dtype, any strides, to write the
            result into (module docstring), or None.

    Returns:
        ``out_shape`` in x's dtype and layout (``out`` when given).

    Raises:
        ShapeError: bad dtype, channel counts or output shape. ParameterError:
        an unknown activation. LoweringError: asymmetric padding, or cuDNN
        cannot run it.

    Source: SEMANTICS.md (Convolution); cuDNN ``conv_fprop``, pointwise ``bias``,
    ``add``, ``relu`` (with ``upper_clip`` for ReLU6).
    """
    _check_dtype(x, w)
    if activation not in ACTIVATIONS:
        raise ParameterError("activation", activation, f"must be one of {list(ACTIVATIONS)}")
    n, c = x.shape[:2]
    k = w.shape[0]
    if c != w.shape[1] * groups or k % groups:
        raise ShapeError(f"cuDNN conv2d: x {x.shape}, w {w.shape} do not fit groups={groups}")
    into, out = out, tuple(int(v) for v in out_shape)
    if into is not None and (tuple(into.shape) != out or into.dtype != x.dtype):
        raise ShapeError(f"cuDNN conv2d: out= is {into.dtype}{tuple(into.shape)}, the output {x.dtype}{out}")
    if out[:2] != (n, k):
        raise ShapeError(f"cuDNN conv2d: output shape {out} does not fit x {x.shape} and w {w.shape}")
    if r is not None and tuple(r.shape) != out:
        raise ShapeError(f"cuDNN conv2d: residual shape {r.shape} != output shape {out}")
    cl = _channels_last(x)
    if n == 0:
        return empty_in_layout(xp, out, x.dtype, cl) if into is None else into
    if b is None and (r is not None or activation != "none"):
        b = xp.zeros((k,), dtype=x.dtype)  # the fused graphs start with the bias
    steps = (("bias",) if b is not None else ()) + (("add",) if r is not None else ()) + \
        ((activation,) if activation != "none" else ())
    ins = [x, w] + [a for a in (b, r) if a is not None]
    return _run(xp, "fprop", steps, ins, out, x.dtype, padding, stride, dilation,
                _precision(precision, x.dtype), engine, cl, into)


def conv2d_bias_relu(xp, x, w, b, *, stride, padding, dilation, groups, out_shape, precision=None,
                     engine=None):
    """``relu(conv(x, w) + b)`` as one cuDNN graph (conv_fprop -> bias -> relu),
    falling back to conv + CuPy bias/ReLU where no fusion engine exists.

    Shapes, options and errors as :func:`conv2d`; ``b`` is required.
    """
    return conv2d(xp, x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups,
                  out_shape=out_shape, precision=precision, engine=engine, activation="relu")


def conv2d_backward_data(xp, gy, w, *, stride, padding, dilation, groups, input_shape,
                         precision=None, engine=None, relu_output=None):
    """``dL/dx`` by cuDNN ``conv_dgrad``: gy ``(N, K, Ho, Wo)``, w ``(K, C/groups, kH, kW)``
    -> ``(N, C, H, W)`` = ``input_shape`` (rows no window touches get 0), in gy's
    dtype and layout. With ``relu_output`` (``input_shape``: the output of the
    ReLU the convolution read), the gradient is masked where it is not > 0
    (``relu_backward`` in the same graph where an engine fuses it: the
    ``Conv2dBackwardDataRelu`` op). Options and errors as :func:`conv2d`."""
    _check_dtype(gy, w)
    shape = tuple(int(v) for v in input_shape)
    if relu_output is not None and tuple(relu_output.shape) != shape:
        raise ShapeError(f"cuDNN conv2d_backward_data: ReLU output shape {relu_output.shape} != {shape}")
    cl = _channels_last(gy)
    if shape[0] == 0:
        return empty_in_layout(xp, shape, gy.dtype, cl)
    steps, ins = ((), [gy, w]) if relu_output is None else (("drelu",), [gy, w, relu_output])
    return _run(xp, "dgrad", steps, ins, shape, gy.dtype, padding, stride, dilation,
                _precision(precision, gy.dtype), engine, cl)


def conv2d_backward_filter(xp, x, gy, *, stride, padding, dilation, groups, weight_shape,
                           precision=None, engine=None):
    """``dL/dw`` by cuDNN ``conv_wgrad``: x ``(N, C, H, W)``, gy ``(N, K, Ho, Wo)`` ->
    ``weight_shape`` ``(K, C/groups, kH, kW)`` in x's dtype, stored in x's layout
    (KRSC for NHWC). Batch size 0 gives zeros. Options and errors as :func:`conv2d`."""
    _check_dtype(x, gy)
    shape = tuple(int(v) for v in weight_shape)
    cl = _channels_last(x)
    if x.shape[0] == 0:
        out = empty_in_layout(xp, shape, x.dtype, cl)
        out[...] = 0
        return out
    return _run(xp, "wgrad", (), [x, gy], shape, x.dtype, padding, stride, dilation,
                _precision(precision, x.dtype), engine, cl)


__all__ = ["conv2d", "conv2d_bias_relu", "conv2d_backward_data", "conv2d_backward_filter",
           "signature", "route"]
