"""Registry rules of the ``cudnn`` algorithm (device ``cuda``) for the three convolution ops.

Each rule's

* ``kernel`` calls :mod:`.cudnn` with the op's fields and the node's options
  ``precision`` and ``engine``;
* ``check`` declines a dtype cuDNN graphs do not take here (float64), a
  missing frontend or CuPy, and, on a machine with a GPU, any convolution
  cuDNN rejects in every form (the reason is cuDNN's own message);
* ``variants`` lists one ``{'engine': i}`` per cuDNN plan that builds, in
  heuristic order (the first is the default choice), for the dtype's default
  precision or ``precision`` when given;
* ``workspace`` is the plan's cuDNN workspace plus the scratch arrays of the
  call (precision casts, explicit padding of asymmetric padding).

Shapes and layouts come from the ``TensorType``\\ s: ``layout == 'NHWC'`` on
the first input means channels-last operands, as the kernel will see them.
"""

from __future__ import annotations

import math

from opgraph.errors import LoweringError
from opgraph.ops.conv import Conv2d, Conv2dBackwardData, Conv2dBackwardFilter, Conv2dBiasRelu
from opgraph.params import conv_out_size

from ..device import cuda_status
from ..registry import Rule, register
from .cudnn import (conv2d, conv2d_backward_data, conv2d_backward_filter, conv2d_bias_relu, default_precision,
                    route, signature)

KIND = {Conv2d: "fprop", Conv2dBackwardData: "dgrad", Conv2dBackwardFilter: "wgrad"}
_DTYPES = ("float32", "float16", "bfloat16")
_FUSED: set = set()  # op types of fused conv + bias + ReLU (register_fused_rule)


def _options(options) -> dict:
    return dict(options or {})


def _signature(op, in_types, precision=None, device: int = 0):
    """The signature the kernel will build for ``op`` on inputs ``in_types``;
    None for an empty batch (no cuDNN call)."""
    fused = type(op) in _FUSED
    kind = "fprop" if fused else KIND[type(op)]
    first = in_types[0]
    precision = precision or default_precision(first.dtype)
    if kind == "fprop":
        out = (first.shape[0], in_types[1].shape[0]) + tuple(
            conv_out_size(n, k, s, d, p) for n, k, s, d, p in
            zip(first.shape[2:], in_types[1].shape[2:], op.stride, op.dilation, op.padding))
        bias = [(1, out[1], 1, 1)] if len(in_types) > 2 else []
        shapes = [first.shape, in_types[1].shape] + bias + [out]
    elif kind == "dgrad":
        shapes = [first.shape, in_types[1].shape, op.input_shape]
    else:
        shapes = [first.shape, in_types[1].shape, op.weight_shape]
    if shapes[-1][0] == 0 or first.shape[0] == 0:
        return None
    epilogue = "bias_relu" if fused else "bias" if kind == "fprop" and len(in_types) > 2 else "none"
    return signature(kind, epilogue, shapes, precision, op.padding, op.stride, op.dilation,
                     first.layout == "NHWC", device)


def _device() -> int:
    import cupy
    return cupy.cuda.runtime.getDevice()


def check(op, in_types, device):
    """None if cuDNN can run ``op`` on ``in_types``, else why not."""
    dtypes = sorted({t.dtype for t in in_types})
    if any(d not in _DTYPES for d in dtypes):
        return f"cuDNN convolution takes {', '.join(_DTYPES)}; got {', '.join(dtypes)}"
    if any(t.layout not in (None, "NCHW", "NHWC") for t in in_types if t.ndim == 4):
        return "cuDNN lowering takes NCHW or NHWC layouts"
    ok, why = cuda_status()
    if not ok:
        return f"no GPU: {why}"
    try:
        import cudnn  # noqa: F401
    except Exception as exc:
        return f"the cuDNN frontend cannot be imported ({exc}); pip install nvidia-cudnn-frontend"
    try:
        sig = _signature(op, in_types, device=_device())
        if sig is not None:
            route(sig)
    except LoweringError as exc:
        return str(exc)
    return None


