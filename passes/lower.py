"""The lower pass: every abstract node becomes ``Lowered(op, algorithm, device, options)``.

For each abstract node among the outputs' ancestors, the candidates and the
reasons that keep some out come from the node's survey
(``passes/candidates.py``: policy order, exclusions, rule declines, missing
explicit padding, the workspace limit). The first candidate left wins; GEMM
(never declining short of 2^31-element GEMM dimensions) is the
convolutions' catch-all in every default order. A node nobody can lower is
a ``LoweringError`` listing every reason; a forced algorithm
(``policy.force``) that declines is a ``LoweringError`` naming the node, the
algorithm and the reason. Forcing bypasses ``exclude``.
"""

from __future__ import annotations

from opgraph.errors import LoweringError, warn_from_caller
from opgraph.graph import Graph
from opgraph.op import Lowered, Op, Source, abstract_of
from opgraph.backends.registry import Rule, rules_for

from .base import Pass, PassContext
from .candidates import Survey, rule_workspace, survey_node
from .force import forced_algorithm, matches_a_node
from .policy import LoweringPolicy
from .report import NodeReport


def is_abstract(op: Op) -> bool:
    """True for a node the lower pass must lower (not a source, not lowered)."""
    return not isinstance(op, (Source, Lowered))


def choose(view, ctx: PassContext, policy: LoweringPolicy | None = None) -> tuple[Rule, dict, Survey]:
    """The rule (and options) the policy (default ``ctx.policy``) gives node
    ``view``, with its survey.

    Raises:
        LoweringError: the forced algorithm declines (names node, algorithm,
            reason), or no candidate applies (lists every reason).
    """
    s = survey_node(view, ctx, policy)
    op, name, device = view.op, view.name, ctx.device
    if s.forced is not None:
        (entry, why), = s.reasons()
        if why is not None:
            raise LoweringError(f"node {name} ({op.describe()}): forced algorithm {s.forced!r} "
                                f"cannot run it on {device}: {why}")
        return entry.rule, entry.lowered_options, s
    applicable = s.applicable()
    if not applicable:
        reasons = "".join(f"\n  {a}: {why}" for a, why in s.declined().items()) or "\n  (no rule registered)"
        raise LoweringError(f"node {name} ({op.describe()}): no lowering applies on {device}:{reasons}")
    return applicable[0].rule, applicable[0].lowered_options, s


class LowerPass(Pass):
    """Replace every abstract ancestor of the outputs by its ``Lowered`` form.

    Args:
        policy: overrides ``ctx.policy`` (the 'reference' pipeline uses it).
    """

    name = "lower"

    def __init__(self, policy: LoweringPolicy | None = None):
        self.policy = policy

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        policy = self.policy or ctx.policy
        for view in list(graph.nodes_in_order(outputs)):
            op, types = view.op, view.input_types  # the view reads live data: keep the abstract op
            if not is_abstract(op):
                continue
            rule, opts, s = choose(view, ctx, policy)
            lowered = Lowered(op, rule.algorithm, ctx.device, opts)
            graph.replace_op(view.id, lowered)
            ctx.report.record(NodeReport(
                node=view.id, name=view.name, op=op.describe(), op_type=op.name,
                order=list(s.order), declined=s.declined(), algorithm=rule.algorithm, options=dict(opts),
                chosen=lowered.describe(), how="forced" if s.forced else "policy",
                workspace=rule_workspace(rule, op, types, opts)))
        _check_forced_names(graph, policy, ctx)
        return graph


def _check_forced_names(graph: Graph, policy: LoweringPolicy, ctx: PassContext) -> None:
    """Note ``force`` keys that match no node (a typo would otherwise pass silently), and
    patterns that match only nodes whose ops their algorithm has no rule for (each passed over:
    ``passes/force.py``), which then force nothing."""
    views = [graph.node(v) for v in graph.nx.nodes]
    nodes = [(view.name, getattr(view.op, "direction", None)) for view in views]
    for key, algorithm in policy.force.items():
        if not matches_a_node(key, nodes):
            msg = f"policy.force key {key!r} matches no node of graph {graph.name!r}"
        else:
            matched = [v for v, (name, direction) in zip(views, nodes)
                       if forced_algorithm({key: algorithm}, name, direction)]
            ops = [abstract_of(v.op) for v in matched]
            if any(algorithm in rules_for(type(op)) for op in ops):
                continue
            msg = (f"policy.force key {key!r} = {algorithm!r} matches {len(matched)} node(s) of graph "
                   f"{graph.name!r}, none of whose ops {algorithm!r} has a rule for (e.g. {matched[0].name}, "
                   f"{ops[0].name}): it forces nothing")
        ctx.report.note(msg)
        warn_from_caller(msg)  # at the user's compile call: a stacklevel of 2 named this file


__all__ = ["LowerPass", "choose", "is_abstract"]
