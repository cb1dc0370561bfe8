"""The ``relu-bias-sums`` fusion rule: a ReLU gradient writes the bias gradient read from it.

``b = BiasAddBackward(g)`` with ``g = ReluBackward(y, gy)`` reads ``g`` once more after the
ReLU gradient wrote it, in a kernel of its own (GoogLeNet bf16 on the H200, 2026-12-04: 58 bias
gradients, 0.406 ms at 48 % of the copy bandwidth, most a few microseconds at the launch floor
of a replayed graph). ``g`` has other readers (the backward-data and backward-filter
convolutions), and a node has one output; so, as ``pool-scan`` does (``Op.fills``), the rule
makes the bias gradient a slot the ReLU gradient fills (``opgraph/ops/relu_bias_sums.py``):

* ``b`` becomes ``ReluBackwardSumsSlot(y, gy)``, whose step only allocates (same node, name,
  readers; a parameter gradient is an output, read after the step);
* ``g`` becomes ``ReluBackwardSums(y, gy, b)``: one pass that writes ``g`` and the float32 sums
  of each channel, rounded once into ``b``.

It applies when

* ``g``'s op is a ``ReluBackward`` (not absorbed into a generated chain: the rule runs after
  ``elementwise``, so a ReLU gradient that a chain fused with its producer stays in it);
  ``b`` sums it;
* every reader of ``b`` descends from ``g`` (``passes/verify.py``'s condition: none reads the
  sums before they are written);
* an algorithm has rules for both new ops that the policy does not exclude or decline: the
  ReLU gradient's own, else ``cuda``; the policy forces neither node elsewhere;
* the policy opts in, ``include=['relu-bias-sums']``: the CUDA kernel
  (``backends/cuda/colsum_relu.py``) was checked on the CPU's emulator only, in a session whose
  device loans were paused; and on the CPU's oracles ``include=['fused-reference']`` too.

Autotune checks each candidate's sums (a poisoned copy of the slot) against the float64
``BiasAddBackward(ReluBackward(y, gy))``, as it checks ``g``.
"""

from __future__ import annotations

import networkx as nx

from opgraph.graph import Graph, NodeView
from opgraph.op import abstract_of
from opgraph.ops import BiasAddBackward, ReluBackward, ReluBackwardSums, ReluBackwardSumsSlot

from .base import PassContext
from .fuse_pool_argmax import _oracle_without_opt_in
from .pattern import FusionRule, Match, Scope, forced_elsewhere, lowered_for, report_rewrite

NAME = "relu-bias-sums"
LABEL = "bias gradient(s) written by the ReLU gradient they sum"
#: why the rule waits for ``include=['relu-bias-sums']`` (module docstring)
OPT_IN_NOTE = (f"opt-in (include=[{NAME!r}]) until its kernel has been run and timed on a GPU: "
               "it is checked on the CPU's emulator only")


def match_relu_bias_sums(scope: Scope, view: NodeView) -> Match | None:
    """A bias gradient of a ReLU gradient (module docstring); ``data`` the ReLU gradient's id."""
    op = abstract_of(view.op)
    if type(op) is not BiasAddBackward or scope.algorithm(view.id) is None:
        return None
    (g,) = scope.graph.input_ids(view.id)
    if type(scope.op(g)) is not ReluBackward or scope.algorithm(g) is None:
        return None
    why = _oracle_without_opt_in(scope.algorithm(g), scope.ctx)
    if why:
        scope.note(NAME, why)
        return None
    # after the rewrite b reads y and gy, not g: a reader of b must descend from g by another path
    without_b = nx.restricted_view(scope.graph.nx, [view.id], [])
    early = [r for r in scope.readers(view.id) if not nx.has_path(without_b, g, r)]
    if early:
        scope.note(NAME, f"a reader of the bias gradient does not run after the ReLU gradient "
                         f"({scope.graph.node(early[0]).name})")
        return None
    # g comes to read the slot, which sits after it in the scope's order: re-placed after the rewrite
    return Match(view.id, (), LABEL, g, rewired=(g,))


def _lowered_pair(y, gy, bias_type, algorithms, ctx: PassContext):
    """``(slot, sums)`` lowered to the first of ``algorithms`` with rules for both, or why not."""
    why = None
    for algorithm in algorithms:
        slot = lowered_for(ReluBackwardSumsSlot(), (y.type, gy.type), algorithm, ctx, {},
                           what="bias gradient slot")
        sums = lowered_for(ReluBackwardSums(), (y.type, gy.type, bias_type), algorithm, ctx, {},
                           what="ReLU gradient writing its sums")
        why = next((w for w in (slot, sums) if isinstance(w, str)), None)
        if why is None:
            return slot, sums
    return why


def fuse_relu_bias_sums(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Rewrite bias gradient ``m.root`` and ReLU gradient ``m.data`` (module docstring); returns
    None when done, else why not (then nothing changed)."""
    bias, relu = graph.node(m.root), graph.node(m.data)
    y, gy = relu.inputs
    algorithm = relu.op.algorithm
    pair = _lowered_pair(y, gy, bias.type, dict.fromkeys((algorithm, "cuda")), ctx)
    if isinstance(pair, str):
        return pair
    slot, sums = pair
    why = forced_elsewhere(graph, relu.id, [relu.id, bias.id], slot.algorithm, ctx)
    if why:
        return why
    graph.rewrite(bias.id, slot, [y, gy])
    report_rewrite(ctx, bias.name, slot)
    graph.rewrite(relu.id, sums, [y, gy, graph.value(bias.id)])
    report_rewrite(ctx, relu.name, sums)
    return None


RELU_BIAS_SUMS = FusionRule(NAME, match_relu_bias_sums, fuse_relu_bias_sums, opt_in=OPT_IN_NOTE)

__all__ = ["NAME", "LABEL", "OPT_IN_NOTE", "match_relu_bias_sums", "fuse_relu_bias_sums", "RELU_BIAS_SUMS"]
