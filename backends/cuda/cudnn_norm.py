"""Training batch normalisation by cuDNN, on CuPy arrays (graphs: :mod:`.cudnn_norm_graph`).

Semantics as ``torch.nn.functional.batch_norm(training=True)`` (SEMANTICS.md,
"BatchNorm, training form"; Ioffe & Szegedy 2015, Algorithm 1 and section 3):
statistics of channel c over every axis but 1 (``n`` values), the biased
variance in ``y = (x - mean) / sqrt(var + eps) * weight + bias``, the
running statistics ``(1 - momentum) * running + momentum * s`` with s the
mean or the unbiased variance.

Three functions, one cuDNN graph each:

* :func:`batch_norm_training_forward`: cuDNN's whole forward (statistics,
  y and the running statistics in one graph);
* :func:`batch_norm_normalize`: y from statistics computed elsewhere (the
  ``(2, C)`` mean / biased-variance array of a ``BatchNormStats`` node),
  through cuDNN's inference normalisation with ``inv_variance = 1 / sqrt(var + eps)``;
* :func:`batch_norm_backward`: dx (through the statistics), dweight, dbias.

Arrays: x (and gy) are ``(N, C, ...)``, float32, float16 or bfloat16
(bfloat16 as ``ml_dtypes.bfloat16`` arrays, passed to cuDNN as their bits,
``storage.bits``); a 4-D array is NCHW when C-contiguous, NHWC when it is
the ``(0, 3, 1, 2)`` view of a C-contiguous NHWC buffer, and any other
rank is made C-contiguous and seen as ``(N, C, prod(rest), 1)``. Outputs
of x's shape come back in x's dtype and layout. Statistics are float32;
weight, bias and running statistics are taken in any float dtype and
returned in their own. An empty batch (n = 0) calls no cuDNN.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from opgraph.errors import ShapeError
from opgraph.types import is_channels_last, storage_order

from . import cudnn_graph as cg
from . import cudnn_norm_graph as ng
from .storage import BF16, bits, dense_strides, dtype_name, empty_in_layout, like, unbits


class Geometry(NamedTuple):
    """How x is handed to cuDNN: its 4-D dims and element strides, and whether
    it is channels-last."""

    dims: tuple
    strides: tuple
    channels_last: bool


def geometry(shape, channels_last: bool) -> Geometry:
    """The 4-D view cuDNN gets of an ``(N, C, ...)`` tensor (module docstring).

    Raises:
        ShapeError: fewer than 2 axes, or channels-last for a rank other than 4.
    """
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2:
        raise ShapeError(f"cuDNN batch norm: x must be (N, C, ...), got shape {shape}")
    if channels_last and len(shape) != 4:
        raise ShapeError(f"cuDNN batch norm: channels-last needs a 4-D x, got shape {shape}")
    n, c = shape[:2]
    if len(shape) == 4:
        h, w = shape[2:]
    else:
        h, w = math.prod(shape[2:]), 1
    return Geometry((n, c, h, w), dense_strides((n, c, h, w), channels_last), channels_last)


def _io_dtype(*arrays) -> str:
    names = {dtype_name(a.dtype) for a in arrays}
    if len(names) != 1 or not names <= set(ng.IO_DTYPES):
        raise ShapeError(f"cuDNN batch norm takes x (and gy) of one dtype among {ng.IO_DTYPES}, "
                         f"got {sorted(names)}")
    return names.pop()


def _operand(xp, a, geo: Geometry):
    """``a`` (x's logical shape) as cuDNN reads it: bfloat16 as its bits (CuPy
    copies uint16 arrays, not bfloat16 ones), in x's layout."""
    a = bits(xp, a)
    if geo.channels_last:
        return a if is_channels_last(a) else xp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return xp.ascontiguousarray(a)


def _empty_like_x(xp, shape, geo: Geometry, dtype: str):
    """A new array of x's logical ``shape`` in x's layout: ``(storage, result)``,
    the first in cuDNN's bits form (uint16 for bfloat16), the second a view
    in ``dtype``."""
    buf = empty_in_layout(xp, shape, xp.uint16 if dtype == BF16 else dtype, geo.channels_last)
    return buf, unbits(buf, dtype)


def _shaped(a, shape):
    """``a`` (cuDNN's 4-D view) with x's logical ``shape`` (a view; 4-D unchanged)."""
    return a if a.ndim == len(shape) else a.reshape(shape)


def _vector(xp, v, c: int, fill: float):
    """A contiguous float32 (C,) copy or view of ``v`` (``fill`` where None)."""
    if v is None:
        return xp.full((c,), fill, dtype=xp.float32)
    if tuple(v.shape) != (c,):
        raise ShapeError(f"cuDNN batch norm: a per-channel vector must have shape ({c},), got {v.shape}")
    return xp.ascontiguousarray(like(xp, v, "float32"))


