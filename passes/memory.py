"""The memory pass: the in-place plan and the planned peak memory of the schedule.

The executor (``opgraph/executable.py``) runs the nodes in
``Graph.topological`` order over the outputs' ancestors and frees each buffer
right after its last reader (``opgraph.executable.last_readers``). This pass

1. plans in-place steps (:func:`plan_inplace`): a step writes its output into
   the buffer of an input that dies there instead of allocating one. Step
   ``s``, lowered to rule ``R``, overwrites its input ``x`` (position ``k``)
   only when

   * ``R`` declares it can: ``k in R.inplace`` (its kernel takes ``out=``;
     ReLU into x, ReLU-backward into gy, ``Add`` into either addend, threshold
     and bias add into x);
   * ``s`` is ``x``'s last reader and ``x`` is not a requested output;
   * ``x`` is not a source (input, parameter, gradient feed: the caller's arrays);
   * no other live value shares ``x``'s buffer. Some kernels may return a
     view of an input (a reshape, a slice, an unaudited rule), so the rule is
     conservative: ``x``'s producer declares ``Rule.fresh_output`` (a new
     array every call) or itself wrote in place into a buffer it owned, and
     every other reader of ``x`` declares ``fresh_output`` too (none of them
     may hand out a view of ``x``). Anything undeclared is never overwritten;
   * ``x`` and the output have one type: shape, dtype and layout (an NHWC
     value is a channels-last view; the kernel writes through ``out``'s
     strides, so the output keeps ``x``'s storage order).

   The first qualifying position of ``R.inplace`` is taken. The plan (an
   ``opgraph.executable.InplacePlan``) goes on the returned graph as
   ``Graph.inplace_plan``; the executor copies it into its steps and decides
   nothing itself. So this pass runs after every pass that rewrites the graph
   (a rewrite drops the plan);
2. replays the schedule without running anything:

   * a node's output buffer is live from its step until its last reader's
     step (the requested outputs until the end); an output written in place
     allocates nothing: its input's buffer stays live as the output instead
     of being freed;
   * during a step the node's scratch space (``Rule.workspace`` of the rule
     and options it was lowered to) is live on top;
   * sources (inputs, parameters, gradient feeds) are resident throughout and
     reported apart.

``planned_peak_bytes`` = max over steps of (live outputs + that step's
workspace): what the executor allocates (no buffer reuse across different
values is planned yet). ``inplace`` counts the in-place steps and
``inplace_bytes`` the output bytes they did not allocate. ``no_reuse_bytes``
is the sum of every output buffer, in place or not (a framework that never
frees and never reuses).
"""
from __future__ import annotations

from opgraph.executable import InplacePlan, last_readers
from opgraph.graph import Graph
from opgraph.op import Lowered, Source
from opgraph.types import TensorType, is_float
from opgraph.backends.registry import Rule, lookup

from .base import Pass, PassContext
from .candidates import rule_workspace


def _nbytes(t: TensorType, dtype: str | None) -> int:
    if dtype is not None and is_float(t.dtype):
        t = TensorType(t.shape, dtype)
    return t.nbytes


def _rule(op) -> Rule | None:
    """The registry rule a lowered node runs (None: a source, an abstract or
    unregistered node)."""
    if not isinstance(op, Lowered):
        return None
    try:
        return lookup(type(op.op), op.algorithm)
    except KeyError:
        return None


def _workspace(op: Lowered, in_types) -> int:
    rule = _rule(op)
    return 0 if rule is None else rule_workspace(rule, op.op, in_types, op.option_dict)


def plan_inplace(graph: Graph, outputs) -> InplacePlan:
    """The in-place steps of ``outputs``' schedule (conditions in the module
    docstring): node id -> position of the input whose buffer it overwrites."""
    order = graph.topological(graph.ancestors(outputs))
    keep = {v.node for v in outputs}
    last = last_readers(graph, order)
    rules = {n: _rule(graph.node(n).op) for n in order}
    owned: set[int] = set()  # values no other live value shares a buffer with
    writes: dict[int, int] = {}

    def overwritable(x: int, step: int) -> bool:
        others = [r for r in graph.users(x) if r != step and r in rules]
        return (x in owned and last.get(x) == step and x not in keep
                and graph.node(x).type == graph.node(step).type
                and all(rules[r] is not None and rules[r].fresh_output for r in others))

    for n in order:
        rule = rules[n]
        if rule is None:  # sources own nothing the executor may write
            continue
        args = graph.input_ids(n)
        for pos in rule.inplace:
            if pos < len(args) and overwritable(args[pos], n):
                writes[n] = pos
                break
        if rule.fresh_output or n in writes:
            owned.add(n)
    return InplacePlan(keep, writes)


def plan_memory(graph: Graph, outputs, dtype: str | None = None,
                inplace: InplacePlan | None = None) -> dict:
    """The liveness plan of ``outputs``' schedule (keys in the module docstring).

    Args:
        inplace: the in-place steps; default :func:`plan_inplace` of this graph.

    Returns:
        ``planned_peak_bytes``, ``activation_peak_bytes``, ``workspace_peak_bytes``,
        ``source_bytes``, ``no_reuse_bytes``, ``peak_step`` (node name),
        ``inplace`` (steps), ``inplace_bytes``.
    """
    plan = plan_inplace(graph, outputs) if inplace is None else inplace
    order = graph.topological(graph.ancestors(outputs))
    keep = {v.node for v in outputs}
    frees: dict[int, list[int]] = {}
    for node, reader in last_readers(graph, order).items():
        if node not in keep:
            frees.setdefault(reader, []).append(node)
    live = peak = act_peak = ws_peak = sources = total = saved = 0
    peak_step = None
    for n in order:
        view = graph.node(n)
        size = _nbytes(view.type, dtype)
        if isinstance(view.op, Source):
            sources += size
            continue
        total += size
        taken = graph.input_ids(n)[plan.writes[n]] if n in plan.writes else None
        if taken is None:
            live += size
        else:  # the output is the dying input's buffer (same type, same bytes)
            saved += size
        ws = _workspace(view.op, view.input_types) if isinstance(view.op, Lowered) else 0
        ws_peak = max(ws_peak, ws)
        act_peak = max(act_peak, live)
        if live + ws > peak:
            peak, peak_step = live + ws, view.name
        for u in frees.get(n, ()):
            if u != taken and not isinstance(graph.node(u).op, Source):
                live -= _nbytes(graph.node(u).type, dtype)
    return {"planned_peak_bytes": peak, "activation_peak_bytes": act_peak,
            "workspace_peak_bytes": ws_peak, "source_bytes": sources, "no_reuse_bytes": total,
            "peak_step": peak_step, "inplace": len(plan.writes), "inplace_bytes": saved}


class MemoryPass(Pass):
    """Plan the in-place steps (on the returned graph: ``Graph.inplace_plan``,
    which the executor follows) and record the planned peak memory in
    ``ctx.report.memory``."""

    name = "memory"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        plan = plan_inplace(graph, outputs)
        graph.inplace_plan = plan
        ctx.report.memory.update(plan_memory(graph, outputs, ctx.dtype, plan))
        return graph


__all__ = ["MemoryPass", "plan_inplace", "plan_memory"]
