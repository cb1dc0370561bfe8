"""Lowering rules of every convolution algorithm, registered in one place.

An algorithm is three plain functions, one per direction, written against an
array module ``xp`` and a node's :class:`~opgraph.backends.reference.conv.ConvGeometry`::

    forward(xp, x, w, g, **options) -> y
    backward_data(xp, gy, w, g, **options) -> gx
    backward_filter(xp, x, gy, g, **options) -> gw

:func:`register_conv_algorithm` turns them into registry ``Rule``\\ s for every
op of the convolution family (``ops.of_family('conv')``), by the op's
direction. Each kernel builds the node's geometry once, from the op's
canonical fields and the node's shapes (``reference.conv.node_geometry``: the
output shape is ``ctx.out_shape``, never recomputed), and calls the function
with it plus ``**ctx.options`` (the implementation's own choices, e.g. a
Winograd ``tile``), then applies the node's epilogue in place on the fresh
output (``reference.conv_epilogue.apply_epilogue`` of ``epilogue_steps``:
``Conv2d``'s bias; the fused forward ops' bias, residual add and ReLU /
ReLU6; backward-data's ReLU gradient). float16 and bfloat16 arrays are
computed in float32 and the result cast back once (SEMANTICS.md: half
storage accumulates in fp32), after the epilogue. The forward kernels take
``out=`` (``Rule.writes_strided_out``: a producer of a zero-copy concat
gets its slice of the concat's buffer): the result, epilogue applied, is
stored into it through its strides (one more pass over the output on the
CPU, where the GEMM result is a temporary; the copy the concat no longer makes).

Registered at import (the names are the policy's algorithm names):

============  ===================================================  ===============================
algorithm     functions                                            declines
============  ===================================================  ===============================
direct        :mod:`opgraph.backends.reference.conv` (the oracle)  nothing
reference     same functions as ``direct``                         nothing
gemm          :mod:`.gemm` (im2col + GEMM)                         a GEMM dim >= 2^31
fft           :mod:`.fft` (real FFTs)                              a transform plane >= 2^31
fft-chunked   the same, a few channels at a time (``chunks``)      as fft; split spectra < 2 GiB
winograd      :mod:`.winograd` (F(2x2|4x4, 3x3))                   not 3x3, stride/dilation != 1
============  ===================================================  ===============================

``docs/algorithms.md`` describes each algorithm's trade-offs.
"""

from __future__ import annotations

import functools

import numpy as np

from opgraph.op import DIRECTION_NAMES
from opgraph import ops
from opgraph.buffer_views import copy_into
from opgraph.ops.conv_fused import epilogue_steps
from opgraph.types import HALF_DTYPES

from . import fft, gemm, winograd
from ..reference import conv as direct
from ..reference.conv_epilogue import apply_epilogue
from ..registry import Rule, register

#: the op's direction (``Op.direction``) -> the algorithm function's name (and
#: the ``direction`` argument of its ``check``, ``variants``, ``workspace``).
DIRECTIONS = DIRECTION_NAMES  # one map, declared beside Op.direction


def _widened(arrays):
    """``(arrays, half)``: float16/bfloat16 arrays as float32, and the first
    such dtype (the one the result is cast back to), or None when none is."""
    half = [a.dtype for a in arrays if a.dtype.name in HALF_DTYPES]
    if not half:
        return arrays, None
    return [a.astype(np.float32) for a in arrays], half[0]


def _geometry(direction, ctx, op, a, b, rest):
    """The node's geometry: a forward op's from x, w and the node's output
    shape (``ctx.out_shape``), a backward op's from the shapes it was typed
    with (``reference.conv.geometry_of``)."""
    if direction == "forward":
        return direct.node_geometry(op, a.shape, b.shape, ctx.out_shape(op, a, b, *rest))
    return direct.geometry_of(direction, op, (a, b))


def _kernel(name, fn, direction):
    """The kernel of an op of ``direction``: ``fn`` on the node's geometry,
    then the node's epilogue (``Conv2d``'s bias; a fused forward op's bias,
    residual add and activation; backward-data's ReLU gradient) in place on
    the fresh output, before the one rounding of a half-precision result."""

    def kernel(ctx, op, a, b, *rest, out=None):
        g = _geometry(direction, ctx, op, a, b, rest)
        (a, b, *rest), half = _widened((a, b, *rest))
        y = fn(ctx.xp, a, b, g, **dict(ctx.options))
        y = apply_epilogue(ctx.xp, epilogue_steps(op, 2 + len(rest)), y, rest)
        y = y if half is None else y.astype(half)
        if out is None:
            return y
        copy_into(out, y)  # a strided view of the output's type (module docstring)
        return out

    suffix = "" if direction == "forward" else f"_{direction}"
    kernel.__name__ = kernel.__qualname__ = f"{name}_conv2d{suffix}"
    kernel.__doc__ = f"``{name}``: conv2d {direction} and the node's epilogue. " + (fn.__doc__ or "")
    return kernel


