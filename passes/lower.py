"""The lower pass: every abstract node becomes ``Lowered(op, algorithm, device, options)``.

For each abstract node among the outputs' ancestors, the candidates are the
rules registered for its op type (``registry.rules_for``), in the policy's
order (``LoweringPolicy.order``: preferred, then the device default, then any
other registered rule, so a new backend is never unreachable). A candidate is
skipped, with its reason kept in the report, when

* the policy excludes it (``exclude``, or an ``optional`` rule not included);
* the rule declines the node (``Rule.decline_reason``: device, stride,
  kernel size, 32-bit limits, ...);
* it needs explicit padding the node does not have yet (tags below; the
  legalize pass inserts the ``Pad`` nodes);
* its workspace exceeds ``policy.workspace_limit``.

The first candidate left wins; GEMM (never declining short of 2^31-element
GEMM dimensions) is the convolutions' catch-all in every default order. A
node nobody can lower is a ``LoweringError`` listing every reason; a forced
algorithm (``policy.force``) that declines is a ``LoweringError`` naming the
node, the algorithm and the reason. Forcing bypasses ``exclude``.

Rule tags read here (the contract with the backends):

* ``needs_explicit_padding``: the rule runs only unpadded convolutions;
* ``symmetric_padding_only``: it runs symmetric padding only (the asymmetric
  excess must be explicit);
* ``option:precision`` / ``option:workspace_limit``: its kernel takes that
  keyword option, filled from the policy: the precision resolved for the
  node's storage (``opgraph/precision.py``), always, and the workspace limit
  when there is one.
"""

from __future__ import annotations

import warnings

import attrs

from opgraph import precision as precisions
from opgraph.errors import LoweringError
from opgraph.graph import Graph
from opgraph.op import Lowered, Op, Source
from opgraph.types import is_float, run_type
from opgraph.backends.registry import Rule, rules_for

from .base import Pass, PassContext
from .policy import LoweringPolicy
from .report import NodeReport

NEEDS_EXPLICIT_PADDING = "needs_explicit_padding"
SYMMETRIC_PADDING_ONLY = "symmetric_padding_only"
OPTION_TAGS = {"precision": "option:precision", "workspace_limit": "option:workspace_limit"}

NO_PADDING = ((0, 0), (0, 0))


def is_abstract(op: Op) -> bool:
    """True for a node the lower pass must lower (not a source, not lowered)."""
    return not isinstance(op, (Source, Lowered))


def explicit_padding(rule: Rule, op: Op, policy: LoweringPolicy) -> tuple:
    """The part of ``op.padding`` that must become an explicit ``Pad`` node for
    ``rule`` (``((0, 0), (0, 0))`` when none): all of it for a rule tagged
    ``needs_explicit_padding`` or listed in ``policy.explicit_padding``, the
    asymmetric excess (``t - min(t, b)``, ...) for ``symmetric_padding_only``."""
    if op.family != "conv":  # pooling pads with -inf: never a Pad node's zeros
        return NO_PADDING
    pad = op.padding
    if NEEDS_EXPLICIT_PADDING in rule.tags or policy.needs_explicit_padding(rule.algorithm):
        return tuple(tuple(p) for p in pad)
    if SYMMETRIC_PADDING_ONLY in rule.tags:
        return tuple((b - min(b, e), e - min(b, e)) for b, e in pad)
    return NO_PADDING


def storage_dtype(in_types, dtype: str | None = None) -> str | None:
    """The floating storage a node runs in: its first floating input's dtype,
    or ``dtype`` (``compile(dtype=...)``) replacing it; None without one."""
    t = next((t for t in in_types if is_float(t.dtype)), None)
    return None if t is None else run_type(t, dtype).dtype


def policy_options(rule: Rule, policy: LoweringPolicy, storage: str | None) -> dict:
    """Kernel options a rule takes from the policy (see the ``option:`` tags):
    the precision resolved for a node of floating storage ``storage``
    (:func:`opgraph.precision.resolve`, always given, ``fp32`` too) and the
    workspace limit."""
    out = {}
    if OPTION_TAGS["precision"] in rule.tags:
        out["precision"] = precisions.resolve(policy.precision, storage)
    if OPTION_TAGS["workspace_limit"] in rule.tags and policy.workspace_limit is not None:
        out["workspace_limit"] = policy.workspace_limit
    return out


def rule_workspace(rule: Rule, op: Op, in_types, options: dict) -> int:
    """Scratch bytes the rule declares for one call (0 if its function raises)."""
    try:
        return int(rule.workspace(op, in_types, dict(options)))
    except Exception:  # a workspace estimate must never break lowering
        return 0


def decline_reason(rule: Rule, op: Op, in_types, device: str, policy: LoweringPolicy,
                   options: dict, *, padded_ok: bool = False) -> str | None:
    """Why ``rule`` cannot lower this node under ``policy`` (None if it can).

    ``padded_ok`` ignores missing explicit padding (the legalize pass asks
    what would apply once it has inserted the ``Pad`` nodes).
    """
    try:
        why = rule.decline_reason(op, in_types, device)
    except Exception as e:  # a check that crashes declines, with the crash as reason
        why = f"check raised {type(e).__name__}: {e}"
    if why:
        return why
    if not padded_ok and explicit_padding(rule, op, policy) != NO_PADDING:
        return (f"{rule.algorithm} needs explicit padding {op.padding} (the legalize pass "
                "inserts a Pad node)")
    limit = policy.workspace_limit
    if limit is not None:
        ws = rule_workspace(rule, op, in_types, options)
        if ws > limit:
            return f"workspace {ws:,d} B exceeds the limit {limit:,d} B"
    return None


