"""Broadcasting division and negation (ONNX ``Div``, ``Neg``; ``torch.div``, ``torch.neg``).

``Div``: ``a / b`` with NumPy broadcasting (as ``Mul`` in ``broadcast.py``).
Floating operands follow IEEE division (``x / 0`` is +-inf, ``0 / 0`` NaN).
int64 operands divide with truncation toward zero (ONNX ``Div`` on integers,
C semantics; ``torch.div(..., rounding_mode='trunc')``), so shape arithmetic
of an imported model stays integral; division by an integer 0 is undefined.

Gradients (``y = a / b``): ``da = SumTo(gy / b, a.shape)``, ``db =
SumTo(-(gy * y) / b, b.shape)`` (= ``-gy * a / b^2``), written with ``Div``,
``Mul``, ``Neg`` and ``SumTo``, all differentiable, so second derivatives
work. ``Neg``'s gradient is ``Neg``.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..op import Op, require_same_dtype
from ..types import TensorType
from .broadcast import Mul, _reduce_to as reduce_to, broadcast_shapes


@attrs.frozen
class Div(Op):
    """``a / b`` with NumPy broadcasting -> ``broadcast(a.shape, b.shape)``, a's dtype."""

    arity: ClassVar = (2, 2)
    family: ClassVar[str] = "elementwise"
    kind: ClassVar[str] = "div"

    def infer(self, a, b):
        return TensorType(broadcast_shapes(a.shape, b.shape), require_same_dtype(self, (a, b)))

    def flops(self, types, out) -> int:
        return out.size

    def vjp(self, node, gy, wanted):
        a, b = node.inputs
        g = node.graph
        da = reduce_to(node, g.apply(Div, {}, [gy, b]), a.shape) if wanted[0] else None
        db = None
        if wanted[1]:
            quotient = g.apply(Div, {}, [g.apply(Mul, {}, [gy, node.output]), b])
            db = reduce_to(node, g.apply(Neg, {}, [quotient]), b.shape)
        return (da, db)


@attrs.frozen
class Neg(Op):
    """``-x``, any shape."""

    family: ClassVar[str] = "elementwise"
    kind: ClassVar[str] = "neg"

    def infer(self, x):
        return x

    def flops(self, types, out) -> int:
        return out.size

    def vjp(self, node, gy, wanted):
        return (node.graph.apply(Neg, {}, [gy]),)
