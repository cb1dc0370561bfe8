"""The verify pass: the last check before an ``Executable`` is built.

Among the outputs' ancestors every node must be a source or a ``Lowered`` op
whose algorithm has a registered rule for its op type, lowered for the
compile's device. Anything else is a ``LoweringError`` listing every
offending node (not just the first), so a custom pipeline that forgot the
lower pass, or a rule unregistered meanwhile, fails here and not mid-run.

A slot (an op ``filled_by_reader``, whose step only allocates) must have
exactly one reader that fills it (``Op.fills``), be the slot that reader
expects on the same inputs (``Op.filled_slot``), and its other readers must
run after that one (descend from it): else a step would read memory nobody
wrote, or a value other than the slot's (:func:`slot_problems`).
"""

from __future__ import annotations

import networkx as nx

from opgraph.errors import LoweringError
from opgraph.graph import Graph
from opgraph.op import Lowered, Source, abstract_of
from opgraph.backends.registry import rules_for

from .base import Pass, PassContext


def problems(graph: Graph, outputs, device: str) -> list[str]:
    """One line per node that cannot run on ``device`` (empty if all can)."""
    out = []
    for view in graph.nodes_in_order(outputs):
        op = view.op
        if isinstance(op, Source):
            continue
        if not isinstance(op, Lowered):
            out.append(f"{view.name} ({op.name}) is abstract: the lower pass did not run on it")
        elif op.algorithm not in rules_for(type(op.op)):
            out.append(f"{view.name}: no {op.algorithm!r} rule is registered for {op.op.name}")
        elif op.device != device:
            out.append(f"{view.name}: lowered for {op.device}, compiling for {device}")
    return out


def slot_problems(graph: Graph, outputs) -> list[str]:
    """One line per slot whose filling is not as ``Op.fills`` requires (module docstring)."""
    out = []
    nodes = graph.ancestors(outputs)
    for node in sorted(nodes):
        view = graph.node(node)
        op = abstract_of(view.op)
        for k in op.fills:
            slot = graph.input_ids(node)[k]
            want, reads = op.filled_slot(k)
            have = abstract_of(graph.node(slot).op)
            if not have.filled_by_reader:
                out.append(f"{view.name} ({op.name}) fills its input {k}, "
                           f"{graph.node(slot).name}, which is not a slot")
            elif have != want or graph.input_ids(slot) != [graph.input_ids(node)[i] for i in reads]:
                # else the slot's value (its reference, what checks compare with) is not what is written
                out.append(f"{view.name} ({op.name}) fills {graph.node(slot).name} ({have.describe()}), "
                           f"which must be {want.describe()} reading its inputs {list(reads)}")
        if not op.filled_by_reader:
            continue
        readers = [u for u in graph.users(node) if u in nodes]
        fillers = [u for u in readers
                   if any(graph.input_ids(u)[k] == node for k in abstract_of(graph.node(u).op).fills)]
        if len(fillers) != 1:
            out.append(f"{view.name} ({op.name}) is a slot with {len(fillers)} readers filling it, not 1")
            continue
        early = [graph.node(u).name for u in readers
                 if u != fillers[0] and not nx.has_path(graph.nx, fillers[0], u)]
        if early:
            out.append(f"{view.name} ({op.name}) is read by {', '.join(early)} before "
                       f"{graph.node(fillers[0]).name} fills it")
    return out


class VerifyPass(Pass):
    """Fail if any ancestor of the outputs is not runnable (see module doc)."""

    name = "verify"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        bad = problems(graph, outputs, ctx.device) + slot_problems(graph, outputs)
        if bad:
            raise LoweringError(f"{len(bad)} node(s) cannot run on {ctx.device}:\n  " + "\n  ".join(bad))
        return graph


__all__ = ["VerifyPass", "problems", "slot_problems"]
