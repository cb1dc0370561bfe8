"""The ``bn-gradient-remat`` fusion rule: a ReLU or ReLU6 gradient that is a
training batch norm's output gradient is recomputed inside each of the two
passes of the batch norm's backward, so that it is never written.

After ``bn-backward-sums`` the backward of ``z = BatchNormTraining(x, stats,
weight, bias)`` reads its output gradient ``gy`` twice
(``passes/fuse_bn_backward.py``)::

    sums = BatchNormTrainingBackwardSums(x, stats, gy)                        reads x, gy
    dx   = BatchNormTrainingBackwardDataFromSums(gy, x, stats, sums, weight)  reads gy, x; writes dx

After a ReLU6 (MobileNet-v2) ``gy = HardtanhBackward(y, g)`` with ``y =
ReLU6(z)`` kept from the forward: a third kernel reads ``g`` and ``y`` and
writes ``gy``, 8 full-tensor passes per batch norm. On the H200 in bf16
(2026-12-03) MobileNet-v2's 34 such steps took 1.20 of its 12.3 ms step
replayed alone; Inductor fuses the same gradient into its batch-norm
backward kernels.

The rule gives each pass its own ``gy``, with the activation recomputed from
``x``, which both passes read anyway: ``z1 = BatchNormTraining(x, stats,
weight, bias)``, ``y1 = ReLU6(z1)``, ``gy1 = HardtanhBackward(y1, g)`` (the
original gradient node, reading ``y1``) for the sums, and a second copy for
dx. The ``elementwise`` rule then fuses each copy into its pass
(``fuse_elementwise.CHAIN_ENDS``): the sums read ``x`` and ``g``; dx reads
``g`` and ``x`` and writes dx: 5 passes, no ``gy`` written, and ``y`` is no
longer kept for the backward (Chen et al. 2016, "Training deep nets with
sublinear memory cost", for recomputation in the backward). Measured on the
H200, bf16 (docs/performance.md, tenth session): MobileNet-v2's step 12.35
-> 11.92 ms.

Only this form: a wider one (any private tree of memory-bound nodes making
``gy``; SiLU's gradient after ``bn-apply-remat``; EfficientNet-B0's
squeeze-and-excitation gradients, whose per-plane operands the reduction
reads) made EfficientNet-B0's backward 1.6 ms slower in the same
measurement, and ``dgrad-relu`` giving ReLU gradients before a convolution
to this rule changed ResNet-50 and DenseNet-121 by under 0.1 ms; both were
dropped.

Numbers: the recomputed ``y1`` is never rounded to the storage dtype (the
generated kernels keep intermediates in fp32), so the mask comes from the
fp32 ``z1``, as the forward's fused batch norm + ReLU6 computed it from the
same stored ``x``; the per-node check holds such chains to their members'
float64 kernels on the operands they were fed (``benchmarks/check.py``).

A ``BatchNormTrainingBackwardDataFromSums`` node ``d`` (not an output) is
rewritten when

* its sums come from a ``BatchNormTrainingBackwardSums`` of the same ``x``,
  ``stats`` and ``gy``, and ``gy`` is read by those two nodes only, no output;
* ``gy`` is a ``ReluBackward`` or ``HardtanhBackward`` whose mask operand is a
  ``Relu`` or ``Hardtanh`` of a ``BatchNormTraining`` of that ``x`` and
  ``stats``, all on ``d``'s algorithm, ``gy`` not forced elsewhere;
* that algorithm's fused chains are made (``fuse_elementwise.fusable``:
  ``codegen`` on cuda; the oracle only with ``include=['fused-reference']``),
  the policy excludes neither this rule nor ``elementwise``, and its
  ``FusedElementwise`` rule accepts the chain with either pass.

The new nodes are named ``<node>/remat`` (``_2`` for the second copy) and
cannot be forced.
"""

from __future__ import annotations

import attrs