def _back(xp, v32, dtype):
    """A float32 (C,) result in ``dtype`` (bfloat16 through its bits)."""
    return unbits(like(xp, v32, dtype), dtype)


def _scalar(value: float):
    """A host float32 ``(1, 1, 1, 1)`` for a pass-by-value operand (kept alive by the caller)."""
    return np.full((1, 1, 1, 1), value, dtype=np.float32)


def _saved(xp, stats, c: int, eps: float):
    """``(mean, inv_std)``, contiguous float32 (C,), of a (2, C) statistics array
    (float32 as ``BatchNormStats`` makes it; a ``compile(dtype=...)`` run may
    hold it in the storage dtype): ``inv_std = 1 / sqrt(var + eps)``.

    Raises:
        ShapeError: stats is not (2, C).
    """
    if tuple(stats.shape) != (2, c):
        raise ShapeError(f"cuDNN batch norm: stats must be (2, {c}) (mean and biased variance), "
                         f"got {tuple(stats.shape)}")
    s32 = like(xp, stats, "float32")
    inv_std = xp.float32(1.0) / xp.sqrt(s32[1] + xp.float32(eps))
    return xp.ascontiguousarray(s32[0]), xp.ascontiguousarray(inv_std)


def _run(xp, kind: str, geo: Geometry, io: str, ptrs, engine=None) -> None:
    sig = ng.NormSignature(kind, geo.dims, geo.strides, io, xp.cuda.runtime.getDevice())
    plan = ng.plan_for(sig)
    index = plan.default if engine is None else int(engine)
    scratch = cg.workspace(plan.ensure(index), sig.device)
    plan.execute(ptrs, index, cg.pointer(scratch))


def _setup(x, gy=None):
    """``(io dtype, geometry, n)`` of x (and gy, which must match it)."""
    io = _io_dtype(x) if gy is None else _io_dtype(x, gy)
    if gy is not None and tuple(gy.shape) != tuple(x.shape):
        raise ShapeError(f"cuDNN batch norm: gradient shape {gy.shape} != x shape {x.shape}")
    geo = geometry(x.shape, storage_order(x) == "NHWC")
    return io, geo, geo.dims[0] * geo.dims[2] * geo.dims[3]


class TrainingForward(NamedTuple):
    """:func:`batch_norm_training_forward`'s results: y (x's shape, dtype and
    layout), the batch mean and ``inv_std = 1 / sqrt(var + eps)`` (float32 (C,)),
    and the new running mean and variance (the running statistics' dtype)."""

    y: object
    mean: object
    inv_std: object
    running_mean: object
    running_var: object


def batch_norm_training_forward(xp, x, weight=None, bias=None, running_mean=None, running_var=None, *,
                                eps: float = 1e-5, momentum: float = 0.1, engine=None) -> TrainingForward:
    """cuDNN's training forward (``batchnorm``): statistics, y and the running update in one graph.

    Args:
        x: (N, C, ...) float32/float16/bfloat16, NCHW or NHWC.
        weight, bias: (C,) or None (1 and 0).
        running_mean, running_var: (C,) or None (0 and 1, returned updated).
        eps: >= 0; momentum: in [0, 1]. engine: a cuDNN plan index (default:
            the first that builds, in heuristic order).

    Returns:
        :class:`TrainingForward`.

    Raises:
        ShapeError: a bad dtype or shape, or one value per channel (n = 1:
            the unbiased variance divides by n - 1). LoweringError: cuDNN
            cannot run it (its reason), or the frontend is missing.
    """
    io, geo, n = _setup(x)
    if n == 1:
        raise ShapeError(f"Expected more than 1 value per channel when training, got input shape {x.shape}")
    c = geo.dims[1]
    rm, rv = _vector(xp, running_mean, c, 0.0), _vector(xp, running_var, c, 1.0)
    rm_dtype = "float32" if running_mean is None else dtype_name(running_mean.dtype)
    rv_dtype = "float32" if running_var is None else dtype_name(running_var.dtype)
    mean, inv_std = xp.zeros((c,), xp.float32), xp.zeros((c,), xp.float32)
    if n == 0:  # PyTorch: an empty output, running statistics unchanged
        y = _shaped(_empty_like_x(xp, geo.dims, geo, io)[1], x.shape)
        return TrainingForward(y, mean, inv_std, _back(xp, rm.copy(), rm_dtype), _back(xp, rv.copy(), rv_dtype))
    xs = _operand(xp, x, geo)
    w, b = _vector(xp, weight, c, 1.0), _vector(xp, bias, c, 0.0)
    new_rm, new_rv = xp.empty_like(rm), xp.empty_like(rv)
    out, y = _empty_like_x(xp, geo.dims, geo, io)
    host = (_scalar(eps), _scalar(momentum))  # alive until the launch returned
    ptrs = [xs.data.ptr, w.data.ptr, b.data.ptr, rm.data.ptr, rv.data.ptr, host[0].ctypes.data,
            host[1].ctypes.data, out.data.ptr, mean.data.ptr, inv_std.data.ptr, new_rm.data.ptr, new_rv.data.ptr]
    _run(xp, "bn_train", geo, io, ptrs, engine)
    return TrainingForward(_shaped(y, x.shape), mean, inv_std, _back(xp, new_rm, rm_dtype),
                           _back(xp, new_rv, rv_dtype))


