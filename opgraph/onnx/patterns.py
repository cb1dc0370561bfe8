"""Subgraphs the importer reads as one op before converting node by node.

Exporters write GELU as five ONNX nodes before opset 20 has a ``Gelu``
operator: PyTorch's ``F.gelu(x)`` (``approximate='none'``) becomes::

    d = Div(x, sqrt(2)); e = Erf(d); a = Add(e, 1); m = Mul(x, a); y = Mul(m, 0.5)

i.e. ``y = x * 0.5 * (1 + erf(x / sqrt(2))) = x * Phi(x)`` (Hendrycks & Gimpel
2016, eq. 1; Phi the standard normal CDF). opgraph has no ``Erf`` op, so
:func:`fuse_gelu` replaces each such subgraph by one ONNX ``Gelu`` node
(opset 20's operator, ``approximate='none'``), which converts to one ``Gelu``
op. Accepted forms: ``x / sqrt(2)`` or ``x * (1 / sqrt(2))``; ``1 + e`` in either
order; the product ``x * a * 0.5`` associated in any of the three ways, each
product in either order. The constants must be import-time scalars (``Constant``
nodes or initializers) equal to sqrt(2), 1/sqrt(2), 1 and 0.5 within float32
rounding; every intermediate tensor must feed only the next node of the pattern
and be no graph output. An ``Erf`` outside this pattern is left alone (its
converter then reports it).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict

import numpy as np

#: The ONNX operator version (opset 20's ``Gelu``) that fused subgraphs are converted as.
GELU_VERSION = 20


class _Graph:
    """Producers, consumers and scalar constants of a list of ONNX nodes."""

    def __init__(self, nodes, constants: dict, graph_outputs: set):
        self.nodes, self.constants, self.graph_outputs = nodes, constants, graph_outputs
        self.producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
        self.consumers = defaultdict(list)
        for i, n in enumerate(nodes):
            for t in n.input:
                if t:
                    self.consumers[t].append(i)

    def scalar_is(self, name: str, want: float) -> bool:
        v = self.constants.get(name)
        return v is not None and v.size == 1 and bool(np.isclose(float(v.reshape(())), want,
                                                                  rtol=1e-6, atol=0.0))

    def sole_consumer(self, tensor: str, op_type: str) -> int | None:
        """The one node reading ``tensor`` if it is an ``op_type`` of the default domain."""
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or tensor in self.graph_outputs:
            return None
        node = self.nodes[users[0]]
        return users[0] if node.op_type == op_type and node.domain in ("", "ai.onnx") else None

    def binary(self, i: int, op_type: str):
        """The two inputs of node ``i`` if it is a binary ``op_type``."""
        node = self.nodes[i]
        if node.op_type != op_type or len(node.input) != 2 or node.domain not in ("", "ai.onnx"):
            return None
        return list(node.input)

    def other(self, i: int, tensor: str) -> str | None:
        ins = list(self.nodes[i].input)
        return ins[1] if ins[0] == tensor else ins[0] if ins[1] == tensor else None


def _scaled_input(g: _Graph, erf: int) -> tuple[str, int] | None:
    """``(x, node)`` where Erf's input is ``x / sqrt(2)`` or ``x * (1 / sqrt(2))``."""
    t = g.nodes[erf].input[0]
    i = g.producer.get(t)
    if i is None or g.sole_consumer(t, "Erf") != erf:
        return None
    ins = g.binary(i, "Div")
    if ins and g.scalar_is(ins[1], math.sqrt(2)):
        return ins[0], i
    ins = g.binary(i, "Mul")
    if ins:
        for a, b in (ins, ins[::-1]):
            if g.scalar_is(b, 1 / math.sqrt(2)):
                return a, i
    return None


def _product(g: _Graph, x: str, a: str) -> tuple[list[int], str] | None:
    """The nodes computing ``x * a * 0.5`` from ``a`` (any association), and its output."""
    m = g.sole_consumer(a, "Mul")
    if m is None:
        return None
    f = g.other(m, a)
    out = g.nodes[m].output[0]
    if f == x or g.scalar_is(f, 0.5):  # (x * a) * 0.5 or (a * 0.5) * x
        last = g.sole_consumer(out, "Mul")
        rest = g.other(last, out) if last is not None else None
        if rest is not None and (g.scalar_is(rest, 0.5) if f == x else rest == x):
            return [m, last], g.nodes[last].output[0]
        return None
    p = g.producer.get(f)  # a * (x * 0.5)
    ins = g.binary(p, "Mul") if p is not None and g.sole_consumer(f, "Mul") == m else None
    if ins and x in ins and g.scalar_is(g.other(p, x), 0.5):
        return [p, m], out
    return None


def _match(g: _Graph, erf: int):
    """``(x, members, output)`` of the GELU subgraph around Erf node ``erf``, or None."""
    scaled = _scaled_input(g, erf)
    add = g.sole_consumer(g.nodes[erf].output[0], "Add") if scaled else None
    if add is None or not g.binary(add, "Add"):
        return None
    e = g.nodes[erf].output[0]
    if not g.scalar_is(g.other(add, e), 1.0):
        return None
    x, div = scaled
    product = _product(g, x, g.nodes[add].output[0])
    if product is None:
        return None
    members, out = product
    return x, [div, erf, add, *members], out


def _name(nodes, members, out: str) -> str:
    """The members' common name prefix up to its last '/', then ``Gelu``
    (``/features/block.3/Gelu`` for PyTorch's scoped names)."""
    prefix = os.path.commonprefix([nodes[i].name for i in members])
    cut = prefix.rfind("/")
    return f"{prefix[:cut + 1]}Gelu" if cut >= 0 else f"{out}/gelu"


def fuse_gelu(helper, nodes, constants: dict, graph_outputs: set):
    """``(nodes, fused)``: the node list with every GELU subgraph (module
    docstring) replaced by one ``Gelu`` node where its last node was, and the
    set of ``id()`` of the new nodes (they convert as :data:`GELU_VERSION`).

    Args:
        helper: ``onnx.helper``.
        nodes: the graph's nodes in topological order.
        constants: tensor name -> value of every import-time constant
            (initializers and ``Constant`` node outputs).
        graph_outputs: names of the graph outputs (never fused away).
    """
    g = _Graph(list(nodes), constants, graph_outputs)
    replace, drop = {}, set()
    for i, node in enumerate(g.nodes):
        if node.op_type != "Erf" or node.domain not in ("", "ai.onnx") or i in drop:
            continue
        found = _match(g, i)
        if found is None or drop & set(found[1]):
            continue
        x, members, out = found
        last = max(members)  # the node producing `out`: it depends on every other member
        replace[last] = helper.make_node("Gelu", [x], [out], name=_name(g.nodes, members, out),
                                         approximate="none")
        drop |= set(members)
    result = [replace[i] if i in replace else n for i, n in enumerate(g.nodes) if i in replace or i not in drop]
    return result, {id(n) for n in replace.values()}


__all__ = ["GELU_VERSION", "fuse_gelu"]
