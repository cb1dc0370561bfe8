"""The fuse pass: a convolution with its epilogue (bias, residual add, ReLU or
ReLU6) into one node, backward-data with the ReLU gradient after it into one
node, and the gradient through a pooled ReLU into one ``MaxPool2dBackwardRelu``
node.

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
  read the pre-activation (``HardtanhBackward`` does, ``ReluBackward`` reads
  the ReLU output): they read the fused output instead, whose mask is the
  same (``conv_fused``'s docstring); no node of the chain is an output;
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

from opgraph.backends.registry import rules_for
from opgraph.graph import Graph
from opgraph.op import Lowered, abstract_of
from opgraph.ops import (Add, Conv2d, Conv2dBackwardData, Conv2dBackwardDataRelu, HardtanhBackward,
                         MaxPool2dBackward, MaxPool2dBackwardRelu, ReluBackward)
from opgraph.ops.conv_fused import ACTIVATIONS, activation_of, fused_conv_forward

from .base import Pass, PassContext
from .candidates import decline_reason


def _private_producers(graph: Graph, outputs, reader_type, slot: int, accept) -> list[tuple[int, int]]:
    """``(producer, reader)`` pairs: each ``reader_type`` node whose input
    ``slot`` comes from a node it alone reads (among the outputs' ancestors),
    neither of them an output, and ``accept(producer node, reader id)``."""
    keep = {v.node for v in outputs}
    scope = graph.ancestors(outputs)
    pairs = []
    for view in graph.nodes_in_order(outputs):
        if not isinstance(abstract_of(view.op), reader_type) or view.id in keep:
            continue
        src = graph.input_ids(view.id)[slot]
        readers = [u for u in graph.users(src) if u in scope]
        if src not in keep and readers == [view.id] and accept(graph.node(src), view.id):
            pairs.append((src, view.id))
    return pairs


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


def _biased_conv(graph: Graph, node: int) -> bool:
    view = graph.node(node)
    return isinstance(abstract_of(view.op), Conv2d) and len(view.inputs) == 3


def _mask_reader(graph: Graph, node: int, pre: int, activation: str) -> bool:
    """Whether ``node`` is a gradient of ``activation`` masked by the
    pre-activation ``pre`` (its input 0 only), which the fused output can
    replace: the same mask (``conv_fused``'s docstring)."""
    op = abstract_of(graph.node(node).op)
    if activation == "relu":
        kind = isinstance(op, ReluBackward)
    else:
        kind = isinstance(op, HardtanhBackward) and (op.min_val, op.max_val) == ACTIVATIONS[activation]
    return kind and graph.input_ids(node)[0] == pre != graph.input_ids(node)[1]


def epilogue_chains(graph: Graph, outputs) -> list[EpilogueChain]:
    """Every ``act(Conv2d(x, w, b))`` and ``act(Add(Conv2d(x, w, b), r))`` chain
    the forward rewrite may fuse (module docstring: private intermediates,
    no node of the chain an output)."""
    keep = {v.node for v in outputs}
    scope = graph.ancestors(outputs)

    def readers(node):
        return [u for u in graph.users(node) if u in scope]

    chains = []
    for view in graph.nodes_in_order(outputs):
        activation = activation_of(abstract_of(view.op))
        if activation is None or view.id in keep:
            continue
        pre = graph.input_ids(view.id)[0]
        others = [u for u in readers(pre) if u != view.id]
        if pre in keep or not all(_mask_reader(graph, u, pre, activation) for u in others):
            continue
        if _biased_conv(graph, pre):
            chains.append(EpilogueChain(pre, view.id, activation))
        elif isinstance(abstract_of(graph.node(pre).op), Add):
            a, b = graph.input_ids(pre)
            for conv, other in ((a, b), (b, a)):
                private = conv not in keep and readers(conv) == [pre]
                if conv != other and private and _biased_conv(graph, conv):
                    chains.append(EpilogueChain(conv, view.id, activation, pre))
                    break
    return chains


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
    return _rewrite(graph, chain.conv, absorbed, op, inputs, f"fused {chain.label()} kernel", ctx)


def dgrad_relu_pairs(graph: Graph, outputs) -> list[tuple[int, int]]:
    """``(backward-data node, ReLU-backward node)`` pairs of the form
    ``ReluBackward(y, Conv2dBackwardData(gy, w))``, the backward-data read by
    nothing else, neither of them an output."""
    return _private_producers(graph, outputs, ReluBackward, 1, lambda dgrad, relu: (
        isinstance(abstract_of(dgrad.op), Conv2dBackwardData)))


def fuse_dgrad_relu(graph: Graph, dgrad: int, relu: int, ctx: PassContext) -> str | None:
    """Rewrite one ``ReluBackward(y, Conv2dBackwardData(gy, w))`` pair into
    ``Conv2dBackwardDataRelu(gy, w, y)``; returns None when fused, else why not."""
    lowered = graph.node(dgrad).op
    if not isinstance(lowered, Lowered):
        return "the backward-data is not lowered yet"
    op = Conv2dBackwardDataRelu(**lowered.op.conv_params(), input_shape=lowered.op.input_shape)
    inputs = graph.node(dgrad).inputs + [graph.node(relu).inputs[0]]
    return _rewrite(graph, dgrad, [relu], op, inputs, "fused backward-data + relu backward kernel", ctx)


def pool_relu_backward_pairs(graph: Graph, outputs) -> list[tuple[int, int]]:
    """``(pooling gradient node, ReLU-backward node)`` pairs of the form
    ``ReluBackward(y, MaxPool2dBackward(y, gy))`` (the same ``y``), the pooling
    gradient read by nothing else, neither of them an output."""
    return _private_producers(graph, outputs, ReluBackward, 1, lambda pool, relu: (
        isinstance(abstract_of(pool.op), MaxPool2dBackward)
        and graph.input_ids(pool.id)[0] == graph.input_ids(relu)[0]))


def fuse_pool_relu_backward(graph: Graph, pool: int, relu: int, ctx: PassContext) -> str | None:
    """Rewrite one ``ReluBackward(y, MaxPool2dBackward(y, gy))`` pair; returns
    None when fused, else why not."""
    lowered = graph.node(pool).op
    if not isinstance(lowered, Lowered):
        return "the pooling gradient is not lowered yet"
    return _rewrite(graph, pool, [relu], MaxPool2dBackwardRelu(**lowered.op.pool_params()),
                    graph.node(pool).inputs, "fused max-pool + relu backward kernel", ctx)


def _rewrite(graph: Graph, node: int, absorbed: list[int], fused, inputs, what: str,
             ctx: PassContext) -> str | None:
    """``node`` computes ``fused`` on ``inputs`` with its algorithm and options,
    and the ``absorbed`` nodes are removed, in order (their readers read
    ``node``); None when done, else why not (the policy forces an absorbed
    node onto another algorithm, no rule of the algorithm for the fused op,
    excluded by the policy, declined)."""
    lowered = graph.node(node).op
    names = [graph.node(a).name for a in absorbed]
    for absorbed_name in names:
        forced = ctx.policy.forced(absorbed_name)
        if forced is not None and forced != lowered.algorithm:  # fusing would drop the user's choice
            return f"{absorbed_name} is forced to {forced}, {graph.node(node).name} runs {lowered.algorithm}"
    rule = rules_for(type(fused)).get(lowered.algorithm)
    if rule is None:
        return f"{lowered.algorithm} has no {what}"
    # engine indices belong to one cuDNN graph: the fused graph's are chosen anew
    options = {k: v for k, v in lowered.options if k != "engine"}
    types = tuple(v.type for v in inputs)
    why = (ctx.policy.exclusion(rule.algorithm, rule.tags)
           or decline_reason(rule, fused, types, ctx.device, ctx.policy, options))
    if why:
        return why
    new = Lowered(fused, lowered.algorithm, ctx.device, options)
    name = graph.node(node).name
    graph.rewrite(node, new, inputs)
    for a in absorbed:
        graph.absorb(a, node)
    rec = ctx.report.nodes.get(name)
    if rec is not None:  # the report shows the final choice; autotune re-tunes it
        rec.op, rec.op_type, rec.chosen, rec.options = fused.describe(), fused.name, new.describe(), options
    for absorbed_name in names:
        ctx.report.nodes.pop(absorbed_name, None)
    return None


class FusePass(Pass):
    """Fuse each eligible convolution epilogue, backward-data + ReLU gradient
    pair and pooled ReLU's gradient pair (see the module docstring)."""

    name = "fuse"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        results: dict[str, tuple[list, list]] = {}
        for chain in epilogue_chains(graph, outputs):
            nodes = (chain.conv, chain.add, chain.act)
            names = " + ".join(graph.node(n).name for n in nodes if n is not None)
            self._record(results, f"{chain.label()} chain(s)", names, fuse_epilogue(graph, chain, ctx))
        for what, find, fuse in (("backward-data + relu backward pair(s)", dgrad_relu_pairs, fuse_dgrad_relu),
                                 ("max-pool + relu backward pair(s)", pool_relu_backward_pairs,
                                  fuse_pool_relu_backward)):
            for keep, drop in find(graph, outputs):
                names = f"{graph.node(keep).name} + {graph.node(drop).name}"
                self._record(results, what, names, fuse(graph, keep, drop, ctx))
        for what, (done, skipped) in results.items():
            ctx.report.note(f"fuse: {len(done)} {what} fused"
                            + (f"; not fused: {'; '.join(skipped)}" if skipped else ""))
        return graph

    @staticmethod
    def _record(results, what: str, names: str, why: str | None) -> None:
        done, skipped = results.setdefault(what, ([], []))
        (skipped.append(f"{names} ({why})") if why else done.append(names))


__all__ = ["FusePass", "EpilogueChain", "epilogue_chains", "fuse_epilogue", "dgrad_relu_pairs",
           "fuse_dgrad_relu", "pool_relu_backward_pairs", "fuse_pool_relu_backward"]
