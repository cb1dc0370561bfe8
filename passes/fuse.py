"""The fuse pass: conv + bias + ReLU into one ``Conv2dBiasRelu`` node.

A fused epilogue (cuDNN's conv -> bias -> relu graph, ``backends/cudnn.py``;
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
"""

from __future__ import annotations

from opgraph.backends.registry import rules_for
from opgraph.graph import Graph
from opgraph.op import Lowered, abstract_of
from opgraph.ops import Conv2d, Conv2dBiasRelu, Relu

from .base import Pass, PassContext
from .lower import decline_reason


def fusable_chains(graph: Graph, outputs) -> list[tuple[int, int]]:
    """``(conv node, relu node)`` pairs: a biased ``Conv2d`` read only by a
    ``Relu``, neither of them an output."""
    keep = {v.node for v in outputs}
    scope = graph.ancestors(outputs)
    chains = []
    for view in graph.nodes_in_order(outputs):
        if not isinstance(abstract_of(view.op), Relu) or view.id in keep:
            continue
        src = graph.input_ids(view.id)[0]
        conv = graph.node(src)
        readers = [u for u in graph.users(src) if u in scope]
        if (isinstance(abstract_of(conv.op), Conv2d) and len(conv.inputs) == 3
                and src not in keep and readers == [view.id]):
            chains.append((src, view.id))
    return chains


def fuse_chain(graph: Graph, conv: int, relu: int, ctx: PassContext) -> str | None:
    """Rewrite one chain; returns None when fused, else why not."""
    lowered = graph.node(conv).op
    if not isinstance(lowered, Lowered):
        return "the convolution is not lowered yet"
    rule = rules_for(Conv2dBiasRelu).get(lowered.algorithm)
    if rule is None:
        return f"{lowered.algorithm} has no fused conv + bias + relu kernel"
    fused = Conv2dBiasRelu(**lowered.op.conv_params())
    # engine indices belong to one cuDNN graph: the fused graph's are chosen anew
    options = {k: v for k, v in lowered.options if k != "engine"}
    why = (ctx.policy.exclusion(rule.algorithm, rule.tags)
           or decline_reason(rule, fused, graph.node(conv).input_types, ctx.device, ctx.policy, options))
    if why:
        return why
    new = Lowered(fused, lowered.algorithm, ctx.device, options)
    conv_name, relu_name = graph.node(conv).name, graph.node(relu).name
    graph.replace_op(conv, new)
    graph.absorb(relu, conv)
    rec = ctx.report.nodes.get(conv_name)
    if rec is not None:  # the report shows the final choice; autotune re-tunes it
        rec.op, rec.op_type, rec.chosen, rec.options = fused.describe(), fused.name, new.describe(), options
    ctx.report.nodes.pop(relu_name, None)
    return None


class FusePass(Pass):
    """Fuse each eligible conv + bias + ReLU chain (see the module docstring)."""

    name = "fuse"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        done, skipped = [], []
        for conv, relu in fusable_chains(graph, outputs):
            names = f"{graph.node(conv).name} + {graph.node(relu).name}"
            why = fuse_chain(graph, conv, relu, ctx)
            (skipped.append(f"{names} ({why})") if why else done.append(names))
        if done or skipped:
            ctx.report.note(f"fuse: {len(done)} conv + bias + relu chain(s) fused"
                            + (f"; not fused: {'; '.join(skipped)}" if skipped else ""))
        return graph


__all__ = ["FusePass", "fusable_chains", "fuse_chain"]
