"""Piecewise-linear activations of modern convnets: hardtanh (ReLU6, ONNX ``Clip``),
hardsigmoid and hardswish, and the two base classes every activation shares.

Forward ops map ``x -> f(x)`` element-wise. Each has a backward op taking
``(x, gy)`` (the forward *input*, so the rule is the same for every
activation) and returning ``gy * f'(x)``. Where ``f''`` is not zero almost
everywhere, the backward op has an ``order`` field: ``order=k`` returns
``gy * f^(k)(x)``, and the gradient of order ``k`` with respect to x is the
op of order ``k + 1`` applied to ``gy * v``; kernels go to order 2, so second
derivatives work and a third one raises ``NotDifferentiableError``.

Semantics (SEMANTICS.md, "Activations of modern convnets"; PyTorch docs of
``torch.nn.functional.hardtanh``, ``hardsigmoid``, ``hardswish``; ONNX
``Clip``, ``HardSigmoid``, ``HardSwish``):

* ``Hardtanh(min_val, max_val)`` = ``clip(x, min_val, max_val)``; ReLU6 is
  ``Hardtanh(0, 6)`` = ONNX ``Clip(min=0, max=6)``. Gradient 1 strictly
  inside ``(min_val, max_val)``, 0 at and outside the bounds (PyTorch's
  ``hardtanh_backward``).
* ``Hardsigmoid(alpha, beta)`` = ``clip(alpha * x + beta, 0, 1)``; PyTorch's
  is alpha 1/6, beta 1/2 (the defaults here), ONNX ``HardSigmoid`` reads its
  own attributes (its default alpha is 0.2). Gradient ``alpha`` where
  ``0 < alpha * x + beta < 1`` strictly, else 0.
* ``Hardswish`` = ``x * Hardsigmoid(x)`` with alpha 1/6, beta 1/2 (Howard et
  al., "Searching for MobileNetV3", 2019). Gradient, as PyTorch's
  ``hardswish_backward``: 0 for ``x <= -3``, 1 for ``x >= 3``, ``x/3 + 1/2``
  strictly between; second derivative 1/3 strictly between, else 0.

A NaN input gives a NaN output (the clip propagates it) and, in these
piecewise ops, a zero gradient (no mask holds for NaN), as ``ReluBackward``
does; PyTorch passes the output gradient through there instead.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import NotDifferentiableError, ParameterError, ShapeError
from ..op import Op, require_same_dtype
from ..types import TensorType, is_float
from . import _fields as F
from .broadcast import Mul

#: Highest derivative order the activation kernels compute.
MAX_ORDER = 2


def _require_float(op: Op, t: TensorType, what: str = "input") -> None:
    if not is_float(t.dtype):
        raise ShapeError(f"{op.name}: {what} must be floating point, got {t.dtype}")


class Activation(Op):
    """Base of element-wise activations: ``x -> f(x)``, same shape and dtype.

    Subclasses set ``backward`` (the op class of ``gy * f'(x)``, built with
    this op's parameters) and ``flops_per_element``.
    """

    family: ClassVar[str] = "activation"
    backward: ClassVar[type]
    flops_per_element: ClassVar[int] = 1

    def infer(self, x):
        _require_float(self, x)
        return x

    def flops(self, types, out) -> int:
        """``flops_per_element`` per output element (compare, clip, exp each 1)."""
        return self.flops_per_element * out.size

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(self.backward, self.params(), [node.inputs[0], gy]),)


class ActivationBackward(Op):
    """Base of activation gradients: ``(x, gy) -> gy * f^(order)(x)``, gy's shape.

    Subclasses with a nonzero second derivative declare an ``order`` field
    (1 or 2); those without one have ``f'' = 0`` almost everywhere, so their
    gradient with respect to x is None.
    """

    family: ClassVar[str] = "activation"
    arity: ClassVar = (2, 2)
    flops_per_element: ClassVar[int] = 2

    def __attrs_post_init__(self):
        order = getattr(self, "order", 1)
        if order > MAX_ORDER:
            raise ParameterError("order", order, f"derivatives up to order {MAX_ORDER} are implemented")

    def infer(self, x, gy):
        _require_float(self, x)
        if x.shape != gy.shape:
            raise ShapeError(f"input shape {x.shape} != output gradient shape {gy.shape}")
        return TensorType(gy.shape, require_same_dtype(self, (x, gy)))

    def flops(self, types, out) -> int:
        return self.flops_per_element * out.size

    def vjp(self, node, v, wanted):
        x, gy = node.inputs
        g = node.graph
        d_gy = g.apply(type(self), self.params(), [x, v]) if wanted[1] else None
        d_x = None
        if wanted[0] and hasattr(self, "order"):
            if self.order >= MAX_ORDER:
                raise NotDifferentiableError(
                    f"node {node.name} ({self.name}): derivatives of order > {MAX_ORDER} with "
                    f"respect to the input are not implemented")
            d_x = g.apply(type(self), {**self.params(), "order": self.order + 1},
                          [x, g.apply(Mul, {}, [gy, v])])
        return (d_x, d_gy)


def order_field():
    """The ``order`` field of a backward op whose activation has a nonzero ``f''``."""
    return F.integer("order", 1, minimum=1)


@attrs.frozen
class Hardtanh(Activation):
    """``clip(x, min_val, max_val)`` (ReLU6 = ``Hardtanh(0, 6)``, ONNX ``Clip``).

    Raises:
        ParameterError: ``min_val > max_val`` (PyTorch refuses it too).
    """

    min_val: float = F.real("min_val", -1.0, infinite=True)  # +-inf: a one-sided clip
    max_val: float = F.real("max_val", 1.0, infinite=True)
    kind: ClassVar[str] = "hardtanh"
    flops_per_element: ClassVar[int] = 2

    def __attrs_post_init__(self):
        if self.min_val > self.max_val:
            raise ParameterError("max_val", self.max_val, f"must be >= min_val={self.min_val}")

    def vjp(self, node, gy, wanted):
        # The mask is read from the output: y = clip(x) lies strictly inside
        # (min_val, max_val) exactly where x does (NaN included, either way
        # outside). A stored y is round(clip(x)): its clipped elements hold the
        # bounds rounded to the storage dtype (bf16(0.1) = 0.10009766), so the
        # kernels of HardtanhBackward compare with the rounded bounds. So the
        # pre-activation has no reader but this node, and a batch norm + ReLU6
        # chain fuses in training (MobileNet-v2: 34 activations written and read
        # back per step before).
        return (node.graph.apply(self.backward, self.params(), [node.output, gy]),)


@attrs.frozen
class HardtanhBackward(ActivationBackward):
    """``gy`` where ``min_val < x < max_val`` strictly, else 0: (x, gy) -> gy's
    shape. ``x`` may be the Hardtanh's input or its output (the same mask;
    ``Hardtanh.vjp`` passes the output); the kernels compare with the bounds
    rounded to x's storage dtype, which a clipped stored output holds."""

    min_val: float = F.real("min_val", -1.0, infinite=True)  # +-inf: a one-sided clip
    max_val: float = F.real("max_val", 1.0, infinite=True)
    kind: ClassVar[str] = "hardtanh_backward"


