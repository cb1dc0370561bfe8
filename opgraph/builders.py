"""The functional DSL: builders named and shaped like ``torch.nn.functional``.

Each builder adds one abstract node to the graph of its inputs and returns its
output ``Value``. ``name=`` names the node (default: the builder's name with a
counter). Parameters are validated and canonicalised when the node is added;
bad ones raise ``ParameterError``/``ShapeError`` naming the node, the
parameter and the value. Shapes: activations NCHW, conv weights OIHW.
"""

from __future__ import annotations

import math
from typing import Sequence

from . import ops
from .errors import ParameterError
from .graph import Value, graph_of
from .builders_tensor import _dim
from .params import pair, padding2d


def _resolve_padding(node_kind: str, padding, x: Value, kernel, stride, dilation):
    """Turn ``'same'`` into explicit pads, which needs the input size."""
    if isinstance(padding, str) and padding.lower() == "same":
        try:
            return padding2d(padding, in_hw=x.shape[2:4], kernel=pair("kernel_size", kernel, minimum=1),
                             stride=pair("stride", stride, minimum=1),
                             dilation=pair("dilation", dilation, minimum=1))
        except ParameterError as e:
            raise e.with_node(node_kind) from None
    return padding


def conv2d(x: Value, w: Value, b: Value | None = None, *, stride=1, padding=0, dilation=1,
           groups: int = 1, name: str | None = None) -> Value:
    """2-D cross-correlation: x (N, C, H, W), w (O, C/groups, kH, kW), b (O,) -> (N, O, Ho, Wo).

    ``padding``: int, ``(ph, pw)``, ``((top, bottom), (left, right))``, ``'valid'``
    or ``'same'`` (TensorFlow's rule, extra pixel bottom/right). Output size
    ``floor((in + pb + pe - d*(k-1) - 1)/s) + 1`` (SEMANTICS.md).

    Raises:
        ParameterError: stride/dilation < 1, negative padding, groups < 1.
        ShapeError: groups not dividing the channels, kernel larger than the
            padded input, bias of the wrong shape.
    """
    pad = _resolve_padding(name or "conv2d", padding, x, w.shape[2:4] if w.type.ndim == 4 else 1,
                           stride, dilation)
    params = dict(stride=stride, padding=pad, dilation=dilation, groups=groups)
    return graph_of(x, w, b).apply(ops.Conv2d, params, [x, w] + ([b] if b is not None else []), name)


def _pool(cls, x, kernel_size, stride, padding, ceil_mode, name, **extra):
    stride = kernel_size if stride is None else stride
    pad = _resolve_padding(name or cls.kind, padding, x, kernel_size, stride, 1)
    params = dict(kernel_size=kernel_size, stride=stride, padding=pad, ceil_mode=ceil_mode, **extra)
    return x.graph.apply(cls, params, [x], name)


def max_pool2d(x: Value, kernel_size, stride=None, padding=0, ceil_mode: bool = False, *,
               name: str | None = None) -> Value:
    """Max pooling: (N, C, H, W) -> (N, C, Ho, Wo); stride defaults to kernel_size.

    Padding counts as -inf and may be at most half the kernel per side;
    ``ceil_mode`` follows SEMANTICS.md (a window may not start in the padding).

    Raises:
        ParameterError: bad kernel/stride/padding values.
        ShapeError: kernel larger than the padded input.
    """
    return _pool(ops.MaxPool2d, x, kernel_size, stride, padding, ceil_mode, name)


def avg_pool2d(x: Value, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, *, name: str | None = None) -> Value:
    """Average pooling: (N, C, H, W) -> (N, C, Ho, Wo).

    Divisor: with ``count_include_pad`` the cells of input and explicit
    padding (never the ceil-mode overhang), else in-bounds cells only.
    """
    return _pool(ops.AvgPool2d, x, kernel_size, stride, padding, ceil_mode, name,
                 count_include_pad=count_include_pad)


def relu(x: Value, *, name: str | None = None) -> Value:
    """``max(x, 0)``; NaN propagates; gradient 0 at exactly 0."""
    return x.graph.apply(ops.Relu, {}, [x], name)


def threshold(x: Value, threshold: float, value: float, *, name: str | None = None) -> Value:
    """``x if x > threshold else value`` (``torch.nn.functional.threshold``)."""
    return x.graph.apply(ops.Threshold, dict(threshold=threshold, value=value), [x], name)


