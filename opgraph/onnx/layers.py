"""ONNX converters of the layer operators: convolution, pooling, LRN, batch
and layer norm, Gemm / MatMul, ReLU, softmax, dropout.

Each converter reads every attribute of its node (``ctx.attr``) and maps it
onto canonical op parameters, following the ONNX operator spec
(https://onnx.ai/onnx/operators/):

* ``pads`` is ``[x1_begin, x2_begin, x1_end, x2_end]``, so for NCHW
  ``[top, left, bottom, right]`` -> ``((top, bottom), (left, right))``;
* ``auto_pad``: ``SAME_UPPER`` / ``SAME_LOWER`` give ``out = ceil(in / s)``
  with ``total = max((out - 1) * s + (k - 1) * d + 1 - in, 0)``, the odd pixel
  at the end (UPPER) or the beginning (LOWER); ``VALID`` is no padding;
  ``NOTSET`` uses ``pads``. ``pads`` together with another ``auto_pad`` is
  rejected (the spec forbids using both);
* only 2-D convolution and pooling (4-D NCHW tensors) are supported.
"""

from __future__ import annotations

import math

import numpy as np

from ..ops import (AvgPool2d, BatchNorm, Conv2d, GlobalAvgPool2d, LayerNorm, Linear, LocalResponseNorm,
                   LogSoftmax, MatMul, MaxPool2d, Mul, Relu, Reshape, Softmax)
from ..ops.broadcast import broadcast_shapes
from .registry import converter


def _pair(ctx, name: str, default=(1, 1)) -> tuple[int, int]:
    v = ctx.attr(name)
    if v is None:
        return tuple(default)
    if len(v) != 2:
        raise ctx.error(f"attribute {name}={list(v)}: only two spatial axes (2-D, NCHW) are supported")
    return (int(v[0]), int(v[1]))


def _require_4d(ctx, x, what="input"):
    if len(x.shape) != 4:
        raise ctx.error(f"{what} has shape {x.shape}: only 4-D NCHW tensors (2-D {ctx.op_type}) "
                        "are supported")


def _padding(ctx, in_hw, kernel, stride, dilation):
    """Canonical ``((top, bottom), (left, right))`` from ``pads`` and ``auto_pad``."""
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    pads = ctx.attr("pads")
    if auto_pad == "NOTSET":
        pads = [0, 0, 0, 0] if pads is None else [int(p) for p in pads]
        if len(pads) != 4:
            raise ctx.error(f"attribute pads={pads}: only two spatial axes (4 entries) are supported")
        if min(pads) < 0:
            raise ctx.error(f"attribute pads={pads}: negative padding is not supported")
        return ((pads[0], pads[2]), (pads[1], pads[3]))
    if pads is not None:
        raise ctx.error(f"attributes pads={list(pads)} and auto_pad={auto_pad} are both given; "
                        "the ONNX spec allows only one of them")
    if auto_pad == "VALID":
        return ((0, 0), (0, 0))
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"attribute auto_pad={auto_pad!r} is not one of NOTSET, SAME_UPPER, "
                        "SAME_LOWER, VALID")
    out = []
    for n, k, s, d in zip(in_hw, kernel, stride, dilation):
        total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        out.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    return tuple(out)


@converter("Conv", {1, 11, 22})
def conv(ctx):
    """Conv: X (N, C, H, W), W (M, C/group, kH, kW), optional B (M,)."""
    x, w = ctx.input(0), ctx.input(1)
    _require_4d(ctx, x)
    _require_4d(ctx, w, "weight")
    kernel = ctx.attr("kernel_shape")
    if kernel is not None and tuple(kernel) != tuple(w.shape[2:]):
        raise ctx.error(f"attribute kernel_shape={list(kernel)} differs from the weight's "
                        f"spatial shape {w.shape[2:]}")
    stride, dilation = _pair(ctx, "strides"), _pair(ctx, "dilations")
    padding = _padding(ctx, x.shape[2:], w.shape[2:], stride, dilation)
    params = dict(stride=stride, padding=padding, dilation=dilation, groups=int(ctx.attr("group", 1)))
    bias = [ctx.input(2)] if ctx.has_input(2) else []
    return ctx.apply(Conv2d, params, [x, w, *bias])


def _pool(ctx, cls, **extra):
    x = ctx.input(0)
    _require_4d(ctx, x)
    kernel = ctx.attr("kernel_shape")
    if kernel is None:
        raise ctx.error("attribute kernel_shape is required")
    if len(kernel) != 2:
        raise ctx.error(f"attribute kernel_shape={list(kernel)}: only 2-D pooling is supported")
    kernel = (int(kernel[0]), int(kernel[1]))
    dilations = ctx.attr("dilations")
    if dilations is not None and any(int(d) != 1 for d in dilations):
        raise ctx.error(f"attribute dilations={list(dilations)}: dilated pooling is not supported")
    stride = _pair(ctx, "strides")
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    if ceil_mode and ctx.attr("auto_pad", "NOTSET") != "NOTSET":
        raise ctx.error(f"ceil_mode=1 with auto_pad={ctx.attr('auto_pad')} is not supported "
                        "(the spec sizes auto_pad outputs without ceil_mode)")
    padding = _padding(ctx, x.shape[2:], kernel, stride, (1, 1))
    return ctx.apply(cls, dict(kernel_size=kernel, stride=stride, padding=padding,
                               ceil_mode=ceil_mode, **extra), [x])


