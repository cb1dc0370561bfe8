"""A fusion rule table: each rule a pattern over the lowered graph and its rewrite.

In the spirit of tinygrad's ``PatternMatcher`` (a list of pattern -> rewrite
pairs, tried in order until nothing changes), over our ``Graph`` API: a
:class:`FusionRule` has a ``match(scope, view)`` that says whether node
``view`` roots a fusion (returning a :class:`Match`) and a ``rewrite(graph,
match, ctx)`` that performs it through ``Graph.rewrite`` / ``Graph.absorb``
(never editing ``graph.nx``) and returns None when done, else why not.

:func:`apply_table` applies a table in order: each rule is swept over the
graph until a sweep rewrites nothing (its fixed point) before the next rule
runs, and the whole table is swept again while anything changed. So an
earlier rule has priority: the convolution epilogues (cuDNN's fused graphs)
come before the generated element-wise kernels, which would otherwise take
the same ReLU. A match whose rewrite declined is not tried again.

The conditions patterns state live in :class:`Scope`: the nodes the outputs
depend on (a reader outside them is dead code and does not count), which of
them are outputs, and which value has one reader only (``private``). The
scope follows the rewrites (absorbed nodes leave it).

:func:`rewrite_lowered` is the common rewrite: the root node computes a fused
op on new inputs with an algorithm's rule for that op, the absorbed nodes
are removed (their readers read the root), and the lowering report moves
their records onto the root's (``NodeReport.absorbed``), so ``exe.report``
shows what each fused node absorbed.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import attrs
import networkx as nx

from opgraph.backends.registry import rules_for
from opgraph.graph import Graph, NodeView, Value
from opgraph.op import Lowered, Op, abstract_of

from .base import PassContext
from .candidates import decline_reason
from .report import NodeReport


@attrs.frozen
class Match:
    """What a pattern found.

    Attributes:
        root: the node that carries the result (keeps its id, name and
            readers).
        absorbed: the other nodes the rewrite removes, in graph order.
        label: what it fuses, for the report (``'conv + bias + relu'``);
            the notes count the matches of one label together.
        data: whatever the rule's rewrite needs beyond the nodes.
        rewired: other nodes of the scope that the rewrite makes read values
            it adds, in graph order, all before ``root`` (the scope places
            what they read, as it does for the root).
    """

    root: int
    absorbed: tuple[int, ...] = attrs.field(converter=tuple)
    label: str
    data: Any = None
    rewired: tuple[int, ...] = attrs.field(default=(), converter=tuple)

    @property
    def nodes(self) -> tuple[int, ...]:
        return (self.root, *self.absorbed)


@attrs.frozen
class FusionRule:
    """One entry of a fusion table.

    Attributes:
        name: the rule's name; ``exclude=[name]`` in the policy turns it off
            alone (``exclude=['fused']`` turns off every rule, through the
            ``fused`` tag of the fused ops' lowering rules).
        match: ``(scope, view) -> Match | None``.
        rewrite: ``(graph, match, ctx) -> None | str`` (why not).
        consumers_first: sweep from the graph's outputs towards its inputs,
            so that a chain is matched at its last node (maximal chains).
    """

    name: str
    match: Callable[["Scope", NodeView], Match | None]
    rewrite: Callable[[Graph, Match, PassContext], str | None]
    consumers_first: bool = False


class Scope:
    """The outputs' ancestors of a graph under rewrite, and the conditions on them.

    Args:
        graph: the graph the table rewrites.
        outputs: the values the compile returns.
        ctx: the pass context (device, policy) the patterns ask.
    """

    def __init__(self, graph: Graph, outputs: Sequence[Value], ctx: PassContext):
        self.graph, self.ctx = graph, ctx
        self.outputs = frozenset(v.node for v in outputs)
        self.nodes = graph.ancestors(outputs)
        self.notes: dict[str, set[str]] = {}
        #: rule name -> the ``include`` name its matches waited for (``fused-reference`` on the oracles)
        self.waiting: dict[str, str] = {}
        #: rule name -> rewrites it made / matches whose rewrite declined
        self.applied: dict[str, int] = {}
        self.declined: dict[str, int] = {}
        self._ordered()

    def _ordered(self) -> None:
        self._order = self.graph.topological(self.nodes)
        self.position = {n: k for k, n in enumerate(self._order)}

    def rewired(self, root: int) -> None:
        """Keep the scope and its order right after ``root`` was rewritten: most
        rewrites make a node read its ancestors' values only (the order stays
        valid), but one may read nodes it added (``bn-backward-sums``: the
        data gradient reads a new sums node; ``bn-gradient-remat``: a chain of
        new nodes), which join the scope, or a sibling, which can sit later."""
        inputs = self.graph.input_ids(root)
        added = self._new_ancestors(root)
        self.nodes |= set(added)
        if any(self.position[u] > self.position[root] for u in inputs if u in self.position):
            self._ordered()
        elif added and not self._placed_before(root, added):
            self._ordered()

    def _new_ancestors(self, root: int) -> list[int]:
        """The nodes outside the scope's order that ``root`` reads, directly or
        through one another (what a rewrite added), inputs first."""
        out: list[int] = []
        stack = [(root, iter(dict.fromkeys(self.graph.input_ids(root))))]
        seen: set[int] = set()
        while stack:  # depth first, a node after its inputs
            node, inputs = stack[-1]
            u = next((u for u in inputs if u not in self.position and u not in seen), None)
            if u is None:
                stack.pop()
                if node != root:
                    out.append(node)
                continue
            seen.add(u)
            stack.append((u, iter(dict.fromkeys(self.graph.input_ids(u)))))
        return out

    def _placed_before(self, root: int, added: list[int]) -> bool:
        """Put new nodes (inputs first) that read only values ordered before
        ``root`` or earlier new nodes right before it (between it and its
        predecessor), without sorting the whole graph again: a rule adding a
        node per match (``bn-stats-parts`` adds one per feature map of
        DenseNet-121) made every rewrite a full topological sort, 13 of a
        14 s compile. False (nothing done) where a new node reads a later one."""
        at = self.position[root]
        earlier: set[int] = set()
        for a in added:
            if any(i not in earlier and self.position.get(i, at) >= at for i in self.graph.input_ids(a)):
                return False
            earlier.add(a)
        k = self._order.index(root)
        before = self.position[self._order[k - 1]] if k else at - 1
        for j, a in enumerate(added, start=1):  # positions only need to sort: fractions of the gap
            self.position[a] = before + (at - before) * j / (len(added) + 1)
        self._order[k:k] = added
        return True

    def __contains__(self, node: int) -> bool:
        return node in self.nodes

    def order(self, consumers_first: bool = False) -> list[int]:
        """The scope's nodes in topological order (reversed: consumers first)."""
        order = [n for n in self._order if n in self.nodes]
        return order[::-1] if consumers_first else order

    def sorted(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` of the scope in its topological order."""
        return sorted(nodes, key=self.position.__getitem__)

    def op(self, node: int) -> Op:
        """The abstract op of ``node`` (behind its ``Lowered``)."""
        return abstract_of(self.graph.node(node).op)

    def algorithm(self, node: int) -> str | None:
        """The algorithm ``node`` is lowered to, or None (not lowered yet)."""
        op = self.graph.node(node).op
        return op.algorithm if isinstance(op, Lowered) else None

    def readers(self, node: int) -> list[int]:
        """The nodes of the scope reading ``node``."""
        return [u for u in self.graph.users(node) if u in self.nodes]

    def is_output(self, node: int) -> bool:
        return node in self.outputs

    def private(self, node: int, readers: Iterable[int]) -> bool:
        """Whether ``node`` is no output and read by ``readers`` only (in the scope)."""
        return not self.is_output(node) and set(self.readers(node)) <= set(readers)

    def note(self, rule: str, why: str, waits_for: str | None = None) -> None:
        """Remember, once, why ``rule`` passed nodes over (reported by the pass);
        ``waits_for``: the ``include`` name that would have let it match."""
        self.notes.setdefault(rule, set()).add(why)
        if waits_for is not None:
            self.waiting[rule] = waits_for

    def removed(self, nodes: Iterable[int]) -> None:
        self.nodes -= set(nodes)


@attrs.define
class Tally:
    """The outcome of one label: fused node names and declined ones with why."""

    done: list[str] = attrs.field(factory=list)
    skipped: list[str] = attrs.field(factory=list)


def apply_table(rules: Sequence[FusionRule], graph: Graph, outputs: Sequence[Value], ctx: PassContext,
                max_rounds: int = 16) -> tuple[dict[str, Tally], Scope]:
    """Apply ``rules`` to ``graph`` in order, each to its fixed point (module docstring).

    Returns:
        ``(tallies, scope)``: per match label, the fused and the declined
        matches (node names joined by ``' + '``), in the order first seen;
        the scope holds the notes of the rules.
    """
    scope = Scope(graph, outputs, ctx)
    tallies: dict[str, Tally] = {}
    refused: set = set()
    for _ in range(max_rounds):
        changed = False
        for rule in rules:
            if rule.name in ctx.policy.exclude:
                scope.note(rule.name, f"excluded by policy (exclude=[{rule.name!r}])")
                continue
            while _sweep(rule, graph, scope, ctx, tallies, refused):
                changed = True
        if not changed:
            break
    return tallies, scope


def _sweep(rule, graph, scope, ctx, tallies, refused) -> bool:
    """One sweep of ``rule`` over the scope; whether it rewrote anything."""
    changed = False
    for node in scope.order(rule.consumers_first):
        if node not in scope:  # absorbed earlier in this sweep
            continue
        m = rule.match(scope, graph.node(node))
        key = (rule.name, m.nodes) if m is not None else None
        if m is None or key in refused:
            continue
        names = " + ".join(graph.node(n).name for n in m.nodes)
        why = rule.rewrite(graph, m, ctx)
        tally = tallies.setdefault(m.label, Tally())
        if why:
            refused.add(key)
            tally.skipped.append(f"{names} ({why})")
            scope.declined[rule.name] = scope.declined.get(rule.name, 0) + 1
        else:
            scope.applied[rule.name] = scope.applied.get(rule.name, 0) + 1
            scope.removed(m.absorbed)
            for n in (*m.rewired, m.root):
                scope.rewired(n)
            tally.done.append(names)
            changed = True
    return changed


def rewrite_lowered(graph: Graph, root: int, absorbed: Sequence[int], fused: Op, inputs: Sequence[Value],
                    algorithm: str, ctx: PassContext, options: dict | None = None,
                    what: str = "fused kernel") -> str | None:
    """Make ``root`` compute ``fused`` on ``inputs`` with ``algorithm``'s rule for it.

    The ``absorbed`` nodes are removed, the last first; readers they still
    have read ``root`` instead (an epilogue's activation), which must then
    have ``root``'s shape. Their report records go, listed in the root's
    ``absorbed``.

    Returns:
        None when done, else why not (nothing changed then): the policy
        forces an absorbed node onto another algorithm, ``algorithm`` has no
        rule for the fused op, the policy excludes it, or it declines.
    """
    names = [graph.node(a).name for a in absorbed]
    why = forced_elsewhere(graph, root, absorbed, algorithm, ctx)
    if why:
        return why
    if options is None:  # engine indices belong to one cuDNN graph: the fused graph's are chosen anew
        options = {k: v for k, v in getattr(graph.node(root).op, "options", ()) if k != "engine"}
    new = lowered_for(fused, tuple(v.type for v in inputs), algorithm, ctx, options, what)
    if isinstance(new, str):
        return new
    name = graph.node(root).name
    ops = {n: graph.node(a).op for n, a in zip(names, absorbed)}
    graph.rewrite(root, new, inputs)
    for a in reversed(list(absorbed)):  # readers first: a member's readers are later members
        if not graph.users(a) or graph.node(a).type.shape == graph.node(root).type.shape:
            graph.absorb(a, root)  # else read by dead code only (outside the scope): left to it
    report_rewrite(ctx, name, new, names, ops)
    return None


def add_lowered(graph: Graph, lowered: Lowered, inputs: Sequence[Value], name: str, ctx: PassContext) -> Value:
    """A node a rewrite makes (no abstract twin): ``lowered`` on ``inputs``,
    named ``name`` (``name_2``, ... when a node already has it), which no
    ``force`` key names, with the lowering record the lower pass keeps for its
    nodes (so ``exe.report`` lists it).

    Raises:
        ShapeError: ``lowered`` rejects ``inputs`` (``Graph.add_node``).
    """
    made = graph.add_node(lowered, inputs, name=graph.unique_name(name))
    view = graph.node(made.node)
    ctx.aliases[view.name] = None
    op = lowered.op
    ctx.report.record(NodeReport(node=view.id, name=view.name, op=op.describe(), op_type=op.name,
                                 order=[lowered.algorithm], algorithm=lowered.algorithm,
                                 options=dict(lowered.options), chosen=lowered.describe()))
    return made


def forced_onto(ctx: PassContext, name: str) -> str | None:
    """The algorithm ``ctx.policy`` forces node ``name`` onto, or None. A node a
    pass added (``ctx.aliases[name]`` None: a rewrite's copy, legalize's crop)
    is never forced, whatever key its name matches (``force={'bn/*': ...}``
    meant the user's ``bn/stats``, not the fuse pass's ``bn/remat``); a node a
    pass repurposed answers to its alias."""
    alias = ctx.aliases.get(name, name)
    return None if alias is None else ctx.policy.forced(alias)


def forced_elsewhere(graph: Graph, root: int, nodes: Sequence[int], algorithm: str,
                     ctx: PassContext) -> str | None:
    """Why a rewrite of ``root`` (lowered to ``algorithm``) must not absorb or
    rewrite ``nodes``: one of them is forced onto another algorithm, and
    fusing would drop the user's choice; None when none is."""
    for node in nodes:
        name = graph.node(node).name
        forced = forced_onto(ctx, name)
        if forced is not None and forced != algorithm:
            return f"{name} is forced to {forced}, {graph.node(root).name} runs {algorithm}"
    return None


def lowered_for(fused: Op, types: Sequence, algorithm: str, ctx: PassContext, options: dict,
                what: str = "fused kernel") -> Lowered | str:
    """``fused`` on inputs of ``types`` lowered to ``algorithm``'s rule for it
    with ``options``, or why not: no such rule, the policy excludes it, or it
    declines the node."""
    rule = rules_for(type(fused)).get(algorithm)
    if rule is None:
        return f"{algorithm} has no {what}"
    why = (ctx.policy.exclusion(rule.algorithm, rule.tags)
           or decline_reason(rule, fused, tuple(types), ctx.device, ctx.policy, options))
    return why or Lowered(fused, algorithm, ctx.device, options)


def slot_match(scope: "Scope", rule: str, label: str, slot: int, filler: int,
               what: tuple[str, str]) -> Match | None:
    """The match of a rule making node ``slot`` a slot that ``filler`` fills (``Op.fills``; the
    match's root and data), or None where a reader of ``slot`` does not descend from ``filler`` by
    a path avoiding ``slot``: it would read the slot before it is written (``passes/verify.py``'s
    condition), noted in the words ``what`` (the slot's value, the filler)."""
    without = nx.restricted_view(scope.graph.nx, [slot], [])
    early = next((r for r in scope.readers(slot) if not nx.has_path(without, filler, r)), None)
    if early is not None:
        scope.note(rule, f"a reader of the {what[0]} does not run after the {what[1]} "
                         f"({scope.graph.node(early).name})")
        return None
    # the filler comes to read the slot, which sits after it in the scope's order: re-placed after
    # the rewrite
    return Match(slot, (), label, filler, rewired=(filler,))


def lowered_slot_pair(graph: Graph, slot: tuple, filler: tuple, nodes: Sequence[int], algorithms,
                      ctx: PassContext):
    """``(slot, filler)`` lowered to the first of ``algorithms`` with rules for both (each an
    ``(op, input types, what)``) that the policy forces none of ``nodes`` away from (the first
    the root), or why not (the last algorithm's reason): the fusion rules whose kernel fills a
    slot (``Op.fills``)."""
    why = None
    for algorithm in algorithms:
        pair = [lowered_for(op, types, algorithm, ctx, {}, what=what) for op, types, what in (slot, filler)]
        why = next((w for w in pair if isinstance(w, str)), None) \
            or forced_elsewhere(graph, nodes[0], nodes, algorithm, ctx)
        if why is None:
            return tuple(pair)
    return why


def rewrite_slot_pair(graph: Graph, ctx: PassContext, pair, slot: NodeView, slot_inputs: Sequence[Value],
                      filler: NodeView, filler_inputs: Sequence[Value]) -> str | None:
    """Apply ``pair`` (:func:`lowered_slot_pair`'s answer): node ``slot`` becomes the slot op on
    ``slot_inputs`` and node ``filler`` the op that fills it, on ``filler_inputs`` then the slot
    (same nodes, names, readers); returns None when done, else why not (nothing changed)."""
    if isinstance(pair, str):
        return pair
    new_slot, new_filler = pair
    graph.rewrite(slot.id, new_slot, list(slot_inputs))
    report_rewrite(ctx, slot.name, new_slot)
    graph.rewrite(filler.id, new_filler, [*filler_inputs, graph.value(slot.id)])
    report_rewrite(ctx, filler.name, new_filler)
    return None


def report_rewrite(ctx: PassContext, name: str, new: Lowered, names: Sequence[str] = (),
                   ops: dict | None = None) -> None:
    """The record of node ``name`` shows the fused op ``new`` and the nodes
    ``names`` it absorbed (``ops``: their ops by name), and what those had absorbed."""
    rec = ctx.report.nodes.get(name)
    gone = [ctx.report.nodes.pop(n, None) for n in names]
    if rec is None:
        return
    absorbed = dict(rec.absorbed)
    for n, old in zip(names, gone):
        absorbed.update(old.absorbed if old is not None else {})
        absorbed[n] = abstract_of(ops[n]).name
    fused = new.op
    rec.op, rec.op_type, rec.chosen = fused.describe(), fused.name, new.describe()
    rec.algorithm, rec.options, rec.absorbed = new.algorithm, dict(new.options), absorbed


__all__ = ["forced_onto", "Match", "FusionRule", "Scope", "Tally", "apply_table", "rewrite_lowered", "add_lowered",
           "forced_elsewhere",
           "lowered_for", "report_rewrite", "slot_match", "lowered_slot_pair", "rewrite_slot_pair"]
