"""Registry rules of the ``cudnn`` algorithm (device ``cuda``) for the convolution ops.

One rule per op of the convolution family: the three convolutions, and
the fused ops of ``opgraph/ops/conv_fused.py`` (the forward with its
epilogue, backward-data with its ReLU gradient; their graphs carry the
epilogue as pointwise ops, :mod:`.cudnn_graph`). Each rule's

* ``kernel`` calls :mod:`.cudnn` with the op's fields, the node's output
  shape (``ctx.out_shape``) and the node's options ``precision`` (always
  given: the rules are tagged ``option:precision``) and ``engine``;
* ``check`` declines a dtype cuDNN graphs do not take here (float64), a
  strided backward-data with its ReLU gradient (:data:`STRIDED_DGRAD_RELU`),
  a missing frontend or CuPy, and, on a machine with a GPU, any convolution
  cuDNN rejects in every form (the reason is cuDNN's own message);
* ``variants`` lists one ``{'engine': i}`` per cuDNN plan that builds, in
  heuristic order (the first is the default choice), for ``precision`` (the
  storage's own without one, :data:`opgraph.precision.DEFAULT_PRECISION`);
* ``workspace`` is the plan's cuDNN workspace plus the scratch arrays of the
  call (precision casts).

Every rule is tagged ``symmetric_padding_only``: the legalize pass makes the
asymmetric excess of a node's padding an explicit ``Pad`` node first
(:mod:`.cudnn`'s docstring says why). The tag ``fused`` is not declared
here: ``backends.registry.Rule`` adds it to the rules of fused op types
(``Op.fused``) only, so excluding ``fused`` keeps the plain convolutions on
cuDNN.

Shapes and layouts come from the ``TensorType``\\ s: ``layout == 'NHWC'`` on
the first input means channels-last operands, as the kernel will see them.
"""

from __future__ import annotations

import math

from opgraph import ops
from opgraph.errors import LoweringError
from opgraph.ops.conv_fused import EPILOGUE_STEPS, epilogue_steps
from opgraph.precision import DEFAULT_PRECISION

from ..device import cuda_status
from ..registry import Rule, register
from .cudnn import conv2d, conv2d_backward_data, conv2d_backward_filter, route, signature
from .cudnn_graph import epilogue_name

#: the op's direction (``Op.direction``) -> the cuDNN operation.
KIND = {"fwd": "fprop", "dgrad": "dgrad", "wgrad": "wgrad"}
_DTYPES = ("float32", "float16", "bfloat16")
TAGS = frozenset({"cudnn", "gpu", "option:precision", "variants:engine_limit", "symmetric_padding_only"})


#: Why a strided ``Conv2dBackwardDataRelu`` is declined, so the ``dgrad-relu``
#: rule leaves the pair unfused: on the H200 with cuDNN 9.19 the best engine of
#: the fused ``conv_dgrad -> relu_backward`` graph of a stride-2 3 x 3
#: convolution took 20x the time of the same convolution's forward
#: (ResNet-50 bf16, batch 128: layer2.0.conv2 1.07 ms against 0.05 ms,
#: layer3.0.conv2 0.58 ms, layer4.0.conv2 0.32 ms; the stride-1 fused ones
#: run at the forward's speed; docs/performance.md, ninth session).
STRIDED_DGRAD_RELU = ("cuDNN's fused backward-data + ReLU-gradient engines of a strided convolution are "
                      "10-20x slower than the unfused backward-data (H200, cuDNN 9.19)")


def static_reason(op, in_types) -> str | None:
    """Why cuDNN is not used for ``op`` whatever the machine, or None."""
    dtypes = sorted({t.dtype for t in in_types})
    if any(d not in _DTYPES for d in dtypes):
        return f"cuDNN convolution takes {', '.join(_DTYPES)}; got {', '.join(dtypes)}"
    if any(t.layout not in (None, "NCHW", "NHWC") for t in in_types if t.ndim == 4):
        return "cuDNN lowering takes NCHW or NHWC layouts"
    if isinstance(op, ops.Conv2dBackwardDataRelu) and any(s > 1 for s in op.stride):
        return f"stride {tuple(op.stride)}: {STRIDED_DGRAD_RELU}"
    return None


def _options(options) -> dict:
    return dict(options or {})


def _signature(op, in_types, precision=None, device: int = 0):
    """The signature the kernel will build for ``op`` on inputs ``in_types``
    (the output shape is the op's own inference, as the node's); None for an
    empty batch (no cuDNN call)."""
    first = in_types[0]
    precision = precision or DEFAULT_PRECISION[first.dtype]
    out = op.infer(*in_types).shape
    steps = epilogue_steps(op, len(in_types))
    readers = [step for step in steps if EPILOGUE_STEPS[step]]  # the steps reading inputs 2, 3, ...
    # the bias as (1, K, 1, 1); a residual or the ReLU output of dgrad as given
    extra = [(1, out[1], 1, 1) if step == "bias" else t.shape for step, t in zip(readers, in_types[2:])]
    shapes = [first.shape, in_types[1].shape, *extra, out]
    if out[0] == 0 or first.shape[0] == 0:
        return None
    return signature(KIND[op.direction], epilogue_name(steps), shapes, precision, op.padding, op.stride,
                     op.dilation, first.layout == "NHWC", device)


