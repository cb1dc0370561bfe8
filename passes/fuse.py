"""The fuse pass: the fusion rule table, applied in order (``passes/pattern.py``).

The table (:data:`TABLE`), highest priority first; each entry's name turns
it off alone (``exclude=['conv-epilogue']``), and ``exclude=['fused']`` turns
every one off, and nothing else (the fused ops' rules carry the tag
``fused``):

0. ``bn-fold``: an inference-form batch norm after a convolution folded into
   the convolution's weights and bias (``passes/fold_bn.py``), so that rule 1
   sees a biased convolution;
1. ``conv-epilogue``: a convolution with its epilogue (bias, residual add,
   ReLU or ReLU6) -> one ``Conv2dBiasRelu`` / ``Conv2dBiasActivation`` node;
2. ``dgrad-relu``: backward-data with the ReLU gradient after it -> one
   ``Conv2dBackwardDataRelu`` node;
3. ``pool-relu-backward``: the gradient through a pooled ReLU -> one
   ``MaxPool2dBackwardRelu`` node;
4. ``pool-argmax``: a max pooling and its gradient -> the window scan once,
   its winners saved as 1-byte indices for a gather that does not read the
   pooled input (``passes/fuse_pool_argmax.py``; opt-in on the CPU's oracle
   kernels);
4b. ``pool-scan``: such a pooling's scan and take -> one ``MaxPool2dScan``
   that writes the pooled value and fills the winners' buffer, a
   ``MaxPool2dArgmaxSlot`` whose step only allocates
   (``passes/fuse_pool_scan.py``; opt-in on the CPU's oracle kernels);
5. ``bn-stats-parts``: the batch statistics of a channel concat -> the concat
   of its parts' statistics, each part's computed once and shared (DenseNet's
   dense layers; ``passes/share_bn_stats.py``);
6. ``bn-backward-sums``: a training batch norm's data, scale and bias
   gradients -> one ``BatchNormTrainingBackwardSums`` pass (float32 sums for
   half storage) read by ``BatchNormBackwardSumsRow`` (dbias, dweight) and
   ``BatchNormTrainingBackwardDataFromSums`` (dx) (``passes/fuse_bn_backward.py``);
7. ``bn-apply-remat``: an activation gradient reading a training batch norm's
   output gets its own recomputed copy, so that the forward fuses the batch
   norm with its activation (``passes/remat_bn_apply.py``; only where rule 10
   then fuses both);
8. ``bn-gradient-remat``: a ReLU or ReLU6 gradient that is a training batch
   norm's output gradient, the activation recomputed from the batch norm's
   input, copied into each of the two passes of rule 6, so that the gradient
   is never written (``passes/remat_bn_gradient.py``; only where rule 10 then
   fuses both);
8b. ``bias-remat``: a bias add (``BroadcastAdd``, ``BiasAdd``) read by several
   element-wise nodes (ConvNeXt's linear bias before its GELU and the GELU's
   gradient) gets a recomputed copy for each reader but the first, so that
   every reader's chain fuses it and it is never written
   (``passes/remat_bias_add.py``; only where rule 10 then fuses them all);
9. ``gradient-sum``: a tree of ``Add`` nodes summing a fan-out's gradients ->
   one n-ary sum (``passes/fuse_elementwise.py``);
10. ``elementwise``: maximal chains of memory-bound ops -> one
   ``FusedElementwise`` node, one generated kernel on cuda
   (``passes/fuse_elementwise.py``; opt-in on the CPU's oracle kernels);
11. ``relu-bias-sums``: a bias gradient of a ReLU gradient (or of a threshold gradient at
   threshold 0, the same mask) left out of the chains -> the ReLU
   gradient fills the bias gradient's slot with its per-channel sums in the same pass
   (``ReluBackwardSums``, ``ReluBackwardSumsSlot``; ``passes/fuse_relu_bias_sums.py``; opt-in on
   the CPU's oracle kernels);
12. ``ln-backward-sums``: a layer norm's weight gradient beside its data gradient (the same gy,
   x, ``normalized_shape`` and ``eps``) -> the data gradient's one-kernel row sweep fills the
   weight gradient's slot with its column sums (``LayerNormBackwardDataSums``,
   ``LayerNormBackwardScaleSlot``; ``passes/fuse_ln_backward_sums.py``; opt-in on the CPU's
   oracle kernels).

The epilogues come first so that a convolution's ReLU goes to cuDNN's fused
graph, not to a generated kernel; the batch-norm rule before the element-wise
ones so that a data gradient is not taken into a chain first.

A fused epilogue (cuDNN's conv -> bias -> add -> relu graph,
``backends/cuda/cudnn.py``; on the other algorithms the epilogue applied in
place on the fresh convolution output) saves a write and a read of the
convolution output per step it absorbs, and their kernel launches. The
forward rewrite (:func:`epilogue_chains`) applies to

* ``act(Conv2d(x, w, b))`` and ``act(Add(Conv2d(x, w, b), r))`` (either
  operand order: the ResNet block's shortcut added before its ReLU), with
  ``act`` a ``Relu`` or a ``Hardtanh(0, 6)`` (ReLU6, MobileNet);
* when the convolution output (and the ``Add``'s) has no other reader than
  the next node of the chain, apart from gradients of the activation that
  read the pre-activation (a hand-built ``HardtanhBackward`` or ``ReluBackward``;
  autodiff's read the activation's output, ``Relu.vjp`` and ``Hardtanh.vjp``):
  they read the fused output instead, whose mask is the same
  (``conv_fused``'s docstring); no node of the chain is an output;
* when the algorithm the convolution was lowered to has a rule for the fused
  op (``Conv2dBiasRelu`` for ReLU alone, else ``Conv2dBiasActivation``) that
  does not decline the node under the policy (excluding the tag ``fused``
  turns fusion off), and the policy forces no absorbed node elsewhere.

The fused op takes the convolution's node (and name), with the residual as
a fourth input; the ``Add`` and the activation are removed and their readers
read the fused node. It runs after ``lower`` and before ``autotune``, so the
fused node's own candidates (every cuDNN engine of the fused graph) are the
ones timed.

The backward of ``Conv2d(Relu(...))`` is ``ReluBackward(y, Conv2dBackwardData(gy,
w))`` with ``y`` the ReLU's output: :func:`dgrad_relu_pairs` makes it one
``Conv2dBackwardDataRelu(gy, w, y)`` node (cuDNN's conv_dgrad -> relu_backward
graph) when the backward-data output has no other reader, neither node is an
output, and the algorithm has a rule for the fused op. The backward of
``MaxPool2d(Relu(...))`` (VGG, AlexNet, OverFeat, GoogLeNet's stem) is
``ReluBackward(y, MaxPool2dBackward(y, gy))``: :func:`pool_relu_backward_pairs`
makes it one ``MaxPool2dBackwardRelu(y, gy)`` node under the same conditions;
the CUDA kernel folds ReLU's mask into the argmax it computes anyway. In both
the gradient's node keeps its name and the ``ReluBackward`` is removed.
Excluding ``fused`` turns every rewrite off.
"""

