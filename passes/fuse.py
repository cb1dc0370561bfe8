"""The fuse pass: conv + bias + ReLU into one ``Conv2dBiasRelu`` node, and the
gradient through a pooled ReLU into one ``MaxPool2dBackwardRelu`` node.

A fused epilogue (cuDNN's conv -> bias -> relu graph, ``backends/cuda/cudnn.py``;
on the other algorithms the ReLU applied in place on the fresh convolution
output) saves one write and one read of the convolution output and one
kernel launch. The rewrite applies to ``Relu(Conv2d(x, w, b))`` when

* the convolution output has no other reader (``Relu``'s gradient reads the
  ReLU *output*, so training graphs qualify) and neither node is an output;
* the algorithm the convolution was lowered to has a rule for
  ``Conv2dBiasRelu`` that does not decline the node under the policy
  (excluding the tag ``fused`` turns fusion off).

The fused op takes the convolution's node (and name), the ReLU node is
removed and its readers read the fused node. It runs after ``lower`` and
before ``autotune``, so the fused node's own candidates (every cuDNN engine
of the fused graph) are the ones timed.

The backward of ``MaxPool2d(Relu(...))`` (VGG, AlexNet, OverFeat, GoogLeNet's
stem) is ``ReluBackward(y, MaxPool2dBackward(y, gy))`` with ``y`` the ReLU's
output read by both: the second rewrite makes it one
``MaxPool2dBackwardRelu(y, gy)`` node when the pooling gradient has no other
reader, neither node is an output, and the pooling gradient's algorithm has a
rule for the fused op. The pooling gradient's node keeps its name; the
ReLU-backward node is removed. The CUDA kernel folds ReLU's mask into the
argmax it computes anyway, so a full pass over the largest activations
(read y, read and write the gradient) disappears. Excluding ``fused`` turns
both rewrites off.
"""

from __future__ import annotations

from opgraph.backends.registry import rules_for
from opgraph.graph import Graph
from opgraph.op import Lowered, abstract_of
from opgraph.ops import (Conv2d, Conv2dBiasRelu, MaxPool2dBackward, MaxPool2dBackwardRelu, Relu,
                         ReluBackward)

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


def fusable_chains(graph: Graph, outputs) -> list[tuple[int, int]]:
    """``(conv node, relu node)`` pairs: a biased ``Conv2d`` read only by a
    ``Relu``, neither of them an output."""
    return _private_producers(graph, outputs, Relu, 0, lambda conv, _: (
        isinstance(abstract_of(conv.op), Conv2d) and len(conv.inputs) == 3))


def fuse_chain(graph: Graph, conv: int, relu: int, ctx: PassContext) -> str | None:
    """Rewrite one conv + bias + ReLU chain; returns None when fused, else why not."""
    lowered = graph.node(conv).op
    if not isinstance(lowered, Lowered):
        return "the convolution is not lowered yet"
    return _rewrite(graph, conv, relu, Conv2dBiasRelu(**lowered.op.conv_params()),
                    "fused conv + bias + relu kernel", ctx)


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
    return _rewrite(graph, pool, relu, MaxPool2dBackwardRelu(**lowered.op.pool_params()),
                    "fused max-pool + relu backward kernel", ctx)


def _rewrite(graph: Graph, node: int, absorbed: int, fused, what: str, ctx: PassContext) -> str | None:
    """``node`` computes ``fused`` on its algorithm and options, and ``absorbed``
    is removed (its readers read ``node``); None when done, else why not (the
    policy forces ``absorbed`` onto another algorithm, no rule of the algorithm
    for the fused op, excluded by the policy, declined)."""
    lowered = graph.node(node).op
    absorbed_name = graph.node(absorbed).name
    forced = ctx.policy.forced(absorbed_name)
    if forced is not None and forced != lowered.algorithm:  # fusing would drop the user's choice
        return f"{absorbed_name} is forced to {forced}, {graph.node(node).name} runs {lowered.algorithm}"
    rule = rules_for(type(fused)).get(lowered.algorithm)
    if rule is None:
        return f"{lowered.algorithm} has no {what}"
    # engine indices belong to one cuDNN graph: the fused graph's are chosen anew
    options = {k: v for k, v in lowered.options if k != "engine"}
    why = (ctx.policy.exclusion(rule.algorithm, rule.tags)
           or decline_reason(rule, fused, graph.node(node).input_types, ctx.device, ctx.policy, options))
    if why:
        return why
    new = Lowered(fused, lowered.algorithm, ctx.device, options)
    name = graph.node(node).name
    graph.replace_op(node, new)
    graph.absorb(absorbed, node)
    rec = ctx.report.nodes.get(name)
    if rec is not None:  # the report shows the final choice; autotune re-tunes it
        rec.op, rec.op_type, rec.chosen, rec.options = fused.describe(), fused.name, new.describe(), options
    ctx.report.nodes.pop(absorbed_name, None)
    return None


class FusePass(Pass):
    """Fuse each eligible conv + bias + ReLU chain and each pooled ReLU's
    gradient pair (see the module docstring)."""

    name = "fuse"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        for what, find, fuse in (("conv + bias + relu chain(s)", fusable_chains, fuse_chain),
                                 ("max-pool + relu backward pair(s)", pool_relu_backward_pairs,
                                  fuse_pool_relu_backward)):
            done, skipped = [], []
            for keep, drop in find(graph, outputs):
                names = f"{graph.node(keep).name} + {graph.node(drop).name}"
                why = fuse(graph, keep, drop, ctx)
                (skipped.append(f"{names} ({why})") if why else done.append(names))
            if done or skipped:
                ctx.report.note(f"fuse: {len(done)} {what} fused"
                                + (f"; not fused: {'; '.join(skipped)}" if skipped else ""))
        return graph


__all__ = ["FusePass", "fusable_chains", "fuse_chain", "fuse_pool_relu_backward", "pool_relu_backward_pairs"]
