"""The ``ln-backward-sums`` fusion rule: a layer norm's data gradient writes its weight gradient.

``dw = LayerNormBackwardScale(x, gy)`` (``sum(gy * xhat)`` over the rows) reads x for each row's
statistics, then x and gy again, beside ``dx = LayerNormBackwardData(gy, x, weight)``, which reads
gy and x once in one kernel with each row on chip and xhat at hand per element
(``kernels.row_sweep``). ConvNeXt-tiny bf16 on the H100 (2026-12-06, call 6): 23 weight gradients,
1.07 ms at 47 % of the copy bandwidth. A node has one output, so, as ``relu-bias-sums`` does
(``Op.fills``), the rule makes the weight gradient a slot the data gradient fills
(``opgraph/ops/layer_norm_sums.py``):

* ``dw`` becomes ``LayerNormBackwardScaleSlot(gy, x)``, whose step only allocates (same node,
  name, readers);
* ``dx`` becomes ``LayerNormBackwardDataSums(gy, x, weight, dw)``: the row sweep also sums
  ``gy * xhat`` per column over its block's rows (float32 for half storage), then a fixed-order
  finish over the blocks rounds once into ``dw``.

It applies when

* ``dw``'s op is a ``LayerNormBackwardScale`` and a ``LayerNormBackwardData`` with a weight reads
  the same gy and x, with the same ``normalized_shape`` and ``eps`` (the first such in graph
  order, where there are several);
* every reader of ``dw`` descends from ``dx`` by a path that does not pass through ``dw``
  (``passes/verify.py``'s condition: none reads the weight gradient before it is written);
* an algorithm has rules for both new ops that the policy does not exclude and that do not
  decline (the ``codegen`` rule declines where the one-kernel row sweep cannot run on the node's
  types: rows past ``plan.ROW_SWEEP_VECTORS`` vectors a thread, a row split over blocks;
  ``backends/cuda/codegen_ln_sums.py``), the data gradient's own first, then ``codegen``, and the
  policy forces neither node elsewhere;
* on the CPU's oracles, the policy opts in there (``include=['fused-reference']``): no pass saved.

The rule is opt-in, ``include=['ln-backward-sums']`` (``fuse.OPT_IN_RULES``), until its kernel has
run on a GPU, as ``relu-bias-sums`` and ``pool-scan`` were: its kernels are checked on the CPU's
emulator only (``tests/backends/test_codegen_ln_sums.py``; docs/performance.md, thirtieth session:
the session's device time ran out first). ``exclude=['ln-backward-sums']`` or ``exclude=['fused']``
keeps it off whatever include says. Autotune checks a
candidate's weight gradient (a poisoned copy of the slot) against the float64
``LayerNormBackwardScale``, as it checks dx.
"""

from __future__ import annotations

from opgraph.graph import Graph, NodeView
from opgraph.op import abstract_of
from opgraph.ops import (LayerNormBackwardData, LayerNormBackwardDataSums, LayerNormBackwardScale,
                         LayerNormBackwardScaleSlot)
from opgraph.types import run_type

from .base import PassContext
from .fuse_elementwise import OPT_IN, OPT_IN_HINT, oracle_waits
from .pattern import FusionRule, Match, Scope, lowered_slot_pair, rewrite_slot_pair, slot_match

NAME = "ln-backward-sums"
LABEL = "layer-norm weight gradient(s) written by the data gradient"
#: why the rule waits for ``include=[NAME]`` (``passes/fuse.py``'s ``OPT_IN_RULES``)
OPT_IN_NOTE = (f"opt-in (include=[{NAME!r}]) until its kernel has run on a GPU: checked on the CPU's "
               "emulator only (docs/performance.md, thirtieth session)")


def _data_gradient(scope: Scope, view: NodeView) -> int | None:
    """The first ``LayerNormBackwardData`` with a weight reading the weight gradient ``view``'s gy and
    x, with its parameters, lowered; else None."""
    op = abstract_of(view.op)
    x, gy = scope.graph.input_ids(view.id)
    for r in scope.readers(gy):
        ids = scope.graph.input_ids(r)
        other = scope.op(r)
        if (type(other) is LayerNormBackwardData and len(ids) == 3 and ids[:2] == [gy, x]
                and other.params() == op.params() and scope.algorithm(r) is not None):
            return r
    return None


def match_ln_backward_sums(scope: Scope, view: NodeView) -> Match | None:
    """A layer norm's weight gradient beside its data gradient (module docstring); ``data`` the
    data gradient's id."""
    if type(abstract_of(view.op)) is not LayerNormBackwardScale or scope.algorithm(view.id) is None:
        return None
    dx = _data_gradient(scope, view)
    if dx is None:
        return None
    if NAME not in scope.ctx.policy.include:
        scope.note(NAME, OPT_IN_NOTE, waits_for=NAME)
        return None
    if oracle_waits(scope.ctx, scope.algorithm(dx)):
        scope.note(NAME, f"on {scope.algorithm(dx)} the weight gradient in the data gradient saves no pass; "
                         f"{OPT_IN_HINT}", waits_for=OPT_IN)
        return None
    return slot_match(scope, NAME, LABEL, view.id, dx, ("weight gradient", "data gradient"))


def _lowered_pair(graph: Graph, data, scale, algorithms, ctx: PassContext):
    """``(slot, fused)`` lowered to the first of ``algorithms`` with rules for both that the
    policy forces neither node away from, or why not (the last algorithm's reason)."""
    op = abstract_of(data.op)
    gy, x, w = (run_type(v.type, ctx.dtype) for v in data.inputs)  # as they run (compile's dtype)
    dw = run_type(scale.type, ctx.dtype)
    return lowered_slot_pair(graph, (LayerNormBackwardScaleSlot(**op.params()), (gy, x),
                                     "layer-norm weight gradient slot"),
                             (LayerNormBackwardDataSums(**op.params()), (gy, x, w, dw),
                              "layer-norm data gradient writing its weight gradient"),
                             [data.id, scale.id], algorithms, ctx)


def fuse_ln_backward_sums(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Rewrite weight gradient ``m.root`` and data gradient ``m.data`` (module docstring); returns
    None when done, else why not (then nothing changed)."""
    scale, data = graph.node(m.root), graph.node(m.data)
    gy, x, w = data.inputs
    pair = _lowered_pair(graph, data, scale, dict.fromkeys((data.op.algorithm, "codegen")), ctx)
    return rewrite_slot_pair(graph, ctx, pair, scale, [gy, x], data, [gy, x, w])


LN_BACKWARD_SUMS = FusionRule(NAME, match_ln_backward_sums, fuse_ln_backward_sums)

__all__ = ["NAME", "LABEL", "OPT_IN_NOTE", "match_ln_backward_sums", "fuse_ln_backward_sums", "LN_BACKWARD_SUMS"]