def batch_norm_normalize(xp, x, stats, weight=None, bias=None, *, eps: float = 1e-5, engine=None):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` by cuDNN (``batchnorm_inference``)
    with given batch statistics: the ``BatchNormTraining`` op.

    Args:
        x: (N, C, ...) as :func:`batch_norm_training_forward`.
        stats: (2, C): the mean, then the biased variance (``BatchNormStats``),
            float32 (or another float dtype, converted).
        weight, bias: (C,) or None (1 and 0). eps: >= 0. engine: as above.

    Returns:
        y: x's shape, dtype and layout.

    Raises:
        ShapeError, LoweringError: as :func:`batch_norm_training_forward`.
    """
    io, geo, n = _setup(x)
    c = geo.dims[1]
    mean, inv_std = _saved(xp, stats, c, eps)
    out, y = _empty_like_x(xp, geo.dims, geo, io)
    if n == 0:
        return _shaped(y, x.shape)
    xs = _operand(xp, x, geo)
    w, b = _vector(xp, weight, c, 1.0), _vector(xp, bias, c, 0.0)
    _run(xp, "bn_normalize", geo, io,
         [xs.data.ptr, mean.data.ptr, inv_std.data.ptr, w.data.ptr, b.data.ptr, out.data.ptr], engine)
    return _shaped(y, x.shape)


def batch_norm_backward(xp, gy, x, stats, weight=None, *, eps: float = 1e-5, engine=None):
    """The training backward by cuDNN (``batchnorm_backward``), through the statistics.

    ``dx = weight * rstd * (gy - <gy> - xhat * <gy xhat>)`` (channel means),
    ``dweight = sum(gy * xhat)``, ``dbias = sum(gy)``; ``rstd = 1 / sqrt(var + eps)``,
    ``xhat = (x - mean) * rstd`` from ``stats``.

    Args:
        gy, x: (N, C, ...), one dtype (as :func:`batch_norm_training_forward`);
            gy is read in x's layout (converted when it differs).
        stats: (2, C), mean and biased variance of x (as :func:`batch_norm_normalize`).
            weight: (C,) or None.

    Returns:
        ``(dx, dweight, dbias)``: dx in x's shape, dtype and layout; the two
        (C,) sums in x's dtype.

    Raises:
        ShapeError, LoweringError: as :func:`batch_norm_training_forward`.
    """
    io, geo, n = _setup(x, gy)
    c = geo.dims[1]
    mean, inv_std = _saved(xp, stats, c, eps)
    out, dx = _empty_like_x(xp, geo.dims, geo, io)
    dw, db = xp.zeros((c,), xp.float32), xp.zeros((c,), xp.float32)
    if n > 0:
        xs, gs = _operand(xp, x, geo), _operand(xp, gy, geo)
        w = _vector(xp, weight, c, 1.0)
        _run(xp, "bn_backward", geo, io, [gs.data.ptr, xs.data.ptr, w.data.ptr, mean.data.ptr,
                                         inv_std.data.ptr, out.data.ptr, dw.data.ptr, db.data.ptr], engine)
    return _shaped(dx, x.shape), _back(xp, dw, io), _back(xp, db, io)


def plan_of(kind: str, shape, dtype: str, channels_last: bool, device: int = 0) -> ng.NormPlan:
    """The cached plan of graph ``kind`` for an x of ``shape``/``dtype``/layout
    (for the rules' check, variants and workspace; builds it on first use).

    Raises:
        ShapeError: as :func:`geometry`. LoweringError: as :func:`.cudnn_norm_graph.plan_for`.
    """
    geo = geometry(shape, channels_last)
    return ng.plan_for(ng.NormSignature(kind, geo.dims, geo.strides, dtype, device))


__all__ = ["Geometry", "geometry", "TrainingForward", "batch_norm_training_forward", "batch_norm_normalize",
           "batch_norm_backward", "plan_of"]
