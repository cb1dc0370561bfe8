"""The memory pass: the planned peak memory of the schedule, reported.

The executor (``opgraph/executable.py``) runs the nodes in
``Graph.topological`` order over the outputs' ancestors and frees each buffer
right after its last reader. This pass replays that plan without running
anything:

* a node's output buffer is live from its step until its last reader's step
  (the requested outputs until the end);
* during a step the node's scratch space (``Rule.workspace`` of the rule and
  options it was lowered to) is live on top;
* sources (inputs, parameters, gradient feeds) are resident throughout and
  reported apart.

``planned_peak_bytes`` = max over steps of (live outputs + that step's
workspace). That is the liveness bound; no buffer reuse across shapes and no
in-place ReLU are planned yet (``inplace``: 0 in the report), so it is what the
executor allocates, not less. ``no_reuse_bytes`` is the sum of every output
buffer (a framework that never frees).
"""

from __future__ import annotations

from opgraph.graph import Graph
from opgraph.op import Lowered, Source
from opgraph.types import TensorType
from opgraph.backends.registry import lookup

from .base import Pass, PassContext
from .lower import rule_workspace


def _nbytes(t: TensorType, dtype: str | None) -> int:
    if dtype is not None and t.dtype.startswith(("float", "bfloat")):
        t = TensorType(t.shape, dtype)
    return t.nbytes


def _workspace(op: Lowered, in_types) -> int:
    try:
        rule = lookup(type(op.op), op.algorithm)
    except KeyError:
        return 0
    return rule_workspace(rule, op.op, in_types, op.option_dict)


def plan_memory(graph: Graph, outputs, dtype: str | None = None) -> dict:
    """The liveness plan of ``outputs``' schedule (keys in the module docstring).

    Returns:
        ``planned_peak_bytes``, ``activation_peak_bytes``, ``workspace_peak_bytes``,
        ``source_bytes``, ``no_reuse_bytes``, ``peak_step`` (node name), ``inplace``.
    """
    order = graph.topological(graph.ancestors(outputs))
    keep = {v.node for v in outputs}
    last: dict[int, int] = {}
    for i, n in enumerate(order):
        for u in graph.input_ids(n):
            last[u] = i
    frees: dict[int, list[int]] = {}
    for node, i in last.items():
        if node not in keep:
            frees.setdefault(i, []).append(node)
    live = peak = act_peak = ws_peak = sources = total = 0
    peak_step = None
    for i, n in enumerate(order):
        view = graph.node(n)
        size = _nbytes(view.type, dtype)
        if isinstance(view.op, Source):
            sources += size
            continue
        live += size
        total += size
        ws = _workspace(view.op, view.input_types) if isinstance(view.op, Lowered) else 0
        ws_peak = max(ws_peak, ws)
        act_peak = max(act_peak, live)
        if live + ws > peak:
            peak, peak_step = live + ws, view.name
        for u in frees.get(i, ()):
            if not isinstance(graph.node(u).op, Source):
                live -= _nbytes(graph.node(u).type, dtype)
    return {"planned_peak_bytes": peak, "activation_peak_bytes": act_peak,
            "workspace_peak_bytes": ws_peak, "source_bytes": sources, "no_reuse_bytes": total,
            "peak_step": peak_step, "inplace": 0}


class MemoryPass(Pass):
    """Record the planned peak memory in ``ctx.report.memory`` (graph unchanged)."""

    name = "memory"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        ctx.report.memory.update(plan_memory(graph, outputs, ctx.dtype))
        return graph


__all__ = ["MemoryPass", "plan_memory"]