def register_conv_algorithm(name, forward, backward_data, backward_filter, *, check, devices,
                            variants=None, workspace=None, tags=(), fresh_output=True, capturable=None,
                            capture_requires=None) -> dict[type, Rule]:
    """Register ``name`` as a lowering of every op of the convolution family.

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
        tags: policy tags (include/exclude) of every rule (a fused op's rule
            also gets ``fused``, from ``Op.fused``).
        fresh_output: the functions return a new array, never a view of an
            input (``Rule.fresh_output``: the memory pass may then let an
            element-wise step overwrite it); a convolution computes a new
            array, so True unless a function says otherwise.
        capturable, capture_requires: ``Rule.capturable`` and
            ``Rule.capture_requires`` of every rule (whether the functions on
            CuPy can be captured into a CUDA graph; default: not declared).

    Returns:
        The registered rules, by op type. Registering a name again replaces its rules.
    """
    fns = {"forward": forward, "backward_data": backward_data, "backward_filter": backward_filter}
    rules = {}
    for op_type in ops.of_family("conv"):
        direction = DIRECTIONS[op_type.direction]
        kernel = _kernel(name, fns[direction], direction)
        fields = dict(devices=devices, check=functools.partial(check, direction),
                      tags=frozenset(tags) | {"conv", name}, fresh_output=fresh_output,
                      capturable=capturable, writes_strided_out=direction == "forward")
        if capture_requires is not None:
            fields["capture_requires"] = capture_requires
        if variants is not None:
            fields["variants"] = functools.partial(variants, direction)
        if workspace is not None:
            fields["workspace"] = functools.partial(workspace, direction)
        rules[op_type] = register(Rule(op_type, name, kernel, **fields))
    return rules


def _accept_all(direction, op, in_types, device):
    """The direct convolution runs every valid node."""
    return None


ALL_DEVICES = ("cpu", "cuda")

for _name in ("direct", "reference"):
    register_conv_algorithm(_name, direct.forward, direct.backward_data, direct.backward_filter,
                            check=_accept_all, devices=ALL_DEVICES, tags=("reference", "direct"))

# gemm's products on CuPy go through our own cuBLAS handle (products.matmul); on the H200
# (2026-12-02) its 1x1 forward and backward-filter steps once made a host-to-device copy while
# capturing (now gemm_pointwise's path: captured, tests/gpu/test_capture_gpu.py), so it is not
# declared and a replay's trial capture decides per step. FFT's products run on the same
# handle, but its transforms are CuPy's cuFFT plans from CuPy's plan cache (16 plans by
# default): ResNet-50 needs more, so capturing a run of FFT steps creates and destroys
# plans while the stream captures, and on the H200 (2026-12-02) ending that capture crashed
# the process (a segmentation fault in cudaStreamEndCapture, after every step had passed its
# trial capture alone). A captured graph must also never outlive the plans its kernels came
# from, which an evicting cache cannot promise: FFT steps run eagerly between the graphs.
register_conv_algorithm("gemm", gemm.forward, gemm.backward_data, gemm.backward_filter,
                        check=gemm.check, devices=ALL_DEVICES, workspace=gemm.workspace,
                        tags=("gemm", "im2col"))

register_conv_algorithm("fft", fft.forward, fft.backward_data, fft.backward_filter, check=fft.check,
                        devices=ALL_DEVICES, workspace=fft.workspace, tags=("fft", "fast"),
                        capturable="cuFFT plans come from CuPy's evicting plan cache: a capture "
                                   "would create and destroy plans, and its graph outlive them")

# the same functions a few channels at a time (fft.py's docstring), a rule of its own so that
# only the nodes it applies to (weight and result spectra >= fft.CHUNKED_FROM) have a new
# candidate set in their autotune cache key
register_conv_algorithm("fft-chunked", fft.forward, fft.backward_data, fft.backward_filter,
                        check=fft.check_chunked, devices=ALL_DEVICES, variants=fft.chunk_variants,
                        workspace=fft.workspace, tags=("fft", "fast"),
                        capturable="cuFFT plans come from CuPy's evicting plan cache: a capture "
                                   "would create and destroy plans, and its graph outlive them")

register_conv_algorithm("winograd", winograd.forward, winograd.backward_data, winograd.backward_filter,
                        check=winograd.check, devices=ALL_DEVICES, variants=winograd.variants,
                        workspace=winograd.workspace, tags=("winograd", "fast"),
                        capturable="Winograd's transforms and products run on CuPy's cuBLAS handle "
                                   "(tensordot, matmul), which refuses stream capture")

__all__ = ["register_conv_algorithm", "DIRECTIONS"]