from opgraph.graph import Graph, NodeView
from opgraph.op import abstract_of
from opgraph.ops import (BatchNormTraining, BatchNormTrainingBackwardDataFromSums, BatchNormTrainingBackwardSums,
                         Hardtanh, HardtanhBackward, Relu, ReluBackward)

from .base import PassContext
from .fuse_elementwise import chains_declined, declines
from .pattern import FusionRule, Match, Scope, add_lowered, forced_onto

NAME = "bn-gradient-remat"
LABEL = "batch-norm output gradient(s) recomputed in both backward passes"
#: gradient op -> the activation whose output it masks with
MASKS = {ReluBackward: Relu, HardtanhBackward: Hardtanh}


@attrs.frozen
class Plan:
    """What the rewrite copies: the sums node, the gradient node ``gy`` and
    the batch norm and activation nodes that make its mask operand."""

    sums: int
    gradient: int
    bn: int
    activation: int


def match_bn_gradient_remat(scope: Scope, view: NodeView) -> Match | None:
    """A batch-norm data gradient whose output gradient is a ReLU or ReLU6
    gradient of that batch norm's output (module docstring)."""
    if not isinstance(abstract_of(view.op), BatchNormTrainingBackwardDataFromSums) or scope.is_output(view.id):
        return None
    graph = scope.graph
    gy, x, stats, sums = graph.input_ids(view.id)[:4]
    if not isinstance(scope.op(sums), BatchNormTrainingBackwardSums) or graph.input_ids(sums) != [x, stats, gy]:
        return None
    if scope.is_output(gy) or set(scope.readers(gy)) != {view.id, sums}:
        return None
    mask = MASKS.get(type(scope.op(gy)))
    y = graph.input_ids(gy)[0]
    if mask is None or not isinstance(scope.op(y), mask):
        return None
    z = graph.input_ids(y)[0]
    if not isinstance(scope.op(z), BatchNormTraining) or graph.input_ids(z)[:2] != [x, stats]:
        return None
    algorithm = scope.algorithm(view.id)
    if algorithm is None or any(scope.algorithm(n) != algorithm for n in (sums, gy, y, z)):
        return None
    if forced_onto(scope.ctx, graph.node(gy).name) not in (None, algorithm):
        return None
    return Match(view.id, (), LABEL, Plan(sums, gy, z, y), rewired=(gy,))


def _recomputed(graph: Graph, plan: Plan, ctx: PassContext):
    """A new ``activation(BatchNormTraining(x, ...))``: the mask operand from x."""
    bn, act = graph.node(plan.bn), graph.node(plan.activation)
    z = add_lowered(graph, bn.op, bn.inputs, f"{bn.name}/remat", ctx)
    return add_lowered(graph, act.op, [z], f"{act.name}/remat", ctx)


def remat_bn_gradient(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Give both backward passes of ``m`` their own ``gy`` (module docstring);
    returns None when done, else why not (then nothing changed)."""
    plan: Plan = m.data
    algorithm = graph.node(m.root).op.algorithm
    why = chains_declined(ctx, algorithm)
    chain = [plan.bn, plan.activation, plan.gradient]
    for reader in (plan.sums, m.root):
        why = why or declines(graph, [*chain, reader], algorithm, ctx)
    if why:
        return f"no fused chain would take it: {why}"
    gradient = graph.node(plan.gradient)
    g = gradient.inputs[1]
    graph.rewrite(plan.gradient, gradient.op, [_recomputed(graph, plan, ctx), g])  # the sums' pass
    copy = add_lowered(graph, gradient.op, [_recomputed(graph, plan, ctx), g], f"{gradient.name}/remat", ctx)
    data = graph.node(m.root)
    graph.rewrite(m.root, data.op, [copy, *data.inputs[1:]])
    return None


BN_GRADIENT_REMAT = FusionRule(NAME, match_bn_gradient_remat, remat_bn_gradient)


__all__ = ["NAME", "LABEL", "MASKS", "Plan", "match_bn_gradient_remat", "remat_bn_gradient", "BN_GRADIENT_REMAT"]
