"""Fully connected layer and matrix product.

``Linear``: ``y = x @ w.T + b`` with x (N, in_features), w (out_features,
in_features), b (out_features,) — the ``torch.nn.functional.linear`` form.
Zero in_features yields the bias. Its gradient is written with ``MatMul``
(whose own gradient is ``MatMul``, so second derivatives work).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..errors import ShapeError
from ..op import Op, require_ndim, require_same_dtype
from ..types import TensorType
from . import _fields as F


@attrs.frozen
class Linear(Op):
    """``x @ w.T + b``: x (N, in), w (out, in), b (out,) -> (N, out)."""

    arity: ClassVar = (2, 3)
    kind: ClassVar[str] = "linear"
    family: ClassVar[str] = "linear"
    direction: ClassVar[str] = "fwd"

    def infer(self, x, w, b=None):
        require_ndim(self, "input", x, 2)
        require_ndim(self, "weight", w, 2)
        dtype = require_same_dtype(self, (x, w) + ((b,) if b else ()))
        if x.shape[1] != w.shape[1]:
            raise ShapeError(f"input features {x.shape[1]} != weight in_features {w.shape[1]} "
                             f"(weight shape {w.shape})")
        if b is not None and b.shape != (w.shape[0],):
            raise ShapeError(f"bias shape {b.shape} != (out_features,) = ({w.shape[0]},)")
        return TensorType((x.shape[0], w.shape[0]), dtype)

    def flops(self, types, out) -> int:
        (n, i), (o, _) = types[0].shape, types[1].shape
        return 2 * n * i * o

    def vjp(self, node, gy, wanted):
        x, w, *b = node.inputs
        g = node.graph
        gx = g.apply(MatMul, {}, [gy, w]) if wanted[0] else None
        gw = g.apply(MatMul, {"transpose_a": True}, [gy, x]) if wanted[1] else None
        if not b:
            return (gx, gw)
        from .elementwise import BiasAddBackward
        return (gx, gw, g.apply(BiasAddBackward, {}, [gy]) if wanted[2] else None)


@attrs.frozen
class MatMul(Op):
    """``op(a) @ op(b)`` of 2-D operands, ``op`` transposing when asked."""

    transpose_a: bool = F.flag("transpose_a")
    transpose_b: bool = F.flag("transpose_b")
    arity: ClassVar = (2, 2)
    kind: ClassVar[str] = "matmul"
    family: ClassVar[str] = "linear"

    def _dims(self, a, b):
        m, ka = a.shape[::-1] if self.transpose_a else a.shape
        kb, n = b.shape[::-1] if self.transpose_b else b.shape
        return m, ka, kb, n

    def infer(self, a, b):
        require_ndim(self, "a", a, 2)
        require_ndim(self, "b", b, 2)
        m, ka, kb, n = self._dims(a, b)
        if ka != kb:
            raise ShapeError(f"inner dimensions differ: {ka} vs {kb} (shapes {a.shape}, {b.shape}, "
                             f"transpose_a={self.transpose_a}, transpose_b={self.transpose_b})")
        return TensorType((m, n), require_same_dtype(self, (a, b)))

    def flops(self, types, out) -> int:
        m, k, _, n = self._dims(*types)
        return 2 * m * k * n

    def vjp(self, node, gc, wanted):
        a, b = node.inputs
        g, ta, tb = node.graph, self.transpose_a, self.transpose_b
        da = db = None
        if wanted[0]:
            da = (g.apply(MatMul, {"transpose_b": not tb}, [gc, b]) if not ta
                  else g.apply(MatMul, {"transpose_a": tb, "transpose_b": True}, [b, gc]))
        if wanted[1]:
            db = (g.apply(MatMul, {"transpose_a": not ta}, [a, gc]) if not tb
                  else g.apply(MatMul, {"transpose_a": True, "transpose_b": ta}, [gc, a]))
        return (da, db)
