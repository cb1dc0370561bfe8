"""Fusion rules for memory-bound chains: one ``FusedElementwise`` node per chain.

Two entries of the fusion table (``passes/fuse.py``), matched consumers
first so that a chain is found at its last node:

* ``gradient-sum``: a tree of ``Add`` nodes (autodiff sums the gradients of a
  value read by several consumers: GoogLeNet's inception branches,
  DenseNet's concatenations, a ResNet shortcut) whose inner sums have no
  other reader and are no outputs -> one n-ary sum, a ``FusedElementwise``
  of ``n`` inputs that reads each term once and writes the sum once,
  instead of ``n - 1`` nodes each reading and writing the full tensor;
* ``elementwise``: the vertical fusion of a maximal chain or tree of
  memory-bound ops (activations and their gradients, add, mul, div, neg,
  bias-add, dropout, batch norm's pieces, means and the reductions that
  consume them: :data:`MEMBER_FAMILIES`) whose intermediate values have no
  other reader and are no outputs -> one ``FusedElementwise`` whose program
  lists the members (``opgraph/ops/fused.py``); a fused member (a sum of the
  first rule) is spliced into the program. The chain grows one producer at a
  time and keeps a producer only when the algorithm's rule still accepts
  the program (on cuda the code generator plans it: ``codegen``'s decline
  reasons), so a chain stops where the generator cannot follow.

Every member must run on the algorithm the chain's last node was lowered to,
and that algorithm must have a ``FusedElementwise`` rule the policy does not
exclude (``exclude=['fused']`` turns both rules off; ``exclude=['elementwise']``
or ``['gradient-sum']`` one of them); a member the policy forces elsewhere
stays out. On the oracle algorithms (``reference``, the CPU's default) a
fused node runs the members' own kernels one after the other, minus the
in-place writes the unfused steps get: measured on the 2-core CI machine
(bias-add, add, ReLU, sigmoid over (8, 64, 28, 28) and (32, 64, 56, 56)
float32: 12-16 ms unfused against 16 ms fused, 61-80 ms against 87-92 ms),
no faster and up to 1.3x slower. So there both rules are opt-in:
``include=['fused-reference']`` (what the CPU tests of these rules use).
"""

from __future__ import annotations

from typing import Sequence

from opgraph import ops
from opgraph.backends.registry import rules_for
from opgraph.graph import Graph
from opgraph.op import abstract_of
from opgraph.ops.fused import FusedElementwise, FusedStep, Program

from .autotune_inputs import REFERENCE_ALGORITHMS
from .base import PassContext
from .candidates import decline_reason, policy_options, storage_dtype
from .pattern import FusionRule, Match, Scope, forced_onto, rewrite_lowered

#: Op families whose ops may be members of a fused chain.
MEMBER_FAMILIES = frozenset({"activation", "bias", "broadcast", "elementwise", "relu", "reduce", "global_pool"})
#: Batch norm's pieces (family ``norm``; layer norm and the double backward stay out).
NORM_MEMBERS = frozenset({ops.BatchNorm, ops.BatchNormBackwardData, ops.BatchNormBackwardScale,
                          ops.BatchNormRunningUpdate, ops.BatchNormStats, ops.BatchNormTraining,
                          ops.BatchNormTrainingBackwardData, ops.BatchNormTrainingBackwardScale})
#: Fused ops a chain may end in, but not pass through: the two passes of a
#: training batch norm's backward (``bn-backward-sums``), which take in the
#: producers of their output gradient that ``bn-gradient-remat`` copied for them.
CHAIN_ENDS = frozenset({ops.BatchNormTrainingBackwardSums, ops.BatchNormTrainingBackwardDataFromSums})
#: Algorithms that are the oracle: fusing on them is opt-in (module docstring).
ORACLE_ALGORITHMS = REFERENCE_ALGORITHMS
#: The ``include`` name that lets these rules fuse on the oracle algorithms.
OPT_IN = "fused-reference"
#: The words every fusion rule's note ends with where it leaves the CPU's oracle kernels alone
#: for want of :data:`OPT_IN` (:func:`oracle_waits`).
OPT_IN_HINT = f"opt in with include=[{OPT_IN!r}]"


