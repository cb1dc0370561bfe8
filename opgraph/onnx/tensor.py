"""ONNX converters of the tensor operators: element-wise arithmetic with
broadcasting, the mean reduction, casts, shape manipulation and constants.

Where every input is an import-time constant that is not a trainable
initializer, the node is evaluated here with NumPy (constant folding) and
no graph node is added: the shape arithmetic exporters write
(``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``, and ShuffleNet's
channel shuffle with ``Div`` and ``Cast`` of its shape) folds into a
constant target shape. ``Shape`` and ``Gather`` are supported for that use
only (``Gather`` on computed data is an error); ``Cast`` of a computed tensor
only to its own dtype.

Semantics follow the ONNX operator spec: ``Add``/``Mul``/``Div``/``Sum``
broadcast multidirectionally (NumPy rule; ``Sum`` version 6 needs equal
shapes; integer ``Div`` truncates toward zero);
``Reshape`` reads ``0`` as "copy this dimension" unless ``allowzero=1`` and
``-1`` as "infer"; ``Flatten`` always returns 2-D
``(prod(shape[:axis]), prod(shape[axis:]))``; ``Unsqueeze``/``Squeeze`` take
``axes`` as an attribute before version 13 and as an input from 13 on.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from ..ops import Concat, Div, Flatten, Mean, Mul, Reshape, Transpose
from ..types import DTYPES, numpy_dtype
from .context import Declared, Static
from .registry import converter

ALL_VERSIONS = {1, 13, 14, 16, 19, 21, 23, 24, 25}


def _ints(ctx, v, what) -> list[int]:
    arr = np.asarray(v)
    if arr.ndim > 1 or arr.dtype.kind not in "iu":
        raise ctx.error(f"{what} must be a 1-D integer tensor, got {arr.dtype}{list(arr.shape)}")
    return [int(i) for i in arr.reshape(-1)]


@converter("Add", {7, 13, 14})
def add(ctx):
    if ctx.foldable():
        return ctx.static(0) + ctx.static(1)
    return ctx.add(ctx.input(0), ctx.input(1))


@converter("Mul", {7, 13, 14})
def mul(ctx):
    if ctx.foldable():
        return ctx.static(0) * ctx.static(1)
    return ctx.apply(Mul, {}, [ctx.input(0), ctx.input(1)])


def _divide(ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX ``Div`` of import-time values: true division of floats (IEEE), and
    of integers with truncation toward zero (C semantics, as onnxruntime)."""
    if a.dtype != b.dtype:
        raise ctx.error(f"operands have different dtypes {a.dtype} and {b.dtype}")
    if a.dtype.kind not in "iu":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(a, b).astype(a.dtype)
    if (b == 0).any():
        raise ctx.error("integer division by zero")
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q).astype(a.dtype)


@converter("Div", {7, 13, 14})
def div(ctx):
    """``a / b`` with multidirectional broadcasting (``Div`` op)."""
    if ctx.foldable():
        return _divide(ctx, ctx.static(0), ctx.static(1))
    return ctx.apply(Div, {}, [ctx.input(0), ctx.input(1)])


@converter("Sum", {6, 8, 13})
def sum_(ctx):
    """Variadic sum, folded left to right into ``Add`` / ``BroadcastAdd``."""
    n = ctx.n_inputs
    shapes = [ctx.shape(i) for i in range(n)]
    if ctx.version == 6 and len(set(shapes)) > 1:
        raise ctx.error(f"Sum version 6 does not broadcast, got shapes {shapes}")
    if ctx.foldable():
        return sum(ctx.static(i) for i in range(n))
    if n == 1:
        return ctx.passthrough(0)
    acc = ctx.input(0)
    for i in range(1, n):
        acc = ctx.add(acc, ctx.input(i), None if i == n - 1 else f"partial{i}")
    return acc