def local_response_norm(x: Value, size: int, alpha: float = 1e-4, beta: float = 0.75,
                        k: float = 1.0, *, name: str | None = None) -> Value:
    """Across-channel LRN, ``x / (k + alpha/size * sum_window x^2)^beta`` (Krizhevsky 2012;
    AlexNet, Caffe and cuDNN's form): ``(N, C, ...)`` -> the same shape.

    The window of channel ``c`` is ``c - floor((size-1)/2) .. c + ceil((size-1)/2)``, clipped
    to the valid channels. For an odd ``size`` that is ``torch.nn.functional.local_response_norm``'s
    window; for an even ``size`` it follows ONNX ``LRN`` (the extra channel on the high side),
    where PyTorch puts it on the low side, so the two differ (SEMANTICS.md).

    Raises:
        ParameterError: ``size`` not an int >= 1, or a NaN or infinite ``alpha``,
            ``beta`` or ``k`` (``opgraph/ops/lrn.py``)."""
    return x.graph.apply(ops.LocalResponseNorm, dict(size=size, alpha=alpha, beta=beta, k=k), [x], name)


def linear(x: Value, w: Value, b: Value | None = None, *, name: str | None = None) -> Value:
    """``x @ w.T + b``: x (N, in), w (out, in), b (out,) -> (N, out)."""
    return graph_of(x, w, b).apply(ops.Linear, {}, [x, w] + ([b] if b is not None else []), name)


def matmul(a: Value, b: Value, *, transpose_a: bool = False, transpose_b: bool = False,
           name: str | None = None) -> Value:
    """2-D matrix product ``op(a) @ op(b)``."""
    return graph_of(a, b).apply(ops.MatMul, dict(transpose_a=transpose_a, transpose_b=transpose_b),
                                [a, b], name)


def bias_add(x: Value, b: Value, *, name: str | None = None) -> Value:
    """``x + b`` with b (C,) broadcast along axis 1."""
    return graph_of(x, b).apply(ops.BiasAdd, {}, [x, b], name)


def flatten(x: Value, start_dim: int = 1, *, name: str | None = None) -> Value:
    """Merge axes ``start_dim`` to the last (``torch.flatten(x, start_dim)``, its
    ``end_dim=-1``; no other end): (N, C, H, W) -> (N, C*H*W). ``start_dim``
    defaults to 1, ``nn.Flatten``'s (the batch axis kept; ``torch.flatten``'s
    default is 0); a negative one counts from the end, as torch's does.

    Raises:
        ParameterError: ``start_dim`` not an integer, or below ``-ndim``.
        ShapeError: ``start_dim >= ndim`` (the op's check).
    """
    ndim = len(x.type.shape)
    if isinstance(start_dim, int) and not isinstance(start_dim, bool) and start_dim < 0:
        if start_dim < -ndim:
            raise ParameterError("start_dim", start_dim, f"must be in [{-ndim}, {ndim}) for a {ndim}-D input",
                                 name or "flatten")
        start_dim += ndim
    return x.graph.apply(ops.Flatten, dict(start_dim=start_dim), [x], name)


def reshape(x: Value, shape: Sequence[int], *, name: str | None = None) -> Value:
    """Same elements, new ``shape`` (``torch.reshape``): one ``Reshape`` node.

    One entry may be -1: the extent that keeps the element count, resolved
    here (the node holds the concrete shape). (6, 4) reshaped to (3, -1)
    is (3, 8).

    Raises:
        ParameterError: more than one -1, or -1 where the other extents do not
            divide the element count (or multiply to 0); other entries
            below 0 (the op's own check).
        ShapeError: a shape of another element count (the op's check).
    """
    node = name or "reshape"
    shape = list(shape) if isinstance(shape, (list, tuple)) else shape
    whole = isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
    if whole and shape.count(-1) == 1:  # anything else is the op's to check and report
        known = math.prod(d for d in shape if d != -1)
        if known <= 0 or x.type.size % known:
            raise ParameterError("shape", tuple(shape), f"-1 cannot be inferred: {x.type.size} elements "
                                 f"do not divide into the other extents (product {known})", node)
        shape[shape.index(-1)] = x.type.size // known
    elif whole and shape.count(-1) > 1:
        raise ParameterError("shape", tuple(shape), "at most one entry may be -1", node)
    return x.graph.apply(ops.Reshape, dict(shape=tuple(shape) if isinstance(shape, list) else shape), [x], name)


