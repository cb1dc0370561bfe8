"""Smooth activations: sigmoid, SiLU (swish) and GELU, with backward ops of order 1 and 2.

Each backward op takes ``(x, gy)`` and returns ``gy * f^(order)(x)``; the
gradient of order 1 with respect to x is order 2 applied to ``gy * v``
(``activation.ActivationBackward``), so second derivatives work.

* ``Sigmoid``: ``s(x) = 1 / (1 + exp(-x))``, evaluated from ``exp(-|x|)`` so
  no ``exp`` overflows for large ``|x|`` (SEMANTICS.md);
  ``s' = s (1 - s)``, ``s'' = s (1 - s) (1 - 2 s)``. ONNX ``Sigmoid``.
* ``Silu``: ``x * s(x)`` (Elfwing et al. 2018; Ramachandran et al. 2017,
  "swish"; PyTorch ``silu``); ``f' = s (1 + x (1 - s))``,
  ``f'' = s (1 - s) (2 + x (1 - 2 s))``.
* ``Gelu(approximate)``: ``'none'``: ``x * Phi(x)`` with ``Phi`` the standard
  normal CDF, ``0.5 * (1 + erf(x / sqrt 2))`` (Hendrycks & Gimpel 2016; ONNX
  ``Gelu``, PyTorch ``gelu``); ``f' = Phi + x phi``, ``f'' = phi (2 - x^2)``.
  ``'tanh'``: ``0.5 x (1 + tanh(u))``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``
  (the paper's approximation, PyTorch ``approximate='tanh'``).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from . import _fields as F
from .activation import Activation, ActivationBackward, order_field

GELU_APPROXIMATIONS = ("none", "tanh")


@attrs.frozen
class Sigmoid(Activation):
    """``1 / (1 + exp(-x))``, finite for every finite x."""

    kind: ClassVar[str] = "sigmoid"
    flops_per_element: ClassVar[int] = 4


@attrs.frozen
class SigmoidBackward(ActivationBackward):
    """order 1: ``gy * s (1 - s)``; order 2: ``gy * s (1 - s) (1 - 2 s)``; s = sigmoid(x)."""

    order: int = order_field()
    kind: ClassVar[str] = "sigmoid_backward"
    flops_per_element: ClassVar[int] = 7


@attrs.frozen
class Silu(Activation):
    """``x * sigmoid(x)``."""

    kind: ClassVar[str] = "silu"
    flops_per_element: ClassVar[int] = 5


@attrs.frozen
class SiluBackward(ActivationBackward):
    """order 1: ``gy * s (1 + x (1 - s))``; order 2: ``gy * s (1 - s) (2 + x (1 - 2 s))``."""

    order: int = order_field()
    kind: ClassVar[str] = "silu_backward"
    flops_per_element: ClassVar[int] = 9


@attrs.frozen
class Gelu(Activation):
    """``x * Phi(x)`` (``approximate='none'``) or its tanh approximation (``'tanh'``)."""

    approximate: str = F.choice("approximate", GELU_APPROXIMATIONS, "none")
    kind: ClassVar[str] = "gelu"
    flops_per_element: ClassVar[int] = 8


@attrs.frozen
class GeluBackward(ActivationBackward):
    """order 1: ``gy * f'(x)``; order 2: ``gy * f''(x)`` of ``Gelu(approximate)``."""

    approximate: str = F.choice("approximate", GELU_APPROXIMATIONS, "none")
    order: int = order_field()
    kind: ClassVar[str] = "gelu_backward"
    flops_per_element: ClassVar[int] = 14


Sigmoid.backward = SigmoidBackward
Silu.backward = SiluBackward
Gelu.backward = GeluBackward
