"""The ``bn-fold`` fusion rule: an inference-form batch norm after a
convolution is folded into the convolution's weights and bias.

``BatchNorm`` (``opgraph/ops/norm.py``) is an affine map per channel, so
after a convolution it composes with it (Ioffe & Szegedy 2015, §3.2: the
inference network's normalisation is a fixed linear transform; Jacob et al.
2018, "Quantization and training of neural networks for efficient
integer-arithmetic-only inference", §3.2, for folding it into the weights).
With ``s = scale / sqrt(var + eps)`` per output channel o::

    BatchNorm(Conv2d(x, w, b), scale, bias, mean, var)
        = Conv2d(x, w * s[o], (b - mean) * s + bias)       (b = 0 without a bias)

The folded weights and bias are computed in the step from the current
parameters and statistics (a batch norm's running statistics are buffers a
training step may update), by ops that exist for the batch norm already:

    <bn>/fold_weight = Reshape(BatchNormBackwardData(Reshape(w, (1, O, I*kh*kw)), scale, var), w's shape)
    <bn>/fold_bias   = Reshape(BatchNorm(Reshape(b, (1, O)) or Zeros((1, O)), scale, bias, mean, var), (O,))

(``BatchNormBackwardData(g, scale, var)`` is ``g * scale * s`` over axis 1,
and ``BatchNorm`` of the bias is ``(b - mean) * s + bias``), each lowered as
the lower pass would lower it (:func:`.candidates.survey`; not forceable).
Their cost is one pass over the weights and a few over (O,) vectors; the
batch norm's own pass over the activations (a read and a write of the
convolution output) is gone, and the biased convolution is then open to the
``conv-epilogue`` rule (conv + bias + ReLU in one cuDNN graph).

The convolution keeps its node (id, name, algorithm) and now computes the
batch norm's output; the batch norm is absorbed (its readers read the
convolution). A ``BatchNorm`` node is folded when

* it reads a plain ``Conv2d`` (not yet fused) whose output nothing else in
  the scope reads, and neither node is an output: a training step that
  differentiates the batch norm's scale reads the convolution output in
  ``BatchNormBackwardScale``, so there both stay;
* both are lowered, the policy forces the batch norm onto no other algorithm
  than the convolution's, and every new node has a lowering;
* the convolution's algorithm takes the folded bias (a third input).

The rule runs first in the table, so that the ``conv-epilogue`` rule sees the
folded, biased convolution. ``exclude=['bn-fold']`` turns it off alone and
``exclude=['fused']`` with the rest of the table.
"""

from __future__ import annotations

import math

import attrs

from opgraph.errors import OpgraphError
from opgraph.graph import Graph, NodeView
from opgraph.op import Lowered, Op
from opgraph.ops import BatchNorm, BatchNormBackwardData, Conv2d, Reshape, Zeros
from opgraph.types import TensorType

from .base import PassContext
from .candidates import survey
from .pattern import FusionRule, Match, Scope, add_lowered, forced_elsewhere, lowered_for, rewrite_lowered

NAME = "bn-fold"
LABEL = "convolution + inference batch norm (folded into the weights)"
WHAT = "convolution with a folded bias"


def match_bn_fold(scope: Scope, view: NodeView) -> Match | None:
    """A ``BatchNorm`` reading a plain ``Conv2d`` only it reads (module docstring);
    the convolution is the root."""
    op = scope.op(view.id)
    if type(op) is not BatchNorm or scope.is_output(view.id):
        return None
    conv = scope.graph.input_ids(view.id)[0]
    if type(scope.op(conv)) is not Conv2d or not scope.private(conv, [view.id]):
        return None
    if scope.algorithm(conv) is None or scope.algorithm(view.id) is None:
        return None
    return Match(conv, (view.id,), LABEL)