def _device() -> int:
    import cupy
    return cupy.cuda.runtime.getDevice()


def environment_reason() -> str | None:
    """Why no cuDNN rule can run on this machine (no GPU, no ``nvidia-cudnn-frontend``), or None."""
    ok, why = cuda_status()
    if not ok:
        return f"no GPU: {why}"
    try:
        import cudnn  # noqa: F401
    except Exception as exc:
        return f"the cuDNN frontend cannot be imported ({exc}); pip install nvidia-cudnn-frontend"
    return None


def check(op, in_types, device):
    """None if cuDNN can run ``op`` on ``in_types``, else why not (:func:`static_reason` first)."""
    why = static_reason(op, in_types) or environment_reason()
    if why is not None:
        return why
    try:
        sig = _signature(op, in_types, device=_device())
        if sig is not None:
            route(sig)
    except LoweringError as exc:
        return str(exc)
    return None


def variants(op, in_types, device, precision=None, limit=None):
    """``[{'engine': i}, ...]``: the cuDNN plans that build, heuristic order
    first; every one, or the first ``limit`` (``policy.engine_limit``)."""
    sig = _signature(op, in_types, precision, _device())
    if sig is None:
        return [{}]
    return [{"engine": i} for i in route(sig)[0].engines(limit)]  # ascending = heuristic order


def workspace(op, in_types, options) -> int:
    """Scratch bytes of one call: cuDNN workspace of the engine, plus the cast
    copies of the operands."""
    opts = _options(options)
    sig = _signature(op, in_types, opts.get("precision"), _device())
    if sig is None:
        return 0
    plan, _ = route(sig)
    engine = opts.get("engine")
    total = plan.ensure(plan.pick_default() if engine is None else int(engine))
    if in_types[0].dtype != sig.io_dtype:  # every operand and the output are cast
        total += (4 if sig.io_dtype == "float32" else 2) * sum(math.prod(d) for d in sig.dims)
    return total


def _fprop(ctx, op, x, w, *b, out=None):
    """cuDNN ``conv_fprop`` (+ bias in the same graph when the third input is
    given), into ``out`` when given (a strided view: ``writes_strided_out``)."""
    o = ctx.options
    return conv2d(ctx.xp, x, w, *b, **op.params(), out_shape=ctx.out_shape(op, x, w, *b),
                  precision=o["precision"], engine=o.get("engine"), out=out)


def _dgrad(ctx, op, gy, w, *relu_output):
    """cuDNN ``conv_dgrad``: dL/dx (``-> relu_backward`` in the same graph for
    ``Conv2dBackwardDataRelu``, whose third input is the ReLU's output)."""
    o = ctx.options
    return conv2d_backward_data(ctx.xp, gy, w, **op.conv_params(), input_shape=op.input_shape,
                                relu_output=relu_output[0] if relu_output else None,
                                precision=o["precision"], engine=o.get("engine"))


def _wgrad(ctx, op, x, gy):
    """cuDNN ``conv_wgrad``: dL/dw."""
    o = ctx.options
    return conv2d_backward_filter(ctx.xp, x, gy, **op.params(), precision=o["precision"],
                                  engine=o.get("engine"))


def _fused(ctx, op, x, w, b, *r, out=None):
    """cuDNN ``conv_fprop -> bias [-> add] [-> relu]`` as one graph (the fused
    forward ops: ``Conv2dBiasRelu``, ``Conv2dBiasActivation``), into ``out``
    when given."""
    o = ctx.options
    return conv2d(ctx.xp, x, w, b, *r, **op.conv_params(), out_shape=ctx.out_shape(op, x, w, b, *r),
                  activation=op.activation, precision=o["precision"], engine=o.get("engine"), out=out)


def register_rules() -> None:
    """Register the ``cudnn`` rules of the convolution family (idempotent),
    found by direction (``ops.of_family('conv', ...)``); a fused forward op
    gets the fused kernel, backward-data with ReLU the dgrad one (its third
    input the mask). Every output is a new array (``fresh_output``: cuDNN
    writes into one of ours, at most viewed as another dtype), so the memory
    pass may run a later step in place on it); the forward ones write into a
    strided ``out=`` view of an NHWC output (``writes_strided_out``:
    :mod:`.cudnn`'s docstring): into an fp32 NCHW channel slice, GoogLeNet's
    forward convolutions summed 28.3 ms on the H200 against 10.9 dense (the
    strided graph's engines are not the dense graph's the autotuner timed),
    so there the zero-copy plan copies the dense result into the slice.
    Capturable: plans and their workspaces are built on a node's first
    (uncaptured) run and reused."""
    kernels = {"fwd": _fprop, "dgrad": _dgrad, "wgrad": _wgrad}
    for op_type in ops.of_family("conv"):
        kernel = _fused if op_type.fused and op_type.direction == "fwd" else kernels[op_type.direction]
        register(Rule(op_type, "cudnn", kernel, devices={"cuda"}, check=check, variants=variants,
                      workspace=workspace, tags=TAGS, fresh_output=True, capturable=True,
                      writes_strided_out=frozenset({"NHWC"}) if op_type.direction == "fwd" else False))


register_rules()

__all__ = ["KIND", "TAGS", "STRIDED_DGRAD_RELU", "static_reason", "environment_reason", "check", "variants", "workspace",
           "register_rules"]
