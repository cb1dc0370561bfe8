"""What a converter sees of one ONNX node: its attributes (each read marked,
so that an unread one is an error), its inputs (import-time values, declared
parameters or graph values), and the builders that add ops named after the node.

What the importer holds per ONNX tensor name (``Importer.env``):

* a graph ``Value`` (a data input or a node's output);
* :class:`Static`: a value known at import time (an initializer or a folded
  constant);
* :class:`Declared`: a parameter without a value (a graph input with a
  static shape in a weightless export, ``export_params=False``).

A trainable ``Static`` and a ``Declared`` enter the graph where a node first
reads them, as a ``param`` source or, read as BatchNorm running statistics,
a ``buffer`` source, named after the tensor the node reads. An ``Identity``
of one gives it the Identity output's name, so a tensor the exporter
deduplicated behind ``Identity`` nodes becomes one source per name
(``opgraph/onnx/__init__.py`` says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from ..graph import Value
from ..ops import Add, BroadcastAdd, Constant
from .registry import OnnxImportError

if TYPE_CHECKING:
    from .importer import Importer


@attrs.frozen
class Static:
    """A value known at import time; ``trainable`` for a float initializer."""

    name: str
    value: np.ndarray
    trainable: bool = False


@attrs.frozen
class Declared:
    """A parameter the file declares without a value: ``shape`` static, ``dtype`` floating."""

    name: str
    shape: tuple
    dtype: str


#: How a node reads an input that has no graph value yet (``NodeContext.input``).
ROLES = ("param", "buffer", "constant")


class NodeContext:
    """What a converter sees of one ONNX node (see ``layers`` for use)."""

    def __init__(self, imp: "Importer", node, version: int):
        self.imp, self.node, self.version = imp, node, version
        self.op_type = node.op_type
        self.label = f"ONNX node {node.name or node.output[0]!r} ({node.op_type})"
        self.base = node.name or node.output[0] or node.op_type.lower()
        self._attrs = {a.name: a for a in node.attribute}
        self._read: set[str] = set()

    # ---- errors ----------------------------------------------------------
    def error(self, what: str) -> OnnxImportError:
        return OnnxImportError(f"{self.label}: {what}")

    # ---- attributes ------------------------------------------------------
    def attr(self, name: str, default: Any = None):
        """The attribute's Python value (strings decoded, tensors as arrays), or ``default``."""
        self._read.add(name)
        if name not in self._attrs:
            return default
        a = self._attrs[name]
        if a.type == a.TENSOR:
            return self.imp.onnx.numpy_helper.to_array(a.t)
        if a.type in (a.GRAPH, a.GRAPHS, a.SPARSE_TENSOR, a.SPARSE_TENSORS, a.TYPE_PROTO, a.TYPE_PROTOS):
            raise self.error(f"attribute {name} of type {a.type} is not supported")
        value = self.imp.onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list):
            return [v.decode() if isinstance(v, bytes) else v for v in value]
        return value

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def unread_attributes(self) -> list[str]:
        return sorted(set(self._attrs) - self._read)

    # ---- inputs ----------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        """Number of inputs, trailing omitted optional inputs not counted."""
        names = list(self.node.input)
        while names and not names[-1]:
            names.pop()
        return len(names)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and bool(self.node.input[i])

    def static(self, i: int) -> np.ndarray | None:
        """Input ``i``'s value if known at import time (initializer or folded)."""
        s = self.imp.env.get(self.node.input[i]) if self.has_input(i) else None
        return s.value if isinstance(s, Static) else None

    def foldable(self, *idx: int) -> bool:
        """True if the inputs are all import-time constants and none is trainable."""
        idx = idx or tuple(i for i in range(self.n_inputs) if self.has_input(i))
        vals = [self.imp.env.get(self.node.input[i]) for i in idx]
        return all(isinstance(s, Static) and not s.trainable for s in vals)

    def require_static(self, i: int, what: str) -> np.ndarray:
        v = self.static(i)
        if v is None:
            item = self.passthrough(i)
            how = (f"graph input {item.name!r} has no value in the file" if isinstance(item, Declared)
                   else f"computed {what} is not supported")
            raise self.error(f"input {i} ({what}) must be a constant (initializer or Constant); {how}")
        return v

    def input(self, i: int, *, role: str = "param", dtype: str | None = None) -> Value:
        """Input ``i`` as a graph value (import-time values and parameters enter the graph here).

        A trainable initializer or a declared parameter becomes a source of
        ``role``: ``'param'`` (trainable), ``'buffer'`` (state such as running
        statistics) or ``'constant'`` (a ``Constant`` op; declared parameters
        have no value and are buffers then); ``dtype`` casts an import-time
        value (never a computed one).
        """
        if not self.has_input(i):
            raise self.error(f"input {i} is required")
        return self.imp.value(self.node.input[i], role=role, dtype=dtype, ctx=self)

    def shape(self, i: int) -> tuple[int, ...]:
        s = self.passthrough(i)
        return tuple(s.value.shape) if isinstance(s, Static) else tuple(s.shape)

    def passthrough(self, i: int) -> "Value | Static | Declared":
        """Input ``i`` exactly as it is (for Identity-like nodes: no node is added)."""
        if not self.has_input(i):
            raise self.error(f"input {i} is required")
        name = self.node.input[i]
        if name not in self.imp.env:
            raise self.error(f"tensor {name!r} is not produced by any earlier node, input or initializer")
        return self.imp.env[name]

    def output_used(self, i: int) -> bool:
        return i < len(self.node.output) and bool(self.node.output[i]) and \
            self.node.output[i] in self.imp.consumed

    # ---- building --------------------------------------------------------
    def apply(self, op_cls: type, params: dict, inputs, part: str | None = None) -> Value:
        """Add ``op_cls(**params)`` over ``inputs``, named after the ONNX node (``/part`` for helpers)."""
        name = self.imp.unique_name(self.base if part is None else f"{self.base}/{part}")
        return self.imp.graph.apply(op_cls, params, list(inputs), name)

    def constant(self, value, part: str) -> Value:
        """A ``Constant`` op holding ``value``."""
        return self.apply(Constant, {"value": np.asarray(value)}, [], part)

    def add(self, a: Value, b: Value, part: str | None = None) -> Value:
        """``a + b``: an ``Add`` for equal shapes, a ``BroadcastAdd`` otherwise."""
        return self.apply(Add if a.shape == b.shape else BroadcastAdd, {}, [a, b], part)


__all__ = ["NodeContext", "Static", "Declared", "ROLES"]
