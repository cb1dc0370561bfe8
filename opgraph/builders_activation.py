"""Builders of the modern-convnet activations, named and shaped like
``torch.nn.functional`` (no ``inplace``: nodes never update their input).

Each adds one node over x (any shape, floating) and returns a value of x's
shape and dtype; every builder raises ShapeError for an integer x and
ParameterError for a bad parameter. Semantics and sources:
``opgraph/ops/activation.py`` and ``smooth_activation.py`` (SEMANTICS.md,
"Activations of modern convnets").
Re-exported by ``opgraph.builders`` and ``opgraph``.
"""

from __future__ import annotations

from . import ops
from .graph import Value


def hardtanh(input: Value, min_val: float = -1.0, max_val: float = 1.0, *,
             name: str | None = None) -> Value:
    """``clip(x, min_val, max_val)`` (ONNX ``Clip``); gradient 1 strictly inside
    the bounds, 0 at and outside them.

    Raises:
        ParameterError: ``min_val > max_val`` or a non-number bound.
    """
    return input.graph.apply(ops.Hardtanh, dict(min_val=min_val, max_val=max_val), [input], name)


def relu6(input: Value, *, name: str | None = None) -> Value:
    """``min(max(x, 0), 6)`` = ``hardtanh(x, 0, 6)`` = ONNX ``Clip(0, 6)`` (MobileNet-v2)."""
    return hardtanh(input, 0.0, 6.0, name=name)


def sigmoid(input: Value, *, name: str | None = None) -> Value:
    """``1 / (1 + exp(-x))``, without overflow for large ``|x|``."""
    return input.graph.apply(ops.Sigmoid, {}, [input], name)


def silu(input: Value, *, name: str | None = None) -> Value:
    """``x * sigmoid(x)`` (SiLU / swish; EfficientNet)."""
    return input.graph.apply(ops.Silu, {}, [input], name)


def hardsigmoid(input: Value, *, alpha: float = 1 / 6, beta: float = 0.5,
                name: str | None = None) -> Value:
    """``clip(alpha * x + beta, 0, 1)``; PyTorch's is alpha 1/6, beta 1/2 (the
    defaults). ONNX ``HardSigmoid`` maps with its own attributes (its default
    alpha is 0.2). Gradient ``alpha`` strictly inside, else 0."""
    return input.graph.apply(ops.Hardsigmoid, dict(alpha=alpha, beta=beta), [input], name)


def hardswish(input: Value, *, name: str | None = None) -> Value:
    """``x * clip(x / 6 + 1/2, 0, 1)`` (MobileNetV3; ONNX ``HardSwish``)."""
    return input.graph.apply(ops.Hardswish, {}, [input], name)


def gelu(input: Value, approximate: str = "none", *, name: str | None = None) -> Value:
    """``x * Phi(x)`` with Phi the standard normal CDF (``approximate='none'``, the erf
    form), or ``x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2`` (``'tanh'``).

    Raises:
        ParameterError: another ``approximate``.
    """
    return input.graph.apply(ops.Gelu, dict(approximate=approximate), [input], name)


__all__ = ["hardtanh", "relu6", "sigmoid", "silu", "hardsigmoid", "hardswish", "gelu"]
