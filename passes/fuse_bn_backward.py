"""The ``bn-backward-sums`` fusion rule: the training batch norm's data gradient
reuses the two sums its sibling gradients already computed.

The backward of ``BatchNormTraining(x, stats, weight, bias)`` is three nodes
reading the same output gradient ``gy`` (``opgraph/ops/batchnorm_training.py``;
Ioffe & Szegedy 2015, §3)::

    dbias   = BiasAddBackward(gy)                          sum(gy)          reads gy
    dweight = BatchNormTrainingBackwardScale(x, stats, gy) sum(gy * xhat)   reads x, gy
    dx      = BatchNormTrainingBackwardData(gy, x, stats, weight)

and the generated data gradient computes both sums again before its
element-wise phase: gy and x are read twice there, 8 passes over the tensors
per batch norm in all. The rule makes ``dx`` a
``BatchNormTrainingBackwardDataFromSums(gy, x, stats, dweight, dbias,
weight)`` node (the weight factors out of both sums: the op's docstring),
one element-wise pass: 6 passes in all.

A ``BatchNormTrainingBackwardData`` node (its id and name kept; nothing is
absorbed) is rewritten when

* a ``BatchNormTrainingBackwardScale`` of the same ``(x, stats, gy)`` and eps,
  and a ``BiasAddBackward`` of the same ``gy`` (a sum over every axis but the
  channel axis 1, as the data gradient's, in whatever layout gy is stored)
  are computed for the outputs anyway;
* the storage dtype is float32 or float64 (:data:`STORAGES`): the sums
  arrive in x's dtype, and in bfloat16 or float16 their rounding (2^-9,
  2^-12 relative) dominates dx where gy is nearly ``a + b * xhat`` per
  channel (measured: tests/passes/test_fuse_bn_backward.py, the cancellation
  case; the unfused kernel keeps its sums in fp32);
* the policy forces the node to no other algorithm, and the algorithm it was
  lowered to has a rule for the fused op that the policy does not exclude
  (the rule carries the tag ``fused``) and that does not decline it
  (``rewrite_lowered``): ``codegen`` on cuda, ``reference`` on the CPU, where
  the fused kernel also skips the two reductions (so no opt-in as for the
  element-wise chains). cuDNN has no such kernel: a node lowered to cuDNN
  stays.
"""

from __future__ import annotations

from opgraph.graph import Graph, NodeView
from opgraph.op import Lowered, abstract_of
from opgraph.ops import (BatchNormTrainingBackwardData, BatchNormTrainingBackwardDataFromSums,
                         BatchNormTrainingBackwardScale, BiasAddBackward)

from .base import PassContext
from .candidates import storage_dtype
from .pattern import FusionRule, Match, Scope, rewrite_lowered

#: Storage dtypes the rule applies to (module docstring: half sums are too coarse).
STORAGES = frozenset({"float32", "float64"})
LABEL = "batch-norm data gradient(s) from the scale and bias gradients' sums"


def _sibling(scope: Scope, gy: int, wanted) -> int | None:
    """The first reader of ``gy`` in the scope (graph order) that ``wanted(node)`` accepts."""
    found = [u for u in scope.readers(gy) if wanted(u)]
    return scope.sorted(found)[0] if found else None


def match_bn_backward_sums(scope: Scope, view: NodeView) -> Match | None:
    """A ``BatchNormTrainingBackwardData`` node with its scale and bias
    gradients (module docstring); the match's data is ``(scale node, bias node)``."""
    op = abstract_of(view.op)
    if not isinstance(op, BatchNormTrainingBackwardData):
        return None
    gy, x, stats = scope.graph.input_ids(view.id)[:3]
    storage = storage_dtype([scope.graph.node(x).type], scope.ctx.dtype)
    if storage not in STORAGES:
        scope.note("bn-backward-sums", f"{storage} storage: the sums would arrive rounded to it "
                                       "(passes/fuse_bn_backward.py)")
        return None

    def is_scale(u):
        other = scope.op(u)
        return (isinstance(other, BatchNormTrainingBackwardScale) and other.eps == op.eps
                and list(scope.graph.input_ids(u)) == [x, stats, gy])

    def is_bias(u):
        return isinstance(scope.op(u), BiasAddBackward) and list(scope.graph.input_ids(u)) == [gy]

    scale, bias = _sibling(scope, gy, is_scale), _sibling(scope, gy, is_bias)
    if scale is None or bias is None:
        return None
    return Match(view.id, (), LABEL, (scale, bias))


def fuse_bn_backward_sums(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Rewrite one match into ``BatchNormTrainingBackwardDataFromSums(gy, x,
    stats, dweight, dbias[, weight])``; returns None when done, else why not."""
    lowered = graph.node(m.root).op
    if not isinstance(lowered, Lowered):
        return "the data gradient is not lowered yet"
    name = graph.node(m.root).name
    forced = ctx.policy.forced(name)
    if forced is not None and forced != lowered.algorithm:
        return f"{name} is forced to {forced}"
    gy, x, stats, *weight = graph.node(m.root).inputs
    scale, bias = m.data
    inputs = [gy, x, stats, graph.value(scale), graph.value(bias), *weight]
    return rewrite_lowered(graph, m.root, [], BatchNormTrainingBackwardDataFromSums(eps=lowered.op.eps), inputs,
                           lowered.algorithm, ctx, what="batch-norm data gradient from sums")


BN_BACKWARD_SUMS = FusionRule("bn-backward-sums", match_bn_backward_sums, fuse_bn_backward_sums)


__all__ = ["STORAGES", "LABEL", "match_bn_backward_sums", "fuse_bn_backward_sums", "BN_BACKWARD_SUMS"]