def variants(op, in_types, device, precision=None):
    """``[{'engine': i}, ...]``: every cuDNN plan that builds, heuristic order first."""
    sig = _signature(op, in_types, precision, _device())
    if sig is None:
        return [{}]
    return [{"engine": i} for i in route(sig)[0].engines()]  # ascending = heuristic order


def workspace(op, in_types, options) -> int:
    """Scratch bytes of one call: cuDNN workspace of the engine, plus cast and
    padding buffers."""
    opts = _options(options)
    sig = _signature(op, in_types, opts.get("precision"), _device())
    if sig is None:
        return 0
    plan, _, extra = route(sig)
    engine = opts.get("engine")
    total = plan.ensure(plan.pick_default() if engine is None else int(engine))
    io_size = 4 if sig.io_dtype == "float32" else 2
    if in_types[0].dtype != sig.io_dtype:  # every operand and the output are cast
        total += io_size * sum(math.prod(d) for d in sig.dims)
    if extra is not None:  # the explicitly padded image operand
        total += io_size * math.prod(plan.sig.dims[-1 if sig.kind == "dgrad" else 0])
    return total


def _fprop(ctx, op, x, w, b=None):
    """cuDNN ``conv_fprop`` (+ bias in the same graph when the third input is given)."""
    o = ctx.options
    return conv2d(ctx.xp, x, w, b, **op.params(), precision=o.get("precision"), engine=o.get("engine"))


def _dgrad(ctx, op, gy, w):
    """cuDNN ``conv_dgrad``: dL/dx."""
    o = ctx.options
    return conv2d_backward_data(ctx.xp, gy, w, **op.params(), precision=o.get("precision"),
                                engine=o.get("engine"))


def _wgrad(ctx, op, x, gy):
    """cuDNN ``conv_wgrad``: dL/dw."""
    o = ctx.options
    return conv2d_backward_filter(ctx.xp, x, gy, **op.params(), precision=o.get("precision"),
                                  engine=o.get("engine"))


def _fused(ctx, op, x, w, b):
    """cuDNN ``conv_fprop -> bias -> relu`` as one graph (:func:`.cudnn.conv2d_bias_relu`)."""
    o = ctx.options
    return conv2d_bias_relu(ctx.xp, x, w, b, stride=op.stride, padding=op.padding,
                            dilation=op.dilation, groups=op.groups,
                            precision=o.get("precision"), engine=o.get("engine"))


def register_fused_rule(op_type) -> None:
    """Register the ``cudnn`` rule of a fused conv + bias + ReLU op type: inputs
    ``(x, w, b)``, fields ``stride, padding, dilation, groups`` (canonical forms)."""
    _FUSED.add(op_type)
    register(Rule(op_type, "cudnn", _fused, devices={"cuda"}, check=check, variants=variants,
                  workspace=workspace, tags={"cudnn", "gpu", "fused", "option:precision"},
                  fresh_output=True))


def register_rules() -> None:
    """Register the three ``cudnn`` rules (idempotent). Every output is a new
    array (``fresh_output``: cuDNN writes into one of ours, at most cropped or
    viewed as another dtype), so the memory pass may run a later step in place
    on it."""
    for op_type, kernel in ((Conv2d, _fprop), (Conv2dBackwardData, _dgrad),
                            (Conv2dBackwardFilter, _wgrad)):
        register(Rule(op_type, "cudnn", kernel, devices={"cuda"}, check=check,
                      variants=variants, workspace=workspace,
                      tags={"cudnn", "gpu", "fused", "option:precision"}, fresh_output=True))


register_rules()
register_fused_rule(Conv2dBiasRelu)  # the fuse pass's conv + bias + ReLU node

__all__ = ["KIND", "check", "variants", "workspace", "register_rules", "register_fused_rule"]
