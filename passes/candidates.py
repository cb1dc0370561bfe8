"""The candidates of a node: which rules could lower it under a policy, and why the others cannot.

The legalize, lower, fuse and autotune passes (and the benchmark's columns)
all ask this one question; this module answers it.

The candidates are the rules registered for the node's op type
(``registry.rules_for``), in the policy's order (``LoweringPolicy.order``:
preferred, then the device default, then any other registered rule, so a
new backend is never unreachable). A candidate is kept out, its reason kept
for the report, when

* the policy excludes it (``exclude``, or an ``optional`` rule not included);
* the rule declines the node (``Rule.decline_reason``: device, stride,
  kernel size, 32-bit limits, ...);
* it needs explicit padding the node does not have yet (tags below; the
  legalize pass inserts the ``Pad`` nodes, so it asks with ``padded_ok``);
* its workspace exceeds ``policy.workspace_limit`` (autotune asks without
  the limit: an over-budget candidate is reported, not declined).

Rule tags read here (the contract with the backends):

* ``needs_explicit_padding``: the rule runs only unpadded convolutions;
* ``symmetric_padding_only``: it runs symmetric padding only (the asymmetric
  excess must be explicit);
* ``option:precision`` / ``option:workspace_limit``: its kernel takes that
  keyword option, filled from the policy: the precision resolved for the
  node's storage (``opgraph/precision.py``), always, and the workspace limit
  when there is one;
* ``variants:engine_limit``: its ``variants`` take ``limit=policy.engine_limit``
  (autotune times the first ``limit`` cuDNN engines, not every one); a rule
  tagged ``option:precision`` has ``variants`` that take ``precision=``
  (:func:`rule_variants` refuses a rule whose function does not: a tag its
  code breaks is a bug, never a silently shorter candidate list).

Under ``policy.workspace_limit``, a rule whose variants are cheap to list
(not tagged ``variants:engine_limit``: listing cuDNN's builds every plan)
and whose default call is over the limit is offered with its first variant
that fits (the ``unfold`` rule's ``chunks``), so the lower pass never
declines a node that a variant could run within the limit.

A node is surveyed once per compile: :func:`survey_node` keeps each
:class:`Survey` in ``PassContext.surveys``, keyed by the node's id, its op,
its input types and the policy, so that a node a pass rewrote in between
(legalize changes its padding, fuse its op, layout its inputs' layout) is
surveyed again, never served stale.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Mapping

import attrs

from opgraph import precision as precisions
from opgraph.errors import LoweringError, did_you_mean
from opgraph.op import Op
from opgraph.types import is_float, run_type
from opgraph.backends.registry import Rule, rules_for

from .policy import LoweringPolicy
from .zero_copy import kernel_options

NEEDS_EXPLICIT_PADDING = "needs_explicit_padding"
SYMMETRIC_PADDING_ONLY = "symmetric_padding_only"
OPTION_TAGS = {"precision": "option:precision", "workspace_limit": "option:workspace_limit"}
ENGINE_LIMIT_TAG = "variants:engine_limit"
#: The tags above: they tell the passes how to pad for a rule and call it, and
#: name no group of rules a user would include or exclude, so the known names
#: a policy error lists leave them out (``policy_names.listed_names``).
CONTRACT_TAGS = frozenset({NEEDS_EXPLICIT_PADDING, SYMMETRIC_PADDING_ONLY, *OPTION_TAGS.values(), ENGINE_LIMIT_TAG})

NO_PADDING = ((0, 0), (0, 0))


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


def rule_workspace(rule: Rule, op: Op, in_types, options: Mapping) -> int:
    """Scratch bytes the rule declares for one call (0 if its function raises),
    called with the options a kernel gets (the zero-copy plan's
    ``strided_out`` left out: ``zero_copy.kernel_options``)."""
    try:
        return int(rule.workspace(op, in_types, kernel_options(options)))
    except Exception:  # a workspace estimate must never break lowering
        return 0


def rule_variants(rule: Rule, op: Op, in_types, device: str, options: Mapping,
                  engine_limit: int | None = None) -> list[dict]:
    """The rule's option sets for this node (``Rule.variants``): a rule tagged
    ``option:precision`` lists them for ``options['precision']``, one tagged
    ``variants:engine_limit`` lists at most ``engine_limit``. ``[{}]`` (the
    rule's default call) when the list is empty or the rule cannot build it
    for this node (``LoweringError``: no cuDNN plan builds); a variants
    function that fails otherwise gives ``[{}]`` too, with a RuntimeWarning
    naming the rule and the error (autotune would otherwise time the default
    alone without a word, as it did for ``unfold``'s ``chunks``).

    Raises:
        TypeError: the rule's ``variants`` cannot be called with the arguments
            its tags promise (names the rule and the call).
    """
    extra = {"precision": options["precision"]} if "precision" in options else {}
    if ENGINE_LIMIT_TAG in rule.tags:
        extra["limit"] = engine_limit
    name = f"rule {rule.op_type.__name__}/{rule.algorithm}"
    try:
        inspect.signature(rule.variants).bind(op, in_types, device, **extra)
    except TypeError as e:
        call = ", ".join(["op", "in_types", "device", *(f"{k}=" for k in sorted(extra))])
        raise TypeError(f"{name}: its variants function {getattr(rule.variants, '__qualname__', rule.variants)!r} "
                        f"cannot be called as variants({call}), which its tags {sorted(rule.tags)} "
                        f"promise: {e}") from e
    try:
        return [dict(v) for v in rule.variants(op, in_types, device, **extra)] or [{}]
    except LoweringError:  # no variant builds for this node (no cuDNN plan): the rule's default call
        return [{}]
    except Exception as e:
        warnings.warn(f"{name}: listing its variants for {op.describe()} raised {type(e).__name__}: {e}; "
                      "only its default call is a candidate", RuntimeWarning, stacklevel=2)
        return [{}]


def explicit_padding(rule: Rule, op: Op, policy: LoweringPolicy) -> tuple:
    """The part of ``op.padding`` that must become an explicit ``Pad`` node for
    ``rule`` (``((0, 0), (0, 0))`` when none): all of it for a rule tagged
    ``needs_explicit_padding`` or listed in ``policy.explicit_padding``, the
    asymmetric excess (``t - min(t, b)``, ...) for ``symmetric_padding_only``.
    Only ops of family ``conv`` pad with zeros a ``Pad`` node can hold."""
    if op.family != "conv":  # pooling pads with -inf: never a Pad node's zeros
        return NO_PADDING
    pad = op.padding
    if NEEDS_EXPLICIT_PADDING in rule.tags or policy.needs_explicit_padding(rule.algorithm):
        return tuple(tuple(p) for p in pad)
    if SYMMETRIC_PADDING_ONLY in rule.tags:
        return tuple((b - min(b, e), e - min(b, e)) for b, e in pad)
    return NO_PADDING


@attrs.frozen
class Entry:
    """One rule of a node's survey and what may keep it out.

    Attributes:
        rule, options: the rule and the kernel options the policy gives it.
        refused: the policy's exclusion or the rule's own decline, or None.
        padding: the padding that must become explicit first (``NO_PADDING``: none).
        workspace: its scratch bytes, computed only under a workspace limit
            (with ``variant``'s options when there is one).
        variant: under a workspace limit its default call exceeds, the rule's
            first variant that fits (``{}`` otherwise): what the lower pass
            runs (:attr:`lowered_options`); autotune lays every variant over
            ``options`` and reports the others over budget itself.
    """

    rule: Rule
    options: Mapping
    refused: str | None
    padding: tuple
    workspace: int | None
    variant: Mapping = attrs.field(factory=dict)

    @property
    def lowered_options(self) -> dict:
        """The options the lower pass gives the node: ``options`` and ``variant``."""
        return {**self.options, **self.variant}

    def reason(self, op: Op, *, padded_ok: bool, limit: int | None) -> str | None:
        """Why it cannot lower ``op`` (None if it can); ``padded_ok`` ignores
        missing explicit padding, ``limit`` is the workspace budget or None."""
        if self.refused:
            return self.refused
        if not padded_ok and self.padding != NO_PADDING:
            return (f"{self.rule.algorithm} needs explicit padding {op.padding} (the legalize pass "
                    "inserts a Pad node)")
        if limit is not None and (self.workspace or 0) > limit:
            return f"workspace {self.workspace:,d} B exceeds the limit {limit:,d} B"
        return None


def _entry(rule: Rule, op: Op, in_types, device: str, policy: LoweringPolicy, options: dict,
               excluded: str | None = None) -> Entry:
    try:
        why = excluded or rule.decline_reason(op, in_types, device)
    except Exception as e:  # a check that crashes declines, with the crash as reason
        why = f"check raised {type(e).__name__}: {e}"
    ws, variant = None, {}
    if why is None and policy.workspace_limit is not None:
        ws = rule_workspace(rule, op, in_types, options)
        if ws > policy.workspace_limit and ENGINE_LIMIT_TAG not in rule.tags:
            variant, ws = _fitting_variant(rule, op, in_types, device, options, policy.workspace_limit, ws)
    return Entry(rule, options, why, explicit_padding(rule, op, policy), ws, variant)


def _fitting_variant(rule: Rule, op: Op, in_types, device: str, options: dict, limit: int,
                     ws: int) -> tuple[dict, int]:
    """``(variant, workspace)`` of the rule's first variant within ``limit``;
    ``({}, ws)`` when none is (module docstring)."""
    for variant in rule_variants(rule, op, in_types, device, options):
        need = rule_workspace(rule, op, in_types, {**options, **variant})
        if need <= limit:
            return dict(variant), need
    return {}, ws


def decline_reason(rule: Rule, op: Op, in_types, device: str, policy: LoweringPolicy,
                   options: dict, *, padded_ok: bool = False) -> str | None:
    """Why ``rule`` cannot lower this node under ``policy`` (None if it can),
    the policy's exclusions aside (one rule asked alone: the fuse pass, the
    benchmark's columns). ``padded_ok`` ignores missing explicit padding
    (what would apply once the legalize pass has inserted the ``Pad`` nodes)."""
    return _entry(rule, op, in_types, device, policy, options).reason(
        op, padded_ok=padded_ok, limit=policy.workspace_limit)


@attrs.frozen
class Survey:
    """Every candidate of one node, in the policy's order; ``forced`` if the
    policy forces an algorithm (then the list holds that one only)."""

    op: Op
    order: tuple[str, ...]
    entries: tuple[Entry, ...]
    forced: str | None
    workspace_limit: int | None

    def reasons(self, *, padded_ok: bool = False, limited: bool = True) -> list[tuple[Entry, str | None]]:
        """``(entry, why not or None)`` in order. ``padded_ok``: as if the
        legalize pass had made the padding explicit; ``limited=False``: the
        workspace limit ignored (autotune reports over-budget rows instead)."""
        limit = self.workspace_limit if limited else None
        return [(e, e.reason(self.op, padded_ok=padded_ok, limit=limit)) for e in self.entries]

    def applicable(self, **query) -> list[Entry]:
        """The candidates that can lower the node (``query``: as :meth:`reasons`)."""
        return [e for e, why in self.reasons(**query) if why is None]

    def declined(self, **query) -> dict[str, str]:
        """Algorithm -> why it cannot (``query``: as :meth:`reasons`)."""
        return {e.rule.algorithm: why for e, why in self.reasons(**query) if why is not None}


def survey(name: str, op: Op, in_types, device: str, policy: LoweringPolicy, *,
           force_name: str | None = "", dtype: str | None = None) -> Survey:
    """Candidates of node ``name`` running ``op`` on ``in_types`` and what keeps each out.

    ``force_name`` is the name ``policy.force`` keys are matched against
    (``""``: ``name``; ``None``: the node cannot be forced, e.g. a ``Pad``
    node the legalize pass inserted; see ``PassContext.aliases``). ``dtype``
    is the compile-time floating dtype (``compile(dtype=...)``), the storage
    the node's precision is resolved for (:func:`policy_options`).

    Raises:
        LoweringError: the node is forced to an algorithm with no rule for
            its op type.
    """
    rules = rules_for(type(op))
    storage = storage_dtype(in_types, dtype)
    options = {algo: policy_options(rule, policy, storage) for algo, rule in rules.items()}
    forced = None if force_name is None else policy.forced(force_name or name, op.direction, rules.__contains__)
    if forced is not None:
        if forced not in rules:
            raise LoweringError(f"node {name} ({op.name}): forced algorithm {forced!r} has no rule "
                                f"for {op.name}{did_you_mean(forced, rules)} (registered: {sorted(rules) or 'none'})")
        order = (forced,)
        entries = (_entry(rules[forced], op, in_types, device, policy, options[forced]),)
    else:
        order = tuple(a for a in policy.order(op.name, device) if a in rules)
        order += tuple(sorted(set(rules) - set(order)))  # rules no order names: tried last
        entries = tuple(_entry(rules[a], op, in_types, device, policy, options[a],
                               policy.exclusion(a, rules[a].tags)) for a in order)
    return Survey(op, order, entries, forced, policy.workspace_limit)


def _stored(t):
    """``t`` as rules see it: a 4-D value not yet given a layout is stored NCHW."""
    return attrs.evolve(t, layout="NCHW") if t.ndim == 4 and t.layout is None else t


def survey_node(view, ctx, policy: LoweringPolicy | None = None, op: Op | None = None) -> Survey:
    """The :func:`survey` of graph node ``view`` in pass context ``ctx``
    (device, compile dtype, the names ``policy.force`` sees), computed once
    per state of the node and kept in ``ctx.surveys``.

    Args:
        view: the node (``NodeView``).
        ctx: the ``PassContext``.
        policy: the policy asked (default ``ctx.policy``).
        op: the abstract op (default ``view.op``; autotune passes the op
            behind a ``Lowered`` one).
    """
    policy = policy or ctx.policy
    op = op or view.op
    types = view.input_types
    force_name = ctx.aliases.get(view.name, view.name)
    key = (view.id, op, tuple(_stored(t) for t in types), force_name, id(policy))
    kept = ctx.surveys.get(key)
    if kept is not None and kept[0] is policy:  # the policy kept alive with it: ids are not reused
        return kept[1]
    s = survey(view.name, op, types, ctx.device, policy, force_name=force_name, dtype=ctx.dtype)
    ctx.surveys[key] = (policy, s)
    return s


__all__ = ["Survey", "Entry", "survey", "survey_node", "decline_reason", "explicit_padding",
           "policy_options", "rule_variants", "rule_workspace", "storage_dtype", "NEEDS_EXPLICIT_PADDING",
           "SYMMETRIC_PADDING_ONLY", "OPTION_TAGS", "CONTRACT_TAGS", "NO_PADDING"]
