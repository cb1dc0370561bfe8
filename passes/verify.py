"""The verify pass: the last check before an ``Executable`` is built.

Among the outputs' ancestors every node must be a source or a ``Lowered`` op
whose algorithm has a registered rule for its op type, lowered for the
compile's device. Anything else is a ``LoweringError`` listing every
offending node (not just the first), so a custom pipeline that forgot the
lower pass, or a rule unregistered meanwhile, fails here and not mid-run.
"""

from __future__ import annotations

from opgraph.errors import LoweringError
from opgraph.graph import Graph
from opgraph.op import Lowered, Source
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


class VerifyPass(Pass):
    """Fail if any ancestor of the outputs is not runnable (see module doc)."""

    name = "verify"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        bad = problems(graph, outputs, ctx.device)
        if bad:
            raise LoweringError(f"{len(bad)} node(s) cannot run on {ctx.device}:\n  " + "\n  ".join(bad))
        return graph


__all__ = ["VerifyPass", "problems"]
