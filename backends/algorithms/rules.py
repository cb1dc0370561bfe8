"""Lowering rules of every convolution algorithm, registered in one place.

An algorithm is three plain functions, one per direction, written against an
array module ``xp``::

    forward(xp, x, w, *, stride, padding, dilation, groups, **options) -> y
    backward_data(xp, gy, w, *, stride, padding, dilation, groups, input_shape, **options) -> gx
    backward_filter(xp, x, gy, *, stride, padding, dilation, groups, weight_shape, **options) -> gw

:func:`register_conv_algorithm` turns them into three registry ``Rule``\\ s for
``Conv2d``, ``Conv2dBackwardData`` and ``Conv2dBackwardFilter``. Each kernel calls
the function with ``**op.params()`` (the op's fields are exactly these keyword
names) plus ``**ctx.options`` (the implementation's own choices, e.g. a Winograd
``tile``), and, for ``Conv2d`` with a third input, adds the bias
(``y += b.reshape(1, -1, 1, 1)``). float16 and bfloat16 arrays are computed in float32 and
the result cast back (SEMANTICS.md: half storage accumulates in fp32).

Registered at import (the names are the policy's algorithm names):

===========  ===================================================  ===========================
algorithm    functions                                            declines
===========  ===================================================  ===========================
direct       :mod:`opgraph.backends.reference.conv` (the oracle)  nothing
reference    same functions as ``direct``                         nothing
gemm         :mod:`.gemm` (im2col + GEMM)                         a GEMM dim >= 2^31
fft          :mod:`.fft` (real FFTs)                              a transform plane >= 2^31
winograd     :mod:`.winograd` (F(2x2|4x4, 3x3))                   not 3x3, stride/dilation != 1
===========  ===================================================  ===========================

``docs/algorithms.md`` describes each algorithm's trade-offs.
"""

from __future__ import annotations

import functools

import numpy as np

from opgraph.ops.conv import Conv2d, Conv2dBackwardData, Conv2dBackwardFilter, Conv2dBiasRelu
from opgraph.types import HALF_DTYPES

from . import fft, gemm, winograd
from ..reference import conv as direct
from ..registry import Rule, register

#: direction name -> abstract op type.
OP_TYPES = {
    "forward": Conv2d,
    "backward_data": Conv2dBackwardData,
    "backward_filter": Conv2dBackwardFilter,
}


def _half_safe(fn):
    """Run ``fn`` in float32 when any array is float16 or bfloat16, casting the
    result back to the first such array's dtype."""

    @functools.wraps(fn)
    def run(xp, *arrays, **kwargs):
        half = [a.dtype for a in arrays if a.dtype.name in HALF_DTYPES]
        if not half:
            return fn(xp, *arrays, **kwargs)
        out = fn(xp, *[a.astype(np.float32) for a in arrays], **kwargs)
        return out.astype(half[0])

    return run


def _forward_kernel(name, fn):
    def conv_bias(xp, x, w, *bias, **kwargs):
        y = fn(xp, x, w, **kwargs)
        if bias:
            y += bias[0].reshape(1, -1, 1, 1).astype(y.dtype, copy=False)
        return y

    # the bias is added before the one rounding of a half-precision result
    run = _half_safe(conv_bias)

    def kernel(ctx, op, x, w, b=None):
        return run(ctx.xp, x, w, *(() if b is None else (b,)), **op.params(), **dict(ctx.options))

    kernel.__name__ = kernel.__qualname__ = f"{name}_conv2d"
    kernel.__doc__ = f"``{name}``: y = conv(x, w) (+ b over channels). " + (fn.__doc__ or "")
    return kernel


def _backward_kernel(name, fn, what):
    fn = _half_safe(fn)

    def kernel(ctx, op, a, b):
        return fn(ctx.xp, a, b, **op.params(), **dict(ctx.options))

    kernel.__name__ = kernel.__qualname__ = f"{name}_conv2d_{what}"
    kernel.__doc__ = f"``{name}``: conv2d {what}. " + (fn.__doc__ or "")
    return kernel