def is_member(op) -> bool:
    """Whether abstract ``op`` may be a member of a fused chain (a fused
    chain of one output is spliced in)."""
    if isinstance(op, FusedElementwise):
        return len(op.program.outputs) == 1
    return not op.fused and (op.family in MEMBER_FAMILIES or type(op) in NORM_MEMBERS)


def ends_chain(op) -> bool:
    """Whether abstract ``op`` may be the last node of a fused chain: a member,
    or one of :data:`CHAIN_ENDS`."""
    return is_member(op) or type(op) in CHAIN_ENDS


def fusable(ctx: PassContext, algorithm: str) -> str | None:
    """Why chains lowered to ``algorithm`` are not fused, or None."""
    rule = rules_for(FusedElementwise).get(algorithm)
    if rule is None:
        return f"{algorithm} has no FusedElementwise kernel"
    why = ctx.policy.exclusion(algorithm, rule.tags)
    if why:
        return why
    if oracle_waits(ctx, algorithm):
        return (f"a fused chain on {algorithm} runs the same kernels without their in-place writes "
                f"(slower); {OPT_IN_HINT}")
    return None


def chains_declined(ctx: PassContext, algorithm: str) -> str | None:
    """Why the ``elementwise`` rule would make no chain on ``algorithm`` (:func:`fusable`'s
    reason, or the rule excluded by name), or None: what a rule that copies a producer so
    that chains take it in asks first (``bn-apply-remat``, ``bn-gradient-remat``,
    ``bias-remat``), since without the chains a copy is a pass more, not one fewer."""
    why = fusable(ctx, algorithm)
    if why is None and "elementwise" in ctx.policy.exclude:
        why = "the elementwise rule is excluded by policy"
    return why


def oracle_waits(ctx: PassContext, algorithm: str) -> bool:
    """Whether a fusion rule leaves nodes on ``algorithm`` alone for want of :data:`OPT_IN`: one of
    the CPU's oracles, and the policy does not include it (``Scope.note``'s ``waits_for``)."""
    return algorithm in ORACLE_ALGORITHMS and OPT_IN not in ctx.policy.include


def program_of(graph: Graph, members: Sequence[int]):
    """The ``FusedElementwise`` of graph nodes ``members`` (lowered or not;
    a fused member's program is spliced in) and the values it reads.

    ``members`` come in a topological order; the last is the output. Inputs
    are the values members read that no member computes, in order of first
    use (as ``ops.fused.fuse``).

    Raises:
        OpgraphError: a member that is neither element-wise nor a fused chain
            (``Program``'s checks).
    """
    order = list(members)
    inside = set(order)
    numbers: dict[int, int] = {}
    inputs = []
    for n in order:
        for u in graph.input_ids(n):
            if u not in inside and u not in numbers:
                numbers[u] = len(inputs)
                inputs.append(graph.value(u))
    steps: list[FusedStep] = []
    for n in order:
        op = abstract_of(graph.node(n).op)
        args = [numbers[u] for u in graph.input_ids(n)]
        if isinstance(op, FusedElementwise):  # its values: its inputs' numbers, then its steps'
            local = list(args)
            for step in op.program.steps:
                steps.append(FusedStep(step.op, [local[a] for a in step.args]))
                local.append(len(inputs) + len(steps) - 1)
            numbers[n] = local[op.program.outputs[0]]
        else:
            steps.append(FusedStep(op, args))
            numbers[n] = len(inputs) + len(steps) - 1
    return FusedElementwise(Program(len(inputs), tuple(steps), numbers[order[-1]])), inputs



def _joins(scope: Scope, node: int, group: list[int], algorithm: str, accept) -> bool:
    """Whether producer ``node`` may join ``group``: lowered to ``algorithm``,
    ``accept``-ed, read by the group alone, no output, not forced elsewhere."""
    if node not in scope or scope.algorithm(node) != algorithm or not accept(scope.op(node)):
        return False
    forced = forced_onto(scope.ctx, scope.graph.node(node).name)
    return forced in (None, algorithm) and scope.private(node, group)


