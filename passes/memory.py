"""The memory pass: the in-place plan and the planned peak memory of the schedule.

The executor (``opgraph/executable.py``) runs the nodes in
``Graph.topological`` order over the outputs' ancestors and frees each buffer
right after its last reader (``opgraph.executable.last_readers``). This pass

1. plans in-place steps (:func:`plan_inplace`): a step writes its output into
   the buffer of an input that dies there instead of allocating one. Step
   ``s``, lowered to rule ``R``, overwrites its input ``x`` (position ``k``)
   only when

   * ``R`` declares it can: ``k in R.inplace`` (its kernel takes ``out=``;
     ReLU into x, ReLU-backward into gy, and so the ReLU gradient that fills
     its bias gradient (``ReluBackwardSums``: never into the slot it fills),
     ``Add`` into either addend, threshold and bias add into x);
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

   * neither ``s`` nor ``x`` shares a buffer under the zero-copy plan
     (``passes/zero_copy.py``: producers writing into a concat's buffer,
     the concats, slices run as views and their inputs).

   The first qualifying position of ``R.inplace`` is taken. The plan (an
   ``opgraph.executable.InplacePlan``) goes on the returned graph as
   ``Graph.inplace_plan``; the executor copies it into its steps and decides
   nothing itself. So this pass runs after every pass that rewrites the graph
   (a rewrite drops the plan);
2. replays the schedule without running anything, buffer by buffer: each
   value lives in one buffer, its own, or, when it allocates nothing, that
   of the value it is a view of or written into:

   * a buffer is live from the first step that writes a value into it
     until the last step that reads any value in it (the requested outputs'
     until the end); an output written in place allocates nothing: its
     input's buffer stays live as the output instead of being freed; a
     concat's producers written into its buffer, a concat that is a slice of
     a larger one and a slice run as a view allocate nothing either (the
     zero-copy plan), and a concat's buffer is live from its first
     producer's step; nor does a step whose kernel returns a view of its
     input for these types (``Rule.output_view``: a reshape of a C-ordered
     value, ConvNeXt's transposes that the layout pass made views);
   * during a step the node's scratch space (``Rule.workspace`` of the rule
     and options it was lowered to) is live on top, and so is the result of
     a step the zero-copy plan copies into its slice (``copied_in``);
   * sources (inputs, parameters, gradient feeds) are resident throughout and
     reported apart.

``planned_peak_bytes`` = max over steps of (live outputs + that step's
workspace): what the executor allocates (no buffer reuse across different
values is planned yet). ``inplace`` counts the in-place steps and
``inplace_bytes`` the output bytes they did not allocate; ``zero_copy``
counts the values the zero-copy plan makes views and ``zero_copy_bytes``
the output bytes they did not allocate; ``output_views`` and
``output_view_bytes`` the same for the steps returning a view of their input.
``no_reuse_bytes``
is the sum of every output buffer, in place or not (a framework that never
frees and never reuses).
"""
from __future__ import annotations

import attrs

from opgraph.executable import InplacePlan, last_readers
from opgraph.graph import Graph
from opgraph.op import Lowered, Source
from opgraph.run_types import run_types
from opgraph.backends.registry import Rule, lookup

from .base import Pass, PassContext
from .candidates import rule_workspace
from .zero_copy import plan_views, shared_values


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


def plan_inplace(graph: Graph, outputs, zero_copy: bool = False) -> InplacePlan:
    """The in-place steps of ``outputs``' schedule (conditions in the module
    docstring): node id -> position of the input whose buffer it overwrites;
    with ``zero_copy``, first the zero-copy plan (``passes/zero_copy.py``),
    whose shared buffers the in-place steps then leave alone; last, the steps
    whose kernel returns a view of its input (:func:`output_views`), which the
    replay counts in that input's buffer."""
    order = graph.topological(graph.ancestors(outputs))
    keep = {v.node for v in outputs}
    last = last_readers(graph, order)
    rules = {n: _rule(graph.node(n).op) for n in order}
    homes, views, copied_in = plan_views(graph, outputs, rules) if zero_copy else ({}, frozenset(), frozenset())
    shared = shared_values(graph, homes, views)
    owned: set[int] = set()  # values no other live value shares a buffer with
    writes: dict[int, int] = {}

    def overwritable(x: int, step: int) -> bool:
        others = [r for r in graph.users(x) if r != step and r in rules]
        return (x in owned and x not in shared and last.get(x) == step and x not in keep
                and graph.node(x).type == graph.node(step).type
                and all(rules[r] is not None and rules[r].fresh_output for r in others))

    for n in order:
        rule = rules[n]
        if rule is None or n in shared:  # sources own nothing the executor may write
            continue
        args = graph.input_ids(n)
        for pos in rule.inplace:
            if pos < len(args) and overwritable(args[pos], n):
                writes[n] = pos
                break
        if rule.fresh_output or n in writes:
            owned.add(n)
    plan = InplacePlan(keep, writes, homes, views, copied_in)
    return attrs.evolve(plan, output_views=output_views(graph, order, plan))