@attrs.frozen
class Survey:
    """Every candidate of one node, in order: ``(rule, options, reason)``
    with ``reason`` None for the applicable ones; ``forced`` if the policy
    forces an algorithm (then the list holds that one only)."""

    order: tuple[str, ...]
    entries: tuple[tuple[Rule, dict, str | None], ...]
    forced: str | None = None

    @property
    def applicable(self) -> list[tuple[Rule, dict]]:
        return [(r, o) for r, o, why in self.entries if why is None]

    @property
    def declined(self) -> dict[str, str]:
        return {r.algorithm: why for r, _, why in self.entries if why is not None}


def survey(name: str, op: Op, in_types, device: str, policy: LoweringPolicy, *,
           padded_ok: bool = False, force_name: str | None = "", dtype: str | None = None) -> Survey:
    """Candidates of node ``name`` running ``op`` on ``in_types`` and why each declines.

    ``dtype`` is the compile-time floating dtype (``compile(dtype=...)``), the
    storage the node's precision is resolved for (:func:`policy_options`).

    ``force_name`` is the name ``policy.force`` keys are matched against
    (``""``: ``name``; ``None``: the node cannot be forced, e.g. a ``Pad``
    node the legalize pass inserted; see ``PassContext.aliases``).

    Raises:
        LoweringError: the node is forced to an algorithm with no rule for
            its op type.
    """
    rules = rules_for(type(op))
    storage = storage_dtype(in_types, dtype)
    forced = None if force_name is None else policy.forced(force_name or name)
    if forced is not None:
        if forced not in rules:
            raise LoweringError(f"node {name} ({op.name}): forced algorithm {forced!r} has no rule "
                                f"for {op.name} (registered: {sorted(rules) or 'none'})")
        rule = rules[forced]
        opts = policy_options(rule, policy, storage)
        why = decline_reason(rule, op, in_types, device, policy, opts, padded_ok=padded_ok)
        return Survey((forced,), ((rule, opts, why),), forced)
    order = [a for a in policy.order(op.name, device) if a in rules]
    order += sorted(set(rules) - set(order))  # rules no order names: tried last
    entries = []
    for algo in order:
        rule = rules[algo]
        opts = policy_options(rule, policy, storage)
        why = policy.exclusion(algo, rule.tags) or decline_reason(
            rule, op, in_types, device, policy, opts, padded_ok=padded_ok)
        entries.append((rule, opts, why))
    return Survey(tuple(order), tuple(entries))


def choose(name: str, op: Op, in_types, device: str, policy: LoweringPolicy, *,
           force_name: str | None = "", dtype: str | None = None) -> tuple[Rule, dict, Survey]:
    """The rule (and options) the policy gives this node, with its survey.

    Raises:
        LoweringError: the forced algorithm declines (names node, algorithm,
            reason), or no candidate applies (lists every reason).
    """
    s = survey(name, op, in_types, device, policy, force_name=force_name, dtype=dtype)
    if s.forced is not None:
        rule, opts, why = s.entries[0]
        if why is not None:
            raise LoweringError(f"node {name} ({op.describe()}): forced algorithm {s.forced!r} "
                                f"cannot run it on {device}: {why}")
        return rule, opts, s
    if not s.applicable:
        reasons = "".join(f"\n  {a}: {why}" for a, why in s.declined.items()) or "\n  (no rule registered)"
        raise LoweringError(f"node {name} ({op.describe()}): no lowering applies on {device}:{reasons}")
    rule, opts = s.applicable[0]
    return rule, opts, s


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
            rule, opts, s = choose(view.name, op, types, ctx.device, policy,
                                   force_name=ctx.aliases.get(view.name, view.name), dtype=ctx.dtype)
            lowered = Lowered(op, rule.algorithm, ctx.device, opts)
            graph.replace_op(view.id, lowered)
            ctx.report.record(NodeReport(
                node=view.id, name=view.name, op=op.describe(), op_type=op.name,
                order=list(s.order), declined=s.declined, algorithm=rule.algorithm, options=dict(opts),
                chosen=lowered.describe(), how="forced" if s.forced else "policy",
                workspace=rule_workspace(rule, op, types, opts)))
        _check_forced_names(graph, policy, ctx)
        return graph


def _check_forced_names(graph: Graph, policy: LoweringPolicy, ctx: PassContext) -> None:
    """Note ``force`` keys that match no node (a typo would otherwise pass silently)."""
    import fnmatch

    names = [graph.node(n).name for n in graph.nx.nodes]
    for key in policy.force:
        if key not in names and not fnmatch.filter(names, key):
            msg = f"policy.force key {key!r} matches no node of graph {graph.name!r}"
            ctx.report.note(msg)
            warnings.warn(msg, stacklevel=2)


__all__ = ["LowerPass", "choose", "survey", "Survey", "decline_reason", "explicit_padding",
           "policy_options", "rule_workspace", "is_abstract", "NEEDS_EXPLICIT_PADDING",
           "SYMMETRIC_PADDING_ONLY", "OPTION_TAGS"]