def _fused(graph: Graph, members: Sequence[int], algorithm: str, ctx: PassContext):
    """``(op, inputs, rule, options)``: the ``FusedElementwise`` of ``members``
    (topological order, :func:`program_of`), the values it reads, and
    ``algorithm``'s rule for it with the policy's options for its storage dtype."""
    op, inputs = program_of(graph, members)
    rule = rules_for(FusedElementwise)[algorithm]
    options = policy_options(rule, ctx.policy, storage_dtype([v.type for v in inputs], ctx.dtype))
    return op, inputs, rule, options


def declines(graph: Graph, members: Sequence[int], algorithm: str, ctx: PassContext) -> str | None:
    """Why ``algorithm``'s ``FusedElementwise`` rule would not run graph nodes
    ``members`` (in topological order, the last the chain's output) as one
    chain, or None."""
    op, inputs, rule, options = _fused(graph, members, algorithm, ctx)
    types = tuple(v.type for v in inputs)
    return decline_reason(rule, op, types, ctx.device, ctx.policy, options)


def grow(scope: Scope, root: int, rule: str, accept, minimum: int = 2, root_accept=None) -> Match | None:
    """The largest group of ``accept``-ed producers ending at ``root`` (which
    ``root_accept`` must accept; default ``accept``) that the algorithm's
    ``FusedElementwise`` rule accepts (module docstring), as a match of at
    least ``minimum`` nodes labelled by ``rule``, or None."""
    algorithm = scope.algorithm(root)
    if algorithm is None or not (root_accept or accept)(scope.op(root)):
        return None
    why = fusable(scope.ctx, algorithm)
    if why:
        scope.note(rule, why, waits_for=OPT_IN if oracle_waits(scope.ctx, algorithm) else None)
        return None
    group, rejected, changed = [root], set(), True
    while changed:  # a producer read by two members becomes private once both are in
        changed = False
        for u in sorted({u for n in group for u in scope.graph.input_ids(n)} - set(group) - rejected):
            if not _joins(scope, u, group, algorithm, accept):
                continue
            if declines(scope.graph, scope.sorted(group + [u]), algorithm, scope.ctx):
                rejected.add(u)
                continue
            group.append(u)
            changed = True
    if len(group) < minimum:
        return None
    absorbed = [n for n in scope.sorted(group) if n != root]
    return Match(root, absorbed, LABELS[rule], algorithm)


def rewrite_chain(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Make the chain's last node one ``FusedElementwise`` on the chain's
    algorithm; returns None when done, else why not."""
    op, inputs, _, options = _fused(graph, [*m.absorbed, m.root], m.data, ctx)
    return rewrite_lowered(graph, m.root, m.absorbed, op, inputs, m.data, ctx, options,
                           "FusedElementwise kernel")


def _is_add(op) -> bool:
    return type(op) is ops.Add


LABELS = {"gradient-sum": "n-ary sum(s) of Add nodes", "elementwise": "element-wise chain(s)"}

GRADIENT_SUM = FusionRule(
    "gradient-sum", lambda scope, view: grow(scope, view.id, "gradient-sum", _is_add, minimum=2),
    rewrite_chain, consumers_first=True)
ELEMENTWISE = FusionRule(
    "elementwise", lambda scope, view: grow(scope, view.id, "elementwise", is_member, root_accept=ends_chain),
    rewrite_chain, consumers_first=True)


__all__ = ["MEMBER_FAMILIES", "NORM_MEMBERS", "CHAIN_ENDS", "ORACLE_ALGORITHMS", "OPT_IN", "OPT_IN_HINT", "oracle_waits",
           "chains_declined", "is_member", "ends_chain", "fusable", "program_of", "declines", "grow", "rewrite_chain", "GRADIENT_SUM",
           "ELEMENTWISE", "LABELS"]