from __future__ import annotations

import attrs

from opgraph.graph import Graph, NodeView
from opgraph.op import Lowered, abstract_of
from opgraph.ops import (Add, Conv2d, Conv2dBackwardData, Conv2dBackwardDataRelu, HardtanhBackward,
                         MaxPool2dBackward, MaxPool2dBackwardRelu, ReluBackward)
from opgraph.ops.conv_fused import ACTIVATIONS, activation_of, fused_conv_forward

from .base import Pass, PassContext
from .fold_bn import BN_FOLD
from .fuse_bn_backward import BN_BACKWARD_SUMS
from .fuse_elementwise import ELEMENTWISE, GRADIENT_SUM
from .fuse_ln_backward_sums import LN_BACKWARD_SUMS
from .fuse_pool_argmax import POOL_ARGMAX
from .fuse_pool_scan import POOL_SCAN
from .fuse_relu_bias_sums import RELU_BIAS_SUMS
from .pattern import FusionRule, Match, Scope, apply_table, rewrite_lowered
from .remat_bias_add import BIAS_REMAT
from .remat_bn_apply import BN_APPLY_REMAT
from .remat_bn_gradient import BN_GRADIENT_REMAT
from .share_bn_stats import BN_STATS_PARTS


@attrs.frozen
class EpilogueChain:
    """A forward convolution and the epilogue the fuse pass may absorb: node
    ids of the ``Conv2d``, the ``Add`` of a residual (None without) and the
    activation node; ``activation`` its ``ACTIVATIONS`` name. The residual
    is the ``Add``'s other input, read when the chain is fused (an earlier
    rewrite may have replaced the node that computes it, e.g. the previous
    ResNet block's fused ReLU)."""

    conv: int
    act: int
    activation: str
    add: int | None = None

    def label(self) -> str:
        """``'conv + bias + add + relu6'``: what the chain fuses."""
        return "conv + bias" + (" + add" if self.add is not None else "") + f" + {self.activation}"