def output_views(graph: Graph, order, plan: InplacePlan) -> dict[int, int]:
    """Node id -> position of the input whose buffer its output is a view of,
    for each step whose rule returns a view for these types
    (``Rule.output_view``: a reshape of a C-ordered value, a transpose
    already stored as its output is to be). The types describe packed
    storage, so a step whose input may be strided is left out (its kernel
    may copy: counting a buffer errs on the safe side): a zero-copy slice or
    a region of a concat's buffer under ``plan``, or a source (the caller's
    array, fed with its own strides); and so is a step the plan already
    places (in place, or in its slice of a concat)."""
    placed = plan.homes.keys() | plan.views | plan.writes.keys()
    strided = plan.homes.keys() | plan.views
    out = {}
    for n in order:
        rule = _rule(graph.node(n).op)
        if rule is None or n in placed:
            continue
        view = graph.node(n)
        pos = rule.output_view(view.op.op, view.input_types, view.type)
        if pos is None:
            continue
        x = graph.input_ids(n)[pos]
        if x not in strided and not isinstance(graph.node(x).op, Source):
            out[n] = pos
    return out


def _buffers(graph: Graph, order, plan: InplacePlan) -> dict[int, int]:
    """Value node id -> the node id of the value owning its buffer: itself,
    or, for a value that allocates nothing, the owner of the buffer it is
    written into (in place, or its slice of a concat, whose owner is the
    outermost concat: never written in place) or a view of (a zero-copy
    slice, or a step returning a view: ``plan.output_views``)."""
    aliases = plan.output_views
    owner: dict[int, int] = {}
    for n in order:  # inputs first, so their owners are known
        if n in plan.homes:
            root = n
            while root in plan.homes:
                root = plan.homes[root][0]
            owner[n] = root
        elif n in plan.writes:
            owner[n] = owner[graph.input_ids(n)[plan.writes[n]]]
        elif n in plan.views:
            owner[n] = owner[graph.input_ids(n)[0]]
        elif n in aliases:
            owner[n] = owner[graph.input_ids(n)[aliases[n]]]
        else:
            owner[n] = n
    return owner


def _run_bytes(graph: Graph, order, dtype: str | None) -> dict[int, int]:
    """Node id -> bytes of its value in the dtype it runs in (batch statistics
    and sums stay float32 under compile(dtype='bfloat16'), as the executor
    allocates them)."""
    return {n: t.nbytes for n, t in run_types(graph, order, dtype).items()}


def _live_bytes(graph: Graph, order, plan: InplacePlan, nbytes: dict[int, int], keep) -> dict[int, int]:
    """Node id -> bytes of the buffers live during its step, for each step of
    ``order`` that is not a source (the module docstring, step 2): sources
    aside, workspace and a result copied into its slice aside."""
    owner = _buffers(graph, order, plan)
    position = {n: i for i, n in enumerate(order)}
    never = len(order)  # kept to the end: requested outputs, values nothing reads
    born: dict[int, int] = {}
    dies: dict[int, int] = {}
    last = last_readers(graph, order)
    for n in order:
        b = owner[n]
        born[b] = min(born.get(b, never), position[n])
        end = never if n in keep or n not in last else position[last[n]]
        dies[b] = max(dies.get(b, 0), end)
    allocs: dict[int, list[int]] = {}
    frees: dict[int, list[int]] = {}
    for b in born:
        if not isinstance(graph.node(b).op, Source):
            allocs.setdefault(born[b], []).append(b)
            frees.setdefault(dies[b], []).append(b)
    live, out = 0, {}
    for i, n in enumerate(order):
        if isinstance(graph.node(n).op, Source):
            continue
        live += sum(nbytes[b] for b in allocs.get(i, ()))
        out[n] = live
        live -= sum(nbytes[b] for b in frees.get(i, ()))
    return out