@attrs.frozen
class Hardsigmoid(Activation):
    """``clip(alpha * x + beta, 0, 1)``; defaults are PyTorch's (1/6, 1/2)."""

    alpha: float = F.real("alpha", 1 / 6)
    beta: float = F.real("beta", 0.5)
    kind: ClassVar[str] = "hardsigmoid"
    flops_per_element: ClassVar[int] = 4


@attrs.frozen
class HardsigmoidBackward(ActivationBackward):
    """``alpha * gy`` where ``0 < alpha * x + beta < 1`` strictly, else 0."""

    alpha: float = F.real("alpha", 1 / 6)
    beta: float = F.real("beta", 0.5)
    kind: ClassVar[str] = "hardsigmoid_backward"
    flops_per_element: ClassVar[int] = 5


@attrs.frozen
class Hardswish(Activation):
    """``x * clip(x / 6 + 1/2, 0, 1)`` (PyTorch ``hardswish``, ONNX ``HardSwish``)."""

    kind: ClassVar[str] = "hardswish"
    flops_per_element: ClassVar[int] = 5


@attrs.frozen
class HardswishBackward(ActivationBackward):
    """order 1: ``gy * (0 if x <= -3, 1 if x >= 3, else x/3 + 1/2)``;
    order 2: ``gy / 3`` strictly inside (-3, 3), else 0."""

    order: int = order_field()
    kind: ClassVar[str] = "hardswish_backward"
    flops_per_element: ClassVar[int] = 5


Hardtanh.backward = HardtanhBackward
Hardsigmoid.backward = HardsigmoidBackward
Hardswish.backward = HardswishBackward