def _biased_conv(scope: Scope, node: int) -> bool:
    return isinstance(scope.op(node), Conv2d) and len(scope.graph.input_ids(node)) == 3


def _mask_reader(scope: Scope, node: int, pre: int, activation: str) -> bool:
    """Whether ``node`` is a gradient of ``activation`` masked by the
    pre-activation ``pre`` (its input 0 only), which the fused output can
    replace: the same mask (``conv_fused``'s docstring)."""
    op = scope.op(node)
    if activation == "relu":
        kind = isinstance(op, ReluBackward)
    else:
        kind = isinstance(op, HardtanhBackward) and (op.min_val, op.max_val) == ACTIVATIONS[activation]
    ids = scope.graph.input_ids(node)
    return kind and ids[0] == pre != ids[1]


def match_epilogue(scope: Scope, view: NodeView) -> Match | None:
    """``act(Conv2d(x, w, b))`` or ``act(Add(Conv2d(x, w, b), r))`` ending at
    activation ``view`` (module docstring: private intermediates, no node of
    the chain an output); the match's data is the :class:`EpilogueChain`."""
    activation = activation_of(abstract_of(view.op))
    if activation is None or scope.is_output(view.id):
        return None
    pre = scope.graph.input_ids(view.id)[0]
    others = [u for u in scope.readers(pre) if u != view.id]
    if scope.is_output(pre) or not all(_mask_reader(scope, u, pre, activation) for u in others):
        return None
    chain = None
    if _biased_conv(scope, pre):
        chain = EpilogueChain(pre, view.id, activation)
    elif isinstance(scope.op(pre), Add):
        a, b = scope.graph.input_ids(pre)
        for conv, other in ((a, b), (b, a)):
            if conv != other and scope.private(conv, [pre]) and _biased_conv(scope, conv):
                chain = EpilogueChain(conv, view.id, activation, pre)
                break
    if chain is None:
        return None
    absorbed = [n for n in (chain.add, chain.act) if n is not None]
    return Match(chain.conv, absorbed, f"{chain.label()} chain(s)", chain)


def epilogue_chains(graph: Graph, outputs) -> list[EpilogueChain]:
    """Every :class:`EpilogueChain` the ``conv-epilogue`` rule may fuse (of a
    graph lowered or not)."""
    return [m.data for m in _matches(match_epilogue, graph, outputs)]