@converter("MaxPool", {1, 8, 10, 11, 12, 22})
def max_pool(ctx):
    """MaxPool (output Indices unsupported, so storage_order must be 0)."""
    order = ctx.attr("storage_order", 0)
    if order != 0:
        raise ctx.error(f"attribute storage_order={order} is not supported (only 0, row major)")
    return _pool(ctx, MaxPool2d)


@converter("AveragePool", {1, 7, 10, 11, 19, 22})
def average_pool(ctx):
    """AveragePool; count_include_pad defaults to 0 as in the spec."""
    return _pool(ctx, AvgPool2d, count_include_pad=bool(ctx.attr("count_include_pad", 0)))


@converter("GlobalAveragePool", {1, 22})
def global_average_pool(ctx):
    x = ctx.input(0)
    _require_4d(ctx, x)
    return ctx.apply(GlobalAvgPool2d, {}, [x])


@converter("LRN", {1, 13})
def lrn(ctx):
    """LRN: ``x / (bias + alpha/size * sum_window x^2)^beta``, the window
    ``c - floor((size-1)/2) .. c + ceil((size-1)/2)`` (ONNX = our op's rule)."""
    size = ctx.attr("size")
    if size is None:
        raise ctx.error("attribute size is required")
    params = dict(size=int(size), alpha=float(ctx.attr("alpha", 1e-4)),
                  beta=float(ctx.attr("beta", 0.75)), k=float(ctx.attr("bias", 1.0)))
    return ctx.apply(LocalResponseNorm, params, [ctx.input(0)])


@converter("BatchNormalization", {7, 9, 14, 15})
def batch_normalization(ctx):
    """Inference form; the running mean and var enter as buffers (``Graph.buffer``:
    fed by name, never trained), with the file's values as their defaults."""
    ctx.attr("momentum")  # only used to update running statistics in training
    if ctx.version == 7 and ctx.attr("spatial", 1) != 1:
        raise ctx.error("attribute spatial=0 (per-activation statistics) is not supported")
    if ctx.attr("training_mode", 0) != 0:
        raise ctx.error("attribute training_mode=1 is not supported (inference form only)")
    if ctx.version < 14 and sum(bool(o) for o in ctx.node.output) > 1:
        # before version 14 the number of outputs selects the mode: several = training
        raise ctx.error(f"{len(ctx.node.output)} outputs select training mode in version "
                        f"{ctx.version}; only the inference form (one output) is supported")
    x = ctx.input(0)
    dt = x.dtype
    ins = [x, ctx.input(1, dtype=dt), ctx.input(2, dtype=dt),
           ctx.input(3, role="buffer", dtype=dt), ctx.input(4, role="buffer", dtype=dt)]
    return ctx.apply(BatchNorm, {"eps": float(ctx.attr("epsilon", 1e-5))}, ins)


def _without_leading_ones(shape) -> tuple:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


@converter("LayerNormalization", {17})
def layer_normalization(ctx):
    """``(x - mean) / sqrt(var + epsilon) * Scale + B`` over axes ``axis ..`` (default
    -1; biased variance), one ``LayerNorm``. Scale and B must have the normalized
    shape (leading 1s allowed); ``stash_type`` must be 1 (statistics in float32:
    opgraph's are float32 for float32 and half-precision inputs, float64 for float64);
    the Mean and InvStdDev outputs may not be used."""
    x = ctx.input(0)
    rank = len(x.shape)
    axis = int(ctx.attr("axis", -1))
    if not -rank <= axis < rank:
        raise ctx.error(f"attribute axis={axis} is out of range for a {rank}-D input")
    stash = int(ctx.attr("stash_type", 1))
    if stash != 1:
        raise ctx.error(f"attribute stash_type={stash} is not supported (only 1, float32 statistics)")
    normalized = tuple(x.shape[axis % rank:])
    affine = []
    for i, what in ((1, "Scale"), (2, "B")):
        if not ctx.has_input(i):
            continue
        v = ctx.input(i, dtype=x.dtype)
        if v.shape != normalized:
            if _without_leading_ones(v.shape) != _without_leading_ones(normalized):
                raise ctx.error(f"{what} of shape {v.shape} is not the normalized shape {normalized}")
            v = ctx.apply(Reshape, {"shape": normalized}, [v], what.lower())
        affine.append(v)
    if len(affine) == 1 and ctx.has_input(2):
        raise ctx.error("input Scale is required")
    params = dict(normalized_shape=normalized, eps=float(ctx.attr("epsilon", 1e-5)))
    return ctx.apply(LayerNorm, params, [x, *affine])


@converter("Relu", {6, 13, 14})
def relu(ctx):
    return ctx.apply(Relu, {}, [ctx.input(0)])