@attrs.frozen
class StepBytes:
    """The bytes one step of the schedule holds (module docstring, step 2).

    Attributes:
        live: activations live during the step: each buffer from the step
            that first writes it to the last that reads it (sources aside:
            resident throughout, reported apart).
        copied: its own result, when the zero-copy plan copies it into its
            slice of a concat (``InplacePlan.copied_in``): held with the slice
            for the copy, then dropped; else 0.
        workspace: its kernel's scratch space (``Rule.workspace``).
    """

    live: int
    copied: int
    workspace: int

    @property
    def planned(self) -> int:
        """The bytes the step sets the planned peak to."""
        return self.live + self.copied + self.workspace


def step_bytes(graph: Graph, outputs, dtype: str | None = None,
               inplace: InplacePlan | None = None) -> dict[int, StepBytes]:
    """Node id -> :class:`StepBytes` of every step of ``outputs``' schedule
    that is not a source; the maximum of their ``planned`` is
    :func:`plan_memory`'s ``planned_peak_bytes``, of their ``live`` its
    ``activation_peak_bytes``.

    Args:
        dtype: the dtype values run in (compile's override; None: as declared).
        inplace: the in-place steps and the zero-copy plan; default
            :func:`plan_inplace` of this graph (without zero-copy).
    """
    plan = plan_inplace(graph, outputs) if inplace is None else inplace
    order = graph.topological(graph.ancestors(outputs))
    return _step_bytes(graph, order, plan, _run_bytes(graph, order, dtype), {v.node for v in outputs})


def _step_bytes(graph: Graph, order, plan: InplacePlan, nbytes: dict[int, int], keep) -> dict[int, StepBytes]:
    out = {}
    for n, live in _live_bytes(graph, order, plan, nbytes, keep).items():
        view = graph.node(n)
        ws = _workspace(view.op, view.input_types) if isinstance(view.op, Lowered) else 0
        out[n] = StepBytes(live, nbytes[n] if n in plan.copied_in else 0, ws)
    return out


def plan_memory(graph: Graph, outputs, dtype: str | None = None,
                inplace: InplacePlan | None = None) -> dict:
    """The liveness plan of ``outputs``' schedule (keys in the module docstring).

    Args:
        inplace: the in-place steps and the zero-copy plan; default
            :func:`plan_inplace` of this graph (without zero-copy).

    Returns:
        ``planned_peak_bytes``, ``activation_peak_bytes``, ``workspace_peak_bytes``
        (a result copied into its concat slice counts as its step's workspace),
        ``source_bytes``, ``no_reuse_bytes``, ``peak_step`` (node name),
        ``inplace`` (steps), ``inplace_bytes``, ``zero_copy`` (values),
        ``zero_copy_bytes``, ``output_views`` (steps), ``output_view_bytes``.
    """
    plan = plan_inplace(graph, outputs) if inplace is None else inplace
    order = graph.topological(graph.ancestors(outputs))
    nbytes = _run_bytes(graph, order, dtype)
    steps = _step_bytes(graph, order, plan, nbytes, {v.node for v in outputs})
    aliases = plan.output_views
    peak = act_peak = ws_peak = sources = total = saved = views = view_bytes = 0
    peak_step = None
    for n in order:
        view = graph.node(n)
        size = nbytes[n]
        if isinstance(view.op, Source):
            sources += size
            continue
        total += size
        saved += size if n in plan.writes else 0
        if n in plan.homes or n in plan.views:
            views, view_bytes = views + 1, view_bytes + size
        st = steps[n]
        ws_peak = max(ws_peak, st.workspace + st.copied)
        act_peak = max(act_peak, st.live)
        if st.planned > peak:
            peak, peak_step = st.planned, view.name
    return {"planned_peak_bytes": peak, "activation_peak_bytes": act_peak,
            "workspace_peak_bytes": ws_peak, "source_bytes": sources, "no_reuse_bytes": total,
            "peak_step": peak_step, "inplace": len(plan.writes), "inplace_bytes": saved,
            "zero_copy": views, "zero_copy_bytes": view_bytes,
            "output_views": len(aliases), "output_view_bytes": sum(nbytes[n] for n in aliases)}


class MemoryPass(Pass):
    """Plan the in-place steps and, with ``zero_copy`` (the default), the
    zero-copy concats and slices (on the returned graph: ``Graph.inplace_plan``,
    which the executor follows) and record the planned peak memory in
    ``ctx.report.memory``."""

    name = "memory"

    def __init__(self, zero_copy: bool = True):
        self.zero_copy = zero_copy

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        plan = plan_inplace(graph, outputs, zero_copy=self.zero_copy)
        graph.inplace_plan = plan
        ctx.report.memory.update(plan_memory(graph, outputs, ctx.dtype, plan))
        return graph


__all__ = ["MemoryPass", "plan_inplace", "plan_memory", "step_bytes", "StepBytes", "output_views"]
