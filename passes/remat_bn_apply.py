"""The ``bn-apply-remat`` fusion rule: a training batch norm's output is
recomputed in the backward for an activation gradient that reads it, so that
the forward can fuse the batch norm with its activation.

SiLU's gradient (and hardswish's, sigmoid's, GELU's: every activation but
ReLU and ReLU6, whose gradients read their own output) reads the
activation's input. After a training batch norm that input is
``z = BatchNormTraining(x, stats, weight, bias)`` (the normalised, scaled and
shifted ``x``), read twice: by the activation in the forward and by its
gradient in the backward. The ``elementwise`` rule fuses a chain only
through values nobody else reads, so ``z`` is written by one kernel and read
back by another, and kept to the backward: on EfficientNet-B0 in bf16 at
batch 128 (the H200, 2026-12-02) 40 batch-norm applies and 48 SiLUs timed
alone 2.3 and 2.0 ms, moving 3.3 and 3.1 GB.

The rule gives the gradient its own ``z' = BatchNormTraining(x, stats,
weight, bias)``, a new node named ``<z>/remat`` (not forceable) on ``z``'s
algorithm, and nothing else changes. ``x`` and ``stats`` are read by the
batch norm's own backward, so they are kept to the backward with or without
the rule; ``weight`` and ``bias`` are parameters. Then ``elementwise`` fuses
``z`` into the activation (read ``x``, write the activation's output) and
``z'`` into the gradient (read ``x`` and the output gradient, write the
input gradient): per batch norm two full-tensor passes fewer (``z`` written
and read back) and ``z`` no longer kept from the forward to the backward
(Chen et al. 2016, "Training deep nets with sublinear memory cost", for
recomputation in the backward; Inductor's partitioner recomputes such cheap
element-wise producers the same way).

A gradient node ``g`` is rewritten when

* ``g`` is an activation gradient (``ActivationBackward``) reading ``z`` as
  its input 0 and not as its output gradient, and no output;
* ``z`` is a ``BatchNormTraining`` node, no output, whose readers are one
  forward activation (the node the forward fusion takes) and activation
  gradients reading it as ``g`` does;
* ``z`` and ``g`` run on one algorithm whose fused chains the ``elementwise``
  rule makes (:func:`.fuse_elementwise.fusable`: ``codegen`` on cuda; the
  oracle only with ``include=['fused-reference']``) and the policy excludes
  neither rule: without the fusion the copy would be a pass more, not two
  fewer.
"""

from __future__ import annotations

from opgraph.graph import Graph, NodeView
from opgraph.op import abstract_of
from opgraph.ops import BatchNormTraining
from opgraph.ops.activation import Activation, ActivationBackward

from .base import PassContext
from .fuse_elementwise import chains_declined
from .pattern import FusionRule, Match, Scope, add_lowered

NAME = "bn-apply-remat"
LABEL = "batch-norm output(s) recomputed for an activation gradient"



def _reads_as_input(scope: Scope, reader: int, z: int) -> bool:
    """Whether ``reader`` is an activation gradient reading ``z`` as its input 0 only."""
    ids = scope.graph.input_ids(reader)
    return isinstance(scope.op(reader), ActivationBackward) and ids[0] == z and z not in ids[1:]


def match_bn_apply_remat(scope: Scope, view: NodeView) -> Match | None:
    """An activation gradient reading a training batch norm's output that the
    forward activation could otherwise fuse with (module docstring)."""
    if not isinstance(abstract_of(view.op), ActivationBackward) or scope.is_output(view.id):
        return None
    z = scope.graph.input_ids(view.id)[0]
    if not isinstance(scope.op(z), BatchNormTraining) or scope.is_output(z) or not _reads_as_input(scope, view.id, z):
        return None
    readers = scope.readers(z)
    forward = [u for u in readers if isinstance(scope.op(u), Activation)]
    if len(forward) != 1 or not all(u in forward or _reads_as_input(scope, u, z) for u in readers):
        return None
    algorithm = scope.algorithm(z)
    if algorithm is None or scope.algorithm(view.id) != algorithm or scope.algorithm(forward[0]) != algorithm:
        return None
    return Match(view.id, (), LABEL, z)


def remat_bn_apply(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Give gradient ``m.root`` its own copy of batch norm ``m.data``; returns
    None when done, else why not (then nothing changed)."""
    z = graph.node(m.data)
    why = chains_declined(ctx, z.op.algorithm)
    if why:
        return f"no fused chain would take it: {why}"
    copy = add_lowered(graph, z.op, z.inputs, f"{z.name}/remat", ctx)
    gradient = graph.node(m.root)
    graph.rewrite(m.root, gradient.op, [copy, *gradient.inputs[1:]])
    return None


BN_APPLY_REMAT = FusionRule(NAME, match_bn_apply_remat, remat_bn_apply)


__all__ = ["NAME", "LABEL", "match_bn_apply_remat", "remat_bn_apply", "BN_APPLY_REMAT"]