def fuse_epilogue(graph: Graph, chain: EpilogueChain, ctx: PassContext) -> str | None:
    """Rewrite one :class:`EpilogueChain`; returns None when fused, else why not."""
    lowered = graph.node(chain.conv).op
    if not isinstance(lowered, Lowered):
        return "the convolution is not lowered yet"
    residual = [] if chain.add is None else [graph.value(i) for i in graph.input_ids(chain.add)
                                             if i != chain.conv]
    op = fused_conv_forward(lowered.op.conv_params(), chain.activation, bool(residual))
    inputs = graph.node(chain.conv).inputs + residual
    absorbed = [n for n in (chain.add, chain.act) if n is not None]
    return rewrite_lowered(graph, chain.conv, absorbed, op, inputs, lowered.algorithm, ctx,
                           what=f"fused {chain.label()} kernel")


def _private_producer(reader_type, slot: int, accept, label: str):
    """A match of ``(producer, reader)``: a ``reader_type`` node whose input
    ``slot`` comes from a node it alone reads, neither of them an output,
    and ``accept(scope, producer, reader)``; the producer is the root."""
    def match(scope: Scope, view: NodeView) -> Match | None:
        if not isinstance(abstract_of(view.op), reader_type) or scope.is_output(view.id):
            return None
        src = scope.graph.input_ids(view.id)[slot]
        if scope.private(src, [view.id]) and scope.readers(src) and accept(scope, src, view.id):
            return Match(src, [view.id], label)
        return None
    return match


match_dgrad_relu = _private_producer(
    ReluBackward, 1, lambda scope, dgrad, relu: isinstance(scope.op(dgrad), Conv2dBackwardData),
    "backward-data + relu backward pair(s)")
match_pool_relu_backward = _private_producer(
    ReluBackward, 1, lambda scope, pool, relu: (isinstance(scope.op(pool), MaxPool2dBackward)
                                                and scope.graph.input_ids(pool)[0] == scope.graph.input_ids(relu)[0]),
    "max-pool + relu backward pair(s)")


def dgrad_relu_pairs(graph: Graph, outputs) -> list[tuple[int, int]]:
    """``(backward-data node, ReLU-backward node)`` pairs of the form
    ``ReluBackward(y, Conv2dBackwardData(gy, w))``, the backward-data read by
    nothing else, neither of them an output."""
    return [(m.root, m.absorbed[0]) for m in _matches(match_dgrad_relu, graph, outputs)]


def fuse_dgrad_relu(graph: Graph, dgrad: int, relu: int, ctx: PassContext) -> str | None:
    """Rewrite one ``ReluBackward(y, Conv2dBackwardData(gy, w))`` pair into
    ``Conv2dBackwardDataRelu(gy, w, y)``; returns None when fused, else why not."""
    lowered = graph.node(dgrad).op
    if not isinstance(lowered, Lowered):
        return "the backward-data is not lowered yet"
    op = Conv2dBackwardDataRelu(**lowered.op.conv_params(), input_shape=lowered.op.input_shape)
    inputs = graph.node(dgrad).inputs + [graph.node(relu).inputs[0]]
    return rewrite_lowered(graph, dgrad, [relu], op, inputs, lowered.algorithm, ctx,
                           what="fused backward-data + relu backward kernel")


def pool_relu_backward_pairs(graph: Graph, outputs) -> list[tuple[int, int]]:
    """``(pooling gradient node, ReLU-backward node)`` pairs of the form
    ``ReluBackward(y, MaxPool2dBackward(y, gy))`` (the same ``y``), the pooling
    gradient read by nothing else, neither of them an output."""
    return [(m.root, m.absorbed[0]) for m in _matches(match_pool_relu_backward, graph, outputs)]


def fuse_pool_relu_backward(graph: Graph, pool: int, relu: int, ctx: PassContext) -> str | None:
    """Rewrite one ``ReluBackward(y, MaxPool2dBackward(y, gy))`` pair; returns
    None when fused, else why not."""
    lowered = graph.node(pool).op
    if not isinstance(lowered, Lowered):
        return "the pooling gradient is not lowered yet"
    return rewrite_lowered(graph, pool, [relu], MaxPool2dBackwardRelu(**lowered.op.pool_params()),
                           graph.node(pool).inputs, lowered.algorithm, ctx,
                           what="fused max-pool + relu backward kernel")


