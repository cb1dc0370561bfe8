"""The ``bn-backward-sums`` fusion rule: the training batch norm's three
gradients share one pass computing their two per-channel sums.

The backward of ``BatchNormTraining(x, stats, weight, bias)`` is three nodes
reading the same output gradient ``gy`` (``opgraph/ops/batchnorm_training.py``;
Ioffe & Szegedy 2015, §3)::

    dbias   = BiasAddBackward(gy)                          sum(gy)          reads gy
    dweight = BatchNormTrainingBackwardScale(x, stats, gy) sum(gy * xhat)   reads x, gy
    dx      = BatchNormTrainingBackwardData(gy, x, stats, weight)

and the generated data gradient computes both sums again before its
element-wise phase: 8 passes over the tensors per batch norm. The rule
rewrites the trio into (``opgraph/ops/batchnorm_sums.py``)::

    sums    = BatchNormTrainingBackwardSums(x, stats, gy)     (2, C), float32 for half storage
    dbias   = BatchNormBackwardSumsRow(row=0)(sums, x)                rounded to the storage dtype
    dweight = BatchNormBackwardSumsRow(row=1)(sums, x)
    dx      = BatchNormTrainingBackwardDataFromSums(gy, x, stats, sums, weight)

5 passes (the sums read x and gy; dx reads gy and x and writes dx). The
three nodes keep their ids and names (dbias and dweight are parameter
gradients, outputs of the step); the sums node is new, named
``<data gradient>/sums``, and not forceable. The sums stay in the
statistics' dtype: rounded to bfloat16 they would dominate dx where gy is
nearly ``a + b * xhat`` per channel (tests/passes/test_fuse_bn_backward.py).

A ``BatchNormTrainingBackwardData`` node is rewritten when

* a ``BatchNormTrainingBackwardScale`` of the same ``(x, stats, gy)`` and eps,
  and a ``BiasAddBackward`` of the same ``gy`` (a sum over every axis but the
  channel axis 1, as the data gradient's, in whatever layout gy is stored)
  are computed for the outputs anyway;
* the policy forces none of the three to another algorithm than the data
  gradient's, and that algorithm has a rule for each of the three new ops
  that the policy does not exclude (the rules carry the tag ``fused``) and
  that does not decline it: ``codegen`` on cuda, ``reference`` on the CPU,
  where the fused kernels also skip two reductions (so no opt-in as for the
  element-wise chains). cuDNN has no such kernels: a data gradient lowered
  to cuDNN stays, and so do its siblings.
"""

from __future__ import annotations

from opgraph.graph import Graph, NodeView
from opgraph.op import Lowered, abstract_of
from opgraph.ops import (BatchNormBackwardSumsRow, BatchNormTrainingBackwardData, BatchNormTrainingBackwardDataFromSums,
                         BatchNormTrainingBackwardScale, BatchNormTrainingBackwardSums, BiasAddBackward)
from opgraph.ops.batchnorm_sums import SUM_GY, SUM_GY_XHAT

from .base import PassContext
from .pattern import FusionRule, Match, Scope, add_lowered, forced_elsewhere, lowered_for, report_rewrite

LABEL = "batch-norm backward(s) sharing one pass of per-channel sums"
WHAT = "batch-norm backward from sums"


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


def _planned(graph: Graph, m: Match) -> dict:
    """The rewrite's ops and their input types: ``'sums'`` (the new node) and
    the scale, bias and data gradient nodes' ids -> ``(op, types)``."""
    data = graph.node(m.root)
    gy, x, stats, *weight = (v.type for v in data.inputs)
    eps = abstract_of(data.op).eps
    scale, bias = m.data
    sums_op = BatchNormTrainingBackwardSums(eps=eps)
    sums = sums_op.infer(x, stats, gy)
    return {"sums": (sums_op, (x, stats, gy)),
            scale: (BatchNormBackwardSumsRow(row=SUM_GY_XHAT), (sums, x)),
            bias: (BatchNormBackwardSumsRow(row=SUM_GY), (sums, x)),
            m.root: (BatchNormTrainingBackwardDataFromSums(eps=eps), (gy, x, stats, sums, *weight))}


def fuse_bn_backward_sums(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Rewrite one match (module docstring); returns None when done, else why
    not (then nothing changed: every new op's lowering is settled first)."""
    lowered = graph.node(m.root).op
    if not isinstance(lowered, Lowered):
        return "the data gradient is not lowered yet"
    why = forced_elsewhere(graph, m.root, (m.root, *m.data), lowered.algorithm, ctx)
    if why:
        return why
    options = {k: v for k, v in lowered.options if k != "engine"}  # engine indices are cuDNN's
    new = {}
    for key, (op, types) in _planned(graph, m).items():
        new[key] = lowered_for(op, types, lowered.algorithm, ctx, options, WHAT)
        if isinstance(new[key], str):
            return new[key]
    gy, x, stats, *weight = graph.node(m.root).inputs
    sums = add_lowered(graph, new["sums"], [x, stats, gy], f"{graph.node(m.root).name}/sums", ctx)
    scale, bias = m.data
    # the rows read x for its dtype, not gy: gy's last reader stays dx, which may overwrite it
    for node, inputs in ((scale, [sums, x]), (bias, [sums, x]), (m.root, [gy, x, stats, sums, *weight])):
        graph.rewrite(node, new[node], inputs)
        report_rewrite(ctx, graph.node(node).name, new[node])
    return None


BN_BACKWARD_SUMS = FusionRule("bn-backward-sums", match_bn_backward_sums, fuse_bn_backward_sums)


__all__ = ["LABEL", "match_bn_backward_sums", "fuse_bn_backward_sums", "BN_BACKWARD_SUMS"]