@converter("Concat", {4, 11, 13})
def concat(ctx):
    axis = ctx.attr("axis")
    if axis is None:
        raise ctx.error("attribute axis is required")
    rank = len(ctx.shape(0))
    if not -rank <= axis < rank:
        raise ctx.error(f"attribute axis={axis} is out of range for {rank}-D inputs")
    if ctx.foldable():
        return np.concatenate([ctx.static(i) for i in range(ctx.n_inputs)], axis=axis)
    return ctx.apply(Concat, {"axis": axis % rank}, [ctx.input(i) for i in range(ctx.n_inputs)])


def _reshape_target(ctx, in_shape, shape, allowzero) -> tuple[int, ...]:
    if allowzero and 0 in shape and -1 in shape:
        raise ctx.error(f"shape {shape} has both 0 and -1 with allowzero=1 (invalid per the spec)")
    out = []
    for i, s in enumerate(shape):
        if s == 0 and not allowzero:
            if i >= len(in_shape):
                raise ctx.error(f"shape {shape}: 0 at axis {i} copies a dimension the "
                                f"{len(in_shape)}-D input does not have")
            out.append(in_shape[i])
        elif s < -1:
            raise ctx.error(f"shape {shape}: entry {s} is invalid")
        else:
            out.append(s)
    if out.count(-1) > 1:
        raise ctx.error(f"shape {shape} has more than one -1")
    total = math.prod(in_shape)
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or total % known:
            raise ctx.error(f"shape {shape}: -1 cannot be inferred for an input of shape {in_shape}")
        out[out.index(-1)] = total // known
    if math.prod(out) != total:
        raise ctx.error(f"shape {shape} (resolved {tuple(out)}) does not hold the {total} "
                        f"elements of the input {in_shape}")
    return tuple(out)


@converter("Reshape", {5, 13, 14, 19, 21, 23, 24, 25})
def reshape(ctx):
    shape = _ints(ctx, ctx.require_static(1, "shape"), "shape")
    allowzero = int(ctx.attr("allowzero", 0))
    in_shape = ctx.shape(0)
    imp = ctx.imp
    if (imp.batch_from is not None and not ctx.foldable(0) and shape and in_shape
            and shape[0] == imp.batch_from and in_shape[0] == imp.batch):
        shape[0] = imp.batch  # the exporter baked the batch-1 export's batch into the shape
    target = _reshape_target(ctx, in_shape, shape, allowzero)
    if ctx.foldable(0):
        return ctx.static(0).reshape(target)
    return ctx.apply(Reshape, {"shape": target}, [ctx.input(0)])


