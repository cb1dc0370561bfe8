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
from opgraph.op import Lowered, Op, Source
from opgraph.backends.registry import Rule

from .base import Pass, PassContext
from .candidates import Survey, rule_workspace, survey_node
from .force import matches_a_node
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
    """Note ``force`` keys that match no node (a typo would otherwise pass silently)."""
    nodes = [(view.name, getattr(view.op, "direction", None)) for view in map(graph.node, graph.nx.nodes)]
    for key in policy.force:
        if not matches_a_node(key, nodes):
            msg = f"policy.force key {key!r} matches no node of graph {graph.name!r}"
            ctx.report.note(msg)
            warn_from_caller(msg)  # at the user's compile call: a stacklevel of 2 named this file


__all__ = ["LowerPass", "choose", "is_abstract"]