@converter("Gemm", {7, 9, 11, 13})
def gemm(ctx):
    """``alpha * op(A) @ op(B) + beta * C``, C broadcast to (M, N).

    The fully connected form (alpha 1, transB 1, no transA, C absent or beta
    1 with shape (N,)) becomes one ``Linear``; any other becomes ``MatMul``
    then ``Mul`` by alpha and an add of ``beta * C``.
    """
    a, b = ctx.input(0), ctx.input(1)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not math.isfinite(value):  # a NaN scale would turn every output into NaN silently
            raise ctx.error(f"attribute {name}={value}: must be a finite number")
    ta, tb = bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0))
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ctx.error(f"A {a.shape} and B {b.shape} must be 2-D")
    m, n = a.shape[1 if ta else 0], b.shape[0 if tb else 1]
    c_shape = ctx.shape(2) if ctx.has_input(2) else None
    if c_shape is not None and broadcast_shapes(c_shape, (m, n)) != (m, n):
        raise ctx.error(f"C of shape {c_shape} does not broadcast to the product's shape {(m, n)}")
    if alpha == 1.0 and not ta and tb and (c_shape is None or (beta == 1.0 and c_shape == (n,))):
        return ctx.apply(Linear, {}, [a, b] + ([ctx.input(2)] if c_shape is not None else []))
    last_is_mm = alpha == 1.0 and c_shape is None
    y = ctx.apply(MatMul, dict(transpose_a=ta, transpose_b=tb), [a, b], None if last_is_mm else "matmul")
    if alpha != 1.0:
        scale = ctx.constant(np.asarray(alpha, dtype=a.dtype), "alpha")
        y = ctx.apply(Mul, {}, [y, scale], None if c_shape is None else "scaled")
    if c_shape is not None:
        c = ctx.input(2)
        if beta != 1.0:
            c = ctx.apply(Mul, {}, [c, ctx.constant(np.asarray(beta, dtype=c.dtype), "beta")], "beta_c")
        y = ctx.add(y, c)
    return y


@converter("MatMul", {1, 9, 13})
def matmul(ctx):
    """``numpy.matmul`` for 2-D @ 2-D, and N-D @ 2-D (leading axes folded into rows)."""
    a, b = ctx.input(0), ctx.input(1)
    if len(b.shape) != 2 or len(a.shape) < 2:
        raise ctx.error(f"operand shapes {a.shape} @ {b.shape}: only 2-D @ 2-D and N-D @ 2-D "
                        "are supported")
    if a.shape[-1] != b.shape[0]:
        raise ctx.error(f"inner dimensions differ: {a.shape} @ {b.shape}")
    if len(a.shape) == 2:
        return ctx.apply(MatMul, {}, [a, b])
    rows = math.prod(a.shape[:-1])
    flat = ctx.apply(Reshape, {"shape": (rows, a.shape[-1])}, [a], "rows")
    y = ctx.apply(MatMul, {}, [flat, b], "matmul")
    return ctx.apply(Reshape, {"shape": (*a.shape[:-1], b.shape[1])}, [y])


def _softmax(ctx, cls):
    x = ctx.input(0)
    rank = len(x.shape)
    axis = int(ctx.attr("axis", -1 if ctx.version >= 13 else 1))
    if not -rank <= axis < rank:
        raise ctx.error(f"attribute axis={axis} is out of range for a {rank}-D input")
    axis %= rank
    if ctx.version >= 13 or math.prod(x.shape[axis + 1:]) == 1:
        return ctx.apply(cls, {"axis": axis}, [x])
    # Opsets < 13 coerce the input to 2-D, (prod(shape[:axis]), prod(shape[axis:])),
    # and normalise each row: a softmax over all axes from `axis` on.
    flat = ctx.apply(Reshape, {"shape": (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))},
                     [x], "coerce_2d")
    y = ctx.apply(cls, {"axis": 1}, [flat], "rows")
    return ctx.apply(Reshape, {"shape": x.shape}, [y])


@converter("Softmax", {1, 11, 13})
def softmax(ctx):
    return _softmax(ctx, Softmax)


@converter("LogSoftmax", {1, 11, 13})
def log_softmax(ctx):
    return _softmax(ctx, LogSoftmax)


@converter("Dropout", {7, 10, 12, 13, 22})
def dropout(ctx):
    """Inference: the identity (no node). ``training_mode`` must be a constant false."""
    ctx.attr("ratio")  # opsets < 12; only acts in training
    ctx.attr("seed")
    if ctx.has_input(2):
        mode = ctx.static(2)
        if mode is None:
            raise ctx.error("input training_mode is computed; only a constant false is supported")
        if bool(np.asarray(mode).reshape(-1)[0]):
            raise ctx.error("training_mode=true is not supported (the importer builds inference graphs)")
    return ctx.passthrough(0)


__all__ = ["conv", "max_pool", "average_pool", "global_average_pool", "lrn", "batch_normalization",
           "layer_normalization", "relu", "gemm", "matmul", "softmax", "log_softmax", "dropout"]