@converter("Flatten", {1, 9, 11, 13, 21, 23, 24, 25})
def flatten(ctx):
    in_shape = ctx.shape(0)
    rank = len(in_shape)
    axis = int(ctx.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise ctx.error(f"attribute axis={axis} is out of range for a {rank}-D input")
    axis = axis + rank if axis < 0 else axis
    target = (math.prod(in_shape[:axis]), math.prod(in_shape[axis:]))
    if ctx.foldable(0):
        return ctx.static(0).reshape(target)
    if axis == 1 and rank >= 2:
        return ctx.apply(Flatten, {"start_dim": 1}, [ctx.input(0)])
    return ctx.apply(Reshape, {"shape": target}, [ctx.input(0)])


@converter("Transpose", {1, 13, 21, 23, 24, 25})
def transpose(ctx):
    rank = len(ctx.shape(0))
    perm = ctx.attr("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"attribute perm={perm} is not a permutation of the {rank} axes")
    if ctx.foldable(0):
        return np.transpose(ctx.static(0), perm)
    if perm == list(range(rank)):
        return ctx.passthrough(0)
    return ctx.apply(Transpose, {"perm": perm}, [ctx.input(0)])


def _axes(ctx, optional: bool):
    """``axes`` from the attribute (version < 13) or from input 1 (13 and later)."""
    if ctx.version < 13:
        axes = ctx.attr("axes")
    elif ctx.has_input(1):
        axes = ctx.require_static(1, "axes")
    else:
        axes = None
    if axes is None:
        if not optional:
            raise ctx.error("axes are required")
        return None
    return _ints(ctx, axes, "axes")


def _reshaped(ctx, target):
    if ctx.foldable(0):
        return ctx.static(0).reshape(target)
    return ctx.apply(Reshape, {"shape": target}, [ctx.input(0)])


@converter("Unsqueeze", {1, 11, 13, 21, 23, 24, 25})
def unsqueeze(ctx):
    in_shape = ctx.shape(0)
    axes = _axes(ctx, optional=False)
    rank = len(in_shape) + len(axes)
    norm = sorted(a + rank if a < 0 else a for a in axes)
    if len(set(norm)) != len(norm) or any(not 0 <= a < rank for a in norm):
        raise ctx.error(f"axes {axes} are repeated or out of range for a {rank}-D output")
    out = list(in_shape)
    for a in norm:
        out.insert(a, 1)
    return _reshaped(ctx, tuple(out))


@converter("Squeeze", {1, 11, 13, 21, 23, 24, 25})
def squeeze(ctx):
    in_shape = ctx.shape(0)
    rank = len(in_shape)
    axes = _axes(ctx, optional=True)
    if axes is None:
        drop = {i for i, d in enumerate(in_shape) if d == 1}
    else:
        if any(not -rank <= a < rank for a in axes):
            raise ctx.error(f"axes {axes} are out of range for a {rank}-D input")
        drop = {a % rank for a in axes}
        bad = [a for a in sorted(drop) if in_shape[a] != 1]
        if bad:
            raise ctx.error(f"axes {bad} of the input {in_shape} do not have size 1")
    return _reshaped(ctx, tuple(d for i, d in enumerate(in_shape) if i not in drop))


@converter("Identity", ALL_VERSIONS)
def identity(ctx):
    """No node. An Identity of a parameter (a trainable initializer or a declared
    parameter input) names it anew: one source per name (the package docstring)."""
    item = ctx.passthrough(0)
    if isinstance(item, Declared) or (isinstance(item, Static) and item.trainable):
        return attrs.evolve(item, name=ctx.node.output[0])
    return item


@converter("Constant", {1, 9, 11, 12, 13, 19, 21, 23, 24, 25})
def constant(ctx):
    """``value`` (a tensor) or ``value_float(s)`` / ``value_int(s)``; strings and sparse unsupported."""
    for name in ("sparse_value", "value_string", "value_strings"):
        if ctx.has_attr(name):
            raise ctx.error(f"attribute {name} is not supported (numeric dense constants only)")
    kinds = {"value": None, "value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}
    given = [k for k in kinds if ctx.has_attr(k)]
    if len(given) != 1:
        raise ctx.error(f"exactly one value attribute is required, got {given or 'none'}")
    return np.asarray(ctx.attr(given[0]), dtype=kinds[given[0]])


@converter("ConstantOfShape", {9, 20, 21, 23, 24, 25})
def constant_of_shape(ctx):
    shape = _ints(ctx, ctx.require_static(0, "shape"), "shape")
    if any(d < 0 for d in shape):
        raise ctx.error(f"shape {shape} has a negative dimension")
    value = ctx.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise ctx.error(f"attribute value must hold one element, got shape {value.shape}")
    return np.full(shape, value.reshape(()), dtype=value.dtype)


@converter("Shape", {1, 13, 15, 19, 21, 23, 24, 25})
def shape(ctx):
    """The input's (static) shape as int64, sliced by ``start``/``end`` (version 15)."""
    start, end = ctx.attr("start", 0), ctx.attr("end")
    return np.asarray(ctx.shape(0)[start:end], dtype=np.int64)


@converter("Gather", {1, 11, 13})
def gather(ctx):
    """``numpy.take(data, indices, axis)`` of import-time constants only."""
    axis = int(ctx.attr("axis", 0))
    if not ctx.foldable():
        raise ctx.error("Gather is supported only on constant inputs (shape arithmetic)")
    data, indices = ctx.static(0), ctx.static(1)
    if not -data.ndim <= axis < data.ndim:
        raise ctx.error(f"attribute axis={axis} is out of range for {data.ndim}-D data")
    n = data.shape[axis]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise ctx.error(f"indices {indices.tolist()} are out of range for an axis of size {n}")
    return np.take(data, indices, axis=axis)


#: Cast targets: opgraph's dtypes, and the integer and bool types shape arithmetic uses.
CAST_TARGETS = (*DTYPES, "int8", "int16", "int32", "uint8", "uint16", "uint32", "uint64", "bool")


@converter("Cast", {6, 9, 13, 19, 21, 23, 24, 25})
def cast(ctx):
    """Cast to ``to``: import-time values are converted (NumPy ``astype``; float
    to int truncates toward zero); a parameter gets the new dtype; a computed
    tensor only to its own storage dtype (opgraph has no cast op). ``saturate``
    and ``round_mode`` only affect float8 targets, which are refused."""
    to = ctx.attr("to")
    ctx.attr("saturate")
    ctx.attr("round_mode")
    if to is None:
        raise ctx.error("attribute to is required")
    try:
        target = np.dtype(ctx.imp.onnx.helper.tensor_dtype_to_np_dtype(int(to))).name
    except (KeyError, TypeError, ValueError):
        target = f"ONNX element type {to}"
    if target not in CAST_TARGETS:
        raise ctx.error(f"attribute to={to} ({target}) is not supported; targets: {', '.join(CAST_TARGETS)}")
    item = ctx.passthrough(0)
    if ctx.foldable(0):
        return item.value.astype(numpy_dtype(target) if target in DTYPES else target)
    storage = ctx.imp.storage(target)
    if isinstance(item, Static):  # a trainable initializer stays a parameter, converted
        return attrs.evolve(item, value=item.value.astype(numpy_dtype(storage)))
    if isinstance(item, Declared):
        return attrs.evolve(item, dtype=storage)
    if item.dtype != storage:
        raise ctx.error(f"casting a computed {item.dtype} tensor to {target} is not supported (opgraph has "
                        "no cast op); only import-time values and casts to the tensor's own dtype")
    return item


@converter("ReduceMean", {1, 11, 13, 18})
def reduce_mean(ctx):
    """Mean over ``axes`` (all axes when absent or empty, unless
    ``noop_with_empty_axes=1`` (18): then the identity); ``keepdims`` default 1.
    ``axes`` is an attribute before version 18, an optional input from 18."""
    keep = bool(ctx.attr("keepdims", 1))
    if ctx.version >= 18:
        noop = bool(ctx.attr("noop_with_empty_axes", 0))
        axes = _ints(ctx, ctx.require_static(1, "axes"), "axes") if ctx.has_input(1) else []
    else:
        noop, axes = False, [int(a) for a in ctx.attr("axes", [])]
    rank = len(ctx.shape(0))
    if not axes and noop:
        return ctx.passthrough(0)
    if any(not -rank <= a < rank for a in axes):
        raise ctx.error(f"axes {axes} are out of range for a {rank}-D input")
    norm = sorted({a % rank for a in axes}) if axes else list(range(rank))
    if len(norm) != len(axes) and axes:
        raise ctx.error(f"axes {axes} repeat an axis")
    if ctx.foldable(0):
        v = ctx.static(0)
        return np.mean(v, axis=tuple(norm), keepdims=keep).astype(v.dtype)
    return ctx.apply(Mean, dict(axes=norm, keepdim=keep), [ctx.input(0)])


__all__ = ["add", "mul", "div", "sum_", "concat", "reshape", "flatten", "transpose", "unsqueeze",
           "squeeze", "identity", "constant", "constant_of_shape", "shape", "gather", "cast", "reduce_mean"]