def _lowering(name: str, op: Op, types, ctx: PassContext) -> Lowered | str:
    """``op`` on ``types`` lowered as the lower pass would lower a node of
    that name that no force key names, or why it cannot be."""
    s = survey(name, op, tuple(types), ctx.device, ctx.policy, force_name=None, dtype=ctx.dtype)
    applicable = s.applicable()
    if not applicable:
        why = "; ".join(f"{a}: {r}" for a, r in s.declined().items()) or "no rule registered"
        return f"no lowering of {op.name} for {name} on {ctx.device} ({why})"
    entry = applicable[0]
    return Lowered(op, entry.rule.algorithm, ctx.device, dict(entry.options))


def _planned(graph: Graph, conv: NodeView, bn: NodeView):
    """The new nodes, in order: ``(key, op, inputs)`` with inputs as keys of
    earlier entries or values of the graph, and each one's type; the folded
    weight and bias are the entries ``'weight'`` and ``'bias'``."""
    x, w, *b = conv.inputs
    _, scale, bias, mean, var = bn.inputs
    o = w.type.shape[0]
    eps = bn.op.op.eps
    plan = [("weight/rows", Reshape(shape=(1, o, math.prod(w.type.shape[1:]))), [w]),
            ("weight/scaled", BatchNormBackwardData(eps=eps), ["weight/rows", scale, var]),
            ("weight", Reshape(shape=w.type.shape), ["weight/scaled"])]
    if b:
        plan.append(("bias/row", Reshape(shape=(1, o)), [b[0]]))
    else:
        plan.append(("bias/row", Zeros(type=TensorType((1, o), w.type.dtype)), []))
    plan += [("bias/folded", BatchNorm(eps=eps), ["bias/row", scale, bias, mean, var]),
             ("bias", Reshape(shape=(o,)), ["bias/folded"])]
    types = {}
    for key, op, inputs in plan:
        types[key] = op.infer(*[types[i] if isinstance(i, str) else i.type for i in inputs])
    return plan, types


def fold_bn(graph: Graph, m: Match, ctx: PassContext) -> str | None:
    """Fold batch norm ``m.absorbed[0]`` into convolution ``m.root``; returns
    None when done, else why not (then nothing changed: every new node's
    lowering and the folded convolution's are settled first)."""
    conv, bn = graph.node(m.root), graph.node(m.absorbed[0])
    algorithm = conv.op.algorithm
    # the rewrite makes no fused op whose rules' tag would keep it out: the tag is asked here
    why = ctx.policy.exclusion(NAME, ("fused",)) or forced_elsewhere(graph, m.root, m.absorbed, algorithm, ctx)
    if why:
        return why
    try:
        plan, types = _planned(graph, conv, bn)
    except OpgraphError as e:  # e.g. statistics in another dtype than the weights
        return f"the folding ops reject the operands: {e}"
    prefix = bn.name
    lowered = {}
    for key, op, inputs in plan:
        lowered[key] = _lowering(f"{prefix}/fold_{key}", op,
                                 [types[i] if isinstance(i, str) else i.type for i in inputs], ctx)
        if isinstance(lowered[key], str):
            return lowered[key]
    options = {k: v for k, v in conv.op.options if k != "engine"}  # the biased graph's engines are its own
    weight_type = attrs.evolve(types["weight"], layout=conv.inputs[1].type.layout)  # stored as the weights
    new_conv = lowered_for(conv.op.op, (conv.inputs[0].type, weight_type, types["bias"]), algorithm, ctx,
                           options, WHAT)
    if isinstance(new_conv, str):
        return new_conv
    values = {}
    for key, _, inputs in plan:
        values[key] = add_lowered(graph, lowered[key], [values[i] if isinstance(i, str) else i for i in inputs],
                                  f"{prefix}/fold_{key}", ctx)
    if weight_type.layout is not None:
        graph.set_layout(values["weight"].node, weight_type.layout)
    return rewrite_lowered(graph, m.root, m.absorbed, conv.op.op, [conv.inputs[0], values["weight"], values["bias"]],
                           algorithm, ctx, options, WHAT)


BN_FOLD = FusionRule(NAME, match_bn_fold, fold_bn)


__all__ = ["NAME", "LABEL", "match_bn_fold", "fold_bn", "BN_FOLD"]
