"""Builders of broadcasting arithmetic, means, channel splits and axis permutations
(the pieces of squeeze-and-excitation blocks and channel shuffles), named and
shaped like ``torch`` / ``torch.nn.functional``.

Every builder adds abstract nodes to the graph of its inputs and returns
their output ``Value`` (``split``: a list). ``dim`` arguments may be negative
(counted from the end) and are resolved here, once, against the input's
rank; an out-of-range ``dim`` raises ``ParameterError`` naming the node,
the parameter and the value. Re-exported by ``opgraph.builders`` and ``opgraph``.
"""

from __future__ import annotations

from numbers import Integral
from typing import Sequence

from . import ops
from .errors import ParameterError
from .graph import Value, graph_of


def _int(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _dim(node: str, param: str, dim, ndim: int) -> int:
    """``dim`` in ``0..ndim-1`` (negative counts from the end)."""
    if not _int(dim) or not -ndim <= dim < ndim:
        raise ParameterError(param, dim, f"must be an int in [{-ndim}, {ndim - 1}] for a "
                                         f"{ndim}-D input", node)
    return int(dim) % ndim


def mul(input: Value, other: Value, *, name: str | None = None) -> Value:
    """``input * other`` with NumPy broadcasting (``torch.mul``, ONNX ``Mul``).

    Shapes broadcast right-aligned (an extent 1 stretches): the
    squeeze-and-excitation scale is (N, C, H, W) * (N, C, 1, 1). Both
    operands are graph values of one dtype (a constant is a ``Constant`` node).

    Raises:
        ShapeError: shapes that do not broadcast, or mixed dtypes.
    """
    return graph_of(input, other).apply(ops.Mul, {}, [input, other], name)


def div(input: Value, other: Value, *, rounding_mode: str | None = None,
        name: str | None = None) -> Value:
    """``input / other`` with NumPy broadcasting (``torch.div``, ONNX ``Div``).

    Floating operands: true division (IEEE: ``x / 0`` is +-inf), ``rounding_mode``
    None. int64 operands: truncation toward zero, which ``rounding_mode='trunc'``
    must state (PyTorch's default would return floats; ONNX ``Div`` truncates).

    Raises:
        ParameterError: ``rounding_mode`` other than None (floats) or 'trunc' (int64).
        ShapeError: shapes that do not broadcast, or mixed dtypes.
    """
    want = "trunc" if input.dtype == "int64" else None
    if rounding_mode != want:
        raise ParameterError("rounding_mode", rounding_mode,
                             f"must be {want!r} for {input.dtype} operands (integers divide with "
                             f"truncation, floats exactly)", name or "div")
    return graph_of(input, other).apply(ops.Div, {}, [input, other], name)


def neg(input: Value, *, name: str | None = None) -> Value:
    """``-input`` (``torch.neg``, ONNX ``Neg``)."""
    return input.graph.apply(ops.Neg, {}, [input], name)


def mean(input: Value, dim=None, keepdim: bool = False, *, name: str | None = None) -> Value:
    """Mean over ``dim`` (``torch.mean``; ONNX ``ReduceMean``): an int, a sequence
    of ints, or None / ``()`` for every axis. With ``keepdim`` the reduced axes
    stay with extent 1. float16/bfloat16 accumulate in float32.

    Raises:
        ParameterError: an out-of-range or repeated dim.
        ShapeError: a reduced axis of extent 0 (the mean of nothing).
    """
    ndim = input.type.ndim
    dims = () if dim is None else (dim,) if _int(dim) else tuple(dim)
    axes = tuple(_dim(name or "mean", "dim", d, ndim) for d in dims) or tuple(range(ndim))
    return input.graph.apply(ops.Mean, dict(axes=axes, keepdim=keepdim), [input], name)


def adaptive_avg_pool2d(input: Value, output_size, *, name: str | None = None) -> Value:
    """``torch.nn.functional.adaptive_avg_pool2d`` for output sizes that tile the input.

    ``output_size`` is an int or ``(oh, ow)``; None keeps the input extent.
    1 (or (1, 1)) is global average pooling (``GlobalAvgPool2d``, ONNX
    ``GlobalAveragePool``: torchvision's ResNet/MobileNet/EfficientNet heads).
    Otherwise each output size must divide the input size: the adaptive
    windows are then exactly ``avg_pool2d(kernel = stride = in / out)``.

    Raises:
        ParameterError: an output size that does not divide the input size
            (adaptive windows of unequal size are not implemented), or < 1.
        ShapeError: input not 4-D.
    """
    node = name or "adaptive_avg_pool2d"
    if input.type.ndim != 4:
        raise ParameterError("input", input.shape, "must be 4-D (N, C, H, W)", node)
    sizes = (output_size, output_size) if output_size is None or _int(output_size) else tuple(output_size)
    if len(sizes) != 2:
        raise ParameterError("output_size", output_size, "must be an int or a pair", node)
    hw = input.shape[2:]
    out = tuple(h if s is None else s for s, h in zip(sizes, hw))
    if not all(_int(s) and s >= 1 for s in out):
        raise ParameterError("output_size", output_size, "entries must be ints >= 1 (or None)", node)
    if out == (1, 1):
        return input.graph.apply(ops.GlobalAvgPool2d, {}, [input], name)
    if any(h % s for h, s in zip(hw, out)):
        raise ParameterError("output_size", output_size,
                             f"must divide the input size {tuple(hw)} (adaptive windows of unequal "
                             f"size are not implemented; output_size 1 is global pooling)", node)
    kernel = tuple(h // s for h, s in zip(hw, out))
    return input.graph.apply(ops.AvgPool2d, dict(kernel_size=kernel, stride=kernel), [input], name)


def narrow(input: Value, dim: int, start: int, length: int, *, name: str | None = None) -> Value:
    """``input`` restricted to ``start .. start + length - 1`` along ``dim`` (``torch.narrow``;
    a negative ``start`` counts from the end of the axis, as there).

    Raises:
        ParameterError: a bad ``dim``; a ``start`` that is not an int in ``[-size, size]``;
            a ``length`` that is not an int >= 0 or runs past the axis (each named as given).
    """
    node = name or "slice"
    ax = _dim(node, "dim", dim, input.type.ndim)
    size = input.shape[ax]
    if not _int(start) or not -size <= start <= size:
        raise ParameterError("start", start, f"must be an int in [-{size}, {size}] (axis {dim} has {size})", node)
    first = start + size if start < 0 else start
    if not _int(length) or length < 0 or first + length > size:
        where = f"start {start}" + (f" ({first} from the axis' beginning)" if start < 0 else "")
        raise ParameterError("length", length, f"must be an int >= 0 with {where} + length <= {size}, "
                                               f"the size of axis {dim}", node)
    return input.graph.apply(ops.Slice, dict(axis=ax, start=first, stop=first + length), [input], name)


def split(input: Value, split_size_or_sections, dim: int = 1, *,
          name: str | None = None) -> list[Value]:
    """Split along ``dim`` (channels by default) as ``torch.split``: an int gives
    chunks of that size (the last one smaller when it does not divide the
    extent), a list gives the chunk sizes, which must sum to the extent.
    Each chunk is one ``Slice`` node (named ``{name}_{i}`` when ``name`` is given).

    Raises:
        ParameterError: a bad dim, a chunk size < 1, or sections not summing
            to the extent.
    """
    node = name or "split"
    ax = _dim(node, "dim", dim, input.type.ndim)
    extent = input.shape[ax]
    if _int(split_size_or_sections):
        size = int(split_size_or_sections)
        if size < 1:
            raise ParameterError("split_size_or_sections", size, "must be >= 1", node)
        sizes = [min(size, extent - s) for s in range(0, extent, size)] or [0]
    else:
        sizes = list(split_size_or_sections)
        if not all(_int(s) and s >= 0 for s in sizes) or sum(sizes) != extent:
            raise ParameterError("split_size_or_sections", split_size_or_sections,
                                 f"must be ints >= 0 summing to the extent {extent} of dim {dim}", node)
    out, start = [], 0
    for i, size in enumerate(sizes):
        params = dict(axis=ax, start=start, stop=start + size)
        out.append(input.graph.apply(ops.Slice, params, [input], None if name is None else f"{name}_{i}"))
        start += size
    return out


def permute(input: Value, dims: Sequence[int], *, name: str | None = None) -> Value:
    """Axes reordered: output axis i is input axis ``dims[i]`` (``torch.permute``,
    ONNX ``Transpose``).

    Raises:
        ParameterError: ``dims`` is not a permutation of the input's axes.
    """
    node, ndim = name or "transpose", input.type.ndim
    perm = tuple(_dim(node, "dims", d, ndim) for d in dims)
    if sorted(perm) != list(range(ndim)):
        raise ParameterError("dims", tuple(dims), f"must be a permutation of the {ndim} axes", node)
    return input.graph.apply(ops.Transpose, dict(perm=perm), [input], name)


def transpose(input: Value, dim0: int, dim1: int, *, name: str | None = None) -> Value:
    """``input`` with axes ``dim0`` and ``dim1`` swapped (``torch.transpose``). The
    channel shuffle of ShuffleNet is ``reshape(N, g, C/g, H, W)``,
    ``transpose(1, 2)``, ``reshape(N, C, H, W)``.

    Raises:
        ParameterError: a bad dim.
    """
    ndim = input.type.ndim
    perm = list(range(ndim))
    a, b = (_dim(name or "transpose", p, d, ndim) for p, d in (("dim0", dim0), ("dim1", dim1)))
    perm[a], perm[b] = perm[b], perm[a]
    return input.graph.apply(ops.Transpose, dict(perm=tuple(perm)), [input], name)


__all__ = ["mul", "div", "neg", "mean", "adaptive_avg_pool2d", "narrow", "split", "permute",
           "transpose"]