def _matches(match, graph: Graph, outputs) -> list[Match]:
    """Every match of one pattern on ``graph`` as it is (no rewrite), in graph order."""
    scope = Scope(graph, outputs, PassContext())
    return [m for m in (match(scope, v) for v in graph.nodes_in_order(outputs)) if m is not None]


#: The fusion table, in priority order (module docstring).
TABLE: tuple[FusionRule, ...] = (
    BN_FOLD,
    FusionRule("conv-epilogue", match_epilogue, lambda g, m, ctx: fuse_epilogue(g, m.data, ctx)),
    FusionRule("dgrad-relu", match_dgrad_relu, lambda g, m, ctx: fuse_dgrad_relu(g, m.root, m.absorbed[0], ctx)),
    FusionRule("pool-relu-backward", match_pool_relu_backward,
               lambda g, m, ctx: fuse_pool_relu_backward(g, m.root, m.absorbed[0], ctx)),
    POOL_ARGMAX,
    POOL_SCAN,
    BN_STATS_PARTS,
    BN_BACKWARD_SUMS,
    BN_APPLY_REMAT,
    BN_GRADIENT_REMAT,
    BIAS_REMAT,
    GRADIENT_SUM,
    ELEMENTWISE,
    RELU_BIAS_SUMS,
    LN_BACKWARD_SUMS,
)


#: Fusion rules that run only when the policy's ``include`` names them: their kernels have not yet
#: run on a GPU (each rule's ``OPT_IN_NOTE`` says so in the compile's notes), as ``relu-bias-sums`` and
#: ``pool-scan`` were until 2026-12-05. ``passes/policy_names.py`` counts such an include as acting.
OPT_IN_RULES = frozenset({LN_BACKWARD_SUMS.name})


def _outcome(rule: str, scope) -> dict:
    """``{'applied', 'declined'}`` of a rule the policy left on, plus ``'opt_in': True`` where it
    left nodes on the CPU's oracle kernels alone for want of ``include=['fused-reference']``
    (``Scope.waiting``): 0 rewrites that say "opt_in" (waiting for the include), not "nothing matched"."""
    out = {"applied": scope.applied.get(rule, 0), "declined": scope.declined.get(rule, 0)}
    if rule in scope.waiting:
        out["opt_in"] = True
    return out


class FusePass(Pass):
    """Apply the fusion table (see the module docstring); one note per kind of
    match (how many fused, which not and why) and per rule passed over."""

    name = "fuse"

    def __init__(self, table: tuple[FusionRule, ...] = TABLE):
        self.table = table

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        tallies, scope = apply_table(self.table, graph, outputs, ctx)
        for what, tally in tallies.items():
            ctx.report.note(f"fuse: {len(tally.done)} {what} fused"
                            + (f"; not fused: {'; '.join(tally.skipped)}" if tally.skipped else ""))
        for rule, whys in scope.notes.items():
            ctx.report.note(f"fuse: {rule}: not applied: {'; '.join(sorted(whys))}")
        # exclude=['fused'] turns every rule off through its fused ops' tag: each then declines
        every = "fused" in ctx.policy.exclude
        ctx.report.fusion = {rule.name: ({"excluded": True} if every or rule.name in ctx.policy.exclude else
                                         _outcome(rule.name, scope))
                             for rule in self.table}
        return graph


__all__ = ["FusePass", "TABLE", "OPT_IN_RULES", "EpilogueChain", "epilogue_chains", "fuse_epilogue", "match_epilogue",
           "dgrad_relu_pairs", "fuse_dgrad_relu", "match_dgrad_relu", "pool_relu_backward_pairs",
           "fuse_pool_relu_backward", "match_pool_relu_backward"]