def concat(tensors: Sequence[Value], dim: int = 1, *, name: str | None = None) -> Value:
    """Join ``tensors`` along ``dim``, as ``torch.cat(tensors, dim)``: one ``Concat`` node.

    Shapes: the inputs have one rank and dtype and the same extents on every
    axis but ``dim``, whose extents add up: (N, C1, H, W) and (N, C2, H, W)
    give (N, C1 + C2, H, W) with ``dim=1``. ``dim`` may be negative (counted
    from the end); it is resolved against the rank here.

    The default is ``dim=1``, not ``torch.cat``'s 0: joining the channels of
    NCHW activations (Inception modules, DenseNet blocks: every concat of the
    benchmark models) is what a convnet graph does, as ``split``'s default
    ``dim=1`` is; pass ``dim`` when porting code that relies on torch's default.
    ``axis`` (NumPy's and ONNX's name, which this builder once took) is no
    longer a keyword: Python's ``TypeError`` names it.

    Raises:
        ParameterError: ``dim`` not an int in ``[-rank, rank - 1]``, or no tensors.
        ShapeError: inputs whose ranks, dtypes or extents off ``dim`` differ.
        OpgraphError: inputs of different graphs, or something not a ``Value``.
    """
    node = name or "concat"
    tensors = list(tensors)
    if not tensors:
        raise ParameterError("tensors", tensors, "must hold at least one value", node)
    graph = graph_of(*tensors)
    ax = _dim(node, "dim", dim, tensors[0].type.ndim)
    return graph.apply(ops.Concat, dict(axis=ax), tensors, name)


def pad(x: Value, padding, value: float = 0.0, *, name: str | None = None) -> Value:
    """Explicit spatial padding of an NCHW tensor."""
    return x.graph.apply(ops.Pad, dict(padding=padding, value=value), [x], name)


def dropout(x: Value, p: float = 0.5, training: bool = True, seed: int = 0, *,
            name: str | None = None) -> Value:
    """Inverted dropout, as ``torch.nn.functional.dropout(x, p, training)``: one ``Dropout`` node.

    With ``training`` (the default, as ``F.dropout``'s) each element is zeroed
    with probability ``p`` and the rest scaled by ``1 / (1 - p)``; the mask is
    a function of ``seed`` and the element's logical index, the same in every
    step and layout (``backends/reference/dropout.py``), where PyTorch draws a
    new one each call. With ``training=False`` it is the identity (inference).
    The default was ``False`` before it followed ``F.dropout``; every caller in
    the repository passes ``training`` explicitly, so no model changed with it.
    Shapes: any; the output has ``x``'s type.

    Raises:
        ParameterError: ``p`` outside ``[0, 1]`` (NaN included), or a bad ``seed``.
    """
    return x.graph.apply(ops.Dropout, dict(p=p, training=training, seed=seed), [x], name)


def softmax(x: Value, dim: int = 1, *, name: str | None = None) -> Value:
    """Max-subtracted softmax along ``dim`` (``F.softmax``; default 1, the
    classes of (N, C) logits); the output has ``x``'s shape.

    Raises:
        ParameterError: ``dim`` not an int in ``[-rank, rank - 1]``.
    """
    ax = _dim(name or "softmax", "dim", dim, x.type.ndim)
    return x.graph.apply(ops.Softmax, dict(axis=ax), [x], name)


def log_softmax(x: Value, dim: int = 1, *, name: str | None = None) -> Value:
    """Log-sum-exp based log-softmax along ``dim`` (``F.log_softmax``; default
    1); the output has ``x``'s shape.

    Raises:
        ParameterError: ``dim`` not an int in ``[-rank, rank - 1]``.
    """
    ax = _dim(name or "log_softmax", "dim", dim, x.type.ndim)
    return x.graph.apply(ops.LogSoftmax, dict(axis=ax), [x], name)


def cross_entropy(logits: Value, target: Value, reduction: str = "mean", *,
                  name: str | None = None) -> Value:
    """Softmax cross-entropy of logits (N, C) against int64 class indices (N,) -> scalar."""
    return graph_of(logits, target).apply(ops.CrossEntropy, dict(reduction=reduction),
                                          [logits, target], name)


def add(a: Value, b: Value, *, name: str | None = None) -> Value:
    """``a + b`` with NumPy broadcasting, as ``torch.add`` (without its ``alpha``).

    Equal shapes give an ``Add`` node (the op gradient sums and the fusion rules
    know); other shapes a ``BroadcastAdd``, whose gradient sums ``gy`` back to
    each operand's shape (``SumTo``): (N, C, H, W) + (C, 1, 1) adds a per-channel
    bias.

    Raises:
        ShapeError: shapes that do not broadcast (naming the node), or mixed dtypes.
    """
    op = ops.Add if a.shape == b.shape else ops.BroadcastAdd
    return graph_of(a, b).apply(op, {}, [a, b], name)


# The modern-convnet builders live in their own modules; one import surface.
from .builders_activation import (gelu, hardsigmoid, hardswish, hardtanh, relu6,  # noqa: E402,F401
                                  sigmoid, silu)
from .builders_norm import batch_norm, layer_norm  # noqa: E402,F401
from .builders_tensor import (adaptive_avg_pool2d, div, mean, mul, narrow, neg, permute,  # noqa: E402,F401
                              split, transpose)