def register_conv_algorithm(name, forward, backward_data, backward_filter, *, check, devices,
                            variants=None, workspace=None, tags=(), fresh_output=True) -> dict[str, Rule]:
    """Register ``name`` as a lowering of the three convolution ops.

    Args:
        name: algorithm name used by policies and reports (``'gemm'``, ...).
        forward, backward_data, backward_filter: the direction functions (module
            docstring gives their signatures); options from ``ctx.options`` are
            passed as extra keyword arguments.
        check: ``check(direction, op, in_types, device) -> str | None``, the reason
            the algorithm declines a node (``None`` if it applies); ``direction``
            is ``'forward'``, ``'backward_data'`` or ``'backward_filter'``.
        devices: device names the functions run on (``{'cpu', 'cuda'}``).
        variants: optional ``variants(direction, op, in_types, device) -> list[dict]``
            of option sets for the autotuner; default a single ``{}``.
        workspace: optional ``workspace(direction, op, in_types, options) -> int``
            scratch bytes of one call; default 0.
        tags: policy tags (include/exclude) of all three rules.
        fresh_output: the functions return a new array, never a view of an
            input (``Rule.fresh_output``: the memory pass may then let an
            element-wise step overwrite it); a convolution computes a new
            array, so True unless a function says otherwise.

    Returns:
        The three registered rules, by direction. Registering a name again
        replaces its rules.
    """
    fns = {"forward": forward, "backward_data": backward_data, "backward_filter": backward_filter}
    rules = {}
    for direction, op_type in OP_TYPES.items():
        if direction == "forward":
            kernel = _forward_kernel(name, fns[direction])
        else:
            kernel = _backward_kernel(name, fns[direction], direction[len("backward_"):])
        fields = dict(devices=devices, check=functools.partial(check, direction),
                      tags=frozenset(tags) | {"conv", name}, fresh_output=fresh_output)
        if variants is not None:
            fields["variants"] = functools.partial(variants, direction)
        if workspace is not None:
            fields["workspace"] = functools.partial(workspace, direction)
        rules[direction] = register(Rule(op_type, name, kernel, **fields))
        if direction == "forward":  # the fuse pass's conv + bias + ReLU, same kernel
            rules["fused"] = register(Rule(Conv2dBiasRelu, name, _fused_kernel(kernel), **fields))
    return rules


def _fused_kernel(forward):
    """``relu(forward(...))`` applied in place on the fresh convolution output
    (``maximum`` propagates NaN, SEMANTICS.md)."""

    def kernel(ctx, op, x, w, b):
        y = forward(ctx, op, x, w, b)
        return ctx.xp.maximum(y, 0, out=y)

    kernel.__name__ = kernel.__qualname__ = forward.__name__ + "_relu"
    return kernel


def _accept_all(direction, op, in_types, device):
    """The direct convolution runs every valid node."""
    return None


ALL_DEVICES = ("cpu", "cuda")

for _name in ("direct", "reference"):
    register_conv_algorithm(_name, direct.conv2d_forward, direct.conv2d_backward_data,
                            direct.conv2d_backward_filter, check=_accept_all, devices=ALL_DEVICES,
                            tags=("reference", "direct"))

register_conv_algorithm("gemm", gemm.conv2d_forward, gemm.conv2d_backward_data,
                        gemm.conv2d_backward_filter, check=gemm.check, devices=ALL_DEVICES,
                        workspace=gemm.workspace, tags=("gemm", "im2col"))

register_conv_algorithm("fft", fft.conv2d_forward, fft.conv2d_backward_data,
                        fft.conv2d_backward_filter, check=fft.check, devices=ALL_DEVICES,
                        workspace=fft.workspace, tags=("fft", "fast"))

register_conv_algorithm("winograd", winograd.conv2d_forward, winograd.conv2d_backward_data,
                        winograd.conv2d_backward_filter, check=winograd.check, devices=ALL_DEVICES,
                        variants=winograd.variants, workspace=winograd.workspace,
                        tags=("winograd", "fast"))

__all__ = ["register_conv_algorithm", "OP_TYPES"]
