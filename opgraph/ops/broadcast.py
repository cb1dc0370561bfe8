"""Broadcasting element-wise ops: ``BroadcastAdd``, ``Mul`` and the pair
``SumTo`` / ``BroadcastTo`` their gradients need.

Broadcasting is NumPy's (and ONNX's multidirectional) rule: shapes are
aligned on the right, and an axis of extent 1 stretches to the other
operand's extent. ``Add`` keeps its equal-shapes contract; ``BroadcastAdd`` is
the general form (what ONNX ``Add`` means), so passes that pattern-match
``Add`` (residual connections, gradient accumulation) never see a broadcast.

Gradients: the cotangent of a broadcast operand is the output cotangent
summed back to the operand's shape (``SumTo``); ``SumTo`` and ``BroadcastTo``
are each other's adjoints, so second derivatives stay in these four ops.
Source: NumPy broadcasting rules; ONNX "Broadcasting in ONNX" (docs/Broadcasting.md).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from ..op import Op, require_same_dtype
from ..types import TensorType
from . import _fields as F


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The NumPy broadcast of ``shapes`` (right-aligned; extent 1 stretches).

    Raises:
        ShapeError: two extents differ and neither is 1.
    """
    ndim = max(len(s) for s in shapes)
    out = []
    for axis in range(ndim):
        dims = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0}
        big = dims - {1}
        if len(big) > 1:
            raise ShapeError(f"shapes {', '.join(map(str, shapes))} do not broadcast "
                             f"(axis {axis} from the left has extents {sorted(dims)})")
        out.append(big.pop() if big else 1)
    return tuple(out)


def broadcasts_to(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """True if an array of shape ``src`` broadcasts to exactly ``dst``."""
    if len(src) > len(dst):
        return False
    return all(s in (1, d) for s, d in zip(src[::-1], dst[::-1]))


def _reduce_to(node, ct, shape):
    """``ct`` summed back to ``shape`` (``ct`` itself when already that shape)."""
    if ct.shape == tuple(shape):
        return ct
    return node.graph.apply(SumTo, {"shape": shape}, [ct])


@attrs.frozen
class BroadcastAdd(Op):
    """``a + b`` with NumPy broadcasting -> ``broadcast(a.shape, b.shape)``."""

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "broadcast_add"
    family: ClassVar[str] = "broadcast"

    def infer(self, a, b):
        return TensorType(broadcast_shapes(a.shape, b.shape), require_same_dtype(self, (a, b)))

    def vjp(self, node, gy, wanted):
        a, b = node.inputs
        return (_reduce_to(node, gy, a.shape) if wanted[0] else None,
                _reduce_to(node, gy, b.shape) if wanted[1] else None)


@attrs.frozen
class Mul(Op):
    """``a * b`` with NumPy broadcasting -> ``broadcast(a.shape, b.shape)``.

    Gradient: ``da = SumTo(gy * b, a.shape)``, ``db = SumTo(gy * a, b.shape)``.
    """

    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "mul"
    family: ClassVar[str] = "broadcast"

    def infer(self, a, b):
        return TensorType(broadcast_shapes(a.shape, b.shape), require_same_dtype(self, (a, b)))

    def vjp(self, node, gy, wanted):
        a, b = node.inputs
        g = node.graph
        da = _reduce_to(node, g.apply(Mul, {}, [gy, b]), a.shape) if wanted[0] else None
        db = _reduce_to(node, g.apply(Mul, {}, [gy, a]), b.shape) if wanted[1] else None
        return (da, db)


@attrs.frozen
class SumTo(Op):
    """Sum ``x`` down to ``shape``, the inverse of broadcasting ``shape`` to x.

    Leading axes x has beyond ``len(shape)`` are summed away; an axis where
    ``shape`` has 1 and x has more is summed with the 1 kept. ``shape`` must
    broadcast to x's shape.
    """

    shape: tuple = F.shape("shape")
    kind: ClassVar[str] = "sum_to"
    family: ClassVar[str] = "broadcast"

    def infer(self, x):
        if not broadcasts_to(self.shape, x.shape):
            raise ShapeError(f"parameter shape={self.shape}: does not broadcast to the input "
                             f"shape {x.shape}, so x cannot be summed down to it")
        return TensorType(self.shape, x.dtype)

    def vjp(self, node, v, wanted):
        return (node.graph.apply(BroadcastTo, {"shape": node.inputs[0].shape}, [v]),)


@attrs.frozen
class BroadcastTo(Op):
    """Broadcast ``x`` to ``shape`` (NumPy ``broadcast_to``, materialised)."""

    shape: tuple = F.shape("shape")
    kind: ClassVar[str] = "broadcast_to"
    family: ClassVar[str] = "broadcast"

    def infer(self, x):
        if not broadcasts_to(x.shape, self.shape):
            raise ShapeError(f"parameter shape={self.shape}: input shape {x.shape} does not "
                             f"broadcast to it")
        return TensorType(self.shape, x.dtype)

    def vjp(self, node, v, wanted):
        return (node.graph.apply(SumTo, {"shape": node.inputs[0].shape}, [v]),)
