"""The fuse pass: the hook for conv + bias + ReLU fusion (finds, does not fuse yet).

A fused convolution epilogue (cuDNN's conv-bias-activation graphs, see
``backends/cudnn.py::conv2d_bias_relu``) saves one write and one read of the
convolution output. Fusing needs an op to fuse *into*: an abstract
``Conv2dBiasRelu`` (or equivalent) with a registered rule, and a rewrite that
replaces ``Relu(Conv2d(x, w, b))`` / ``Relu(BiasAdd(Conv2d(x, w), b))`` by it
when the intermediate values have no other reader (the backward pass reads
the ReLU input, so in training graphs ``ReluBackward`` usually is one).

No such op exists in ``opgraph.ops`` today, so this pass only reports the
fusable chains (``fuse: conv1 + relu1 ...``) and leaves the graph unchanged.
When the fused op lands, :data:`FUSED_OP` names it and the rewrite goes in
:func:`fuse_chain`.
"""

from __future__ import annotations

from opgraph.graph import Graph
from opgraph.op import abstract_of

from .base import Pass, PassContext

#: Name of the fused op type a backend would register a rule for (absent today).
FUSED_OP = "Conv2dBiasRelu"


def fusable_chains(graph: Graph, outputs) -> list[tuple[str, ...]]:
    """Names of ``conv [-> bias_add] -> relu`` chains whose intermediates have
    exactly one reader and are not outputs."""
    keep = {v.node for v in outputs}
    scope = graph.ancestors(outputs)
    chains = []
    for view in graph.nodes_in_order(outputs):
        if abstract_of(view.op).name != "Relu":
            continue
        chain = [view.name]
        src = graph.input_ids(view.id)[0]
        if abstract_of(graph.node(src).op).name == "BiasAdd" and _private(graph, src, keep, scope):
            chain.insert(0, graph.node(src).name)
            src = graph.input_ids(src)[0]
        if abstract_of(graph.node(src).op).name == "Conv2d" and _private(graph, src, keep, scope):
            chains.append((graph.node(src).name, *chain))
    return chains


def _private(graph: Graph, node: int, keep: set, scope: set) -> bool:
    return node not in keep and len([u for u in graph.users(node) if u in scope]) == 1


def fuse_chain(graph: Graph, chain) -> bool:  # pragma: no cover - the hook
    """Rewrite one chain into the fused op; False while no fused op exists."""
    return False


class FusePass(Pass):
    """Report fusable conv + bias + ReLU chains (no fused op to rewrite into yet)."""

    name = "fuse"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        chains = fusable_chains(graph, outputs)
        fused = [c for c in chains if fuse_chain(graph, c)]
        if chains:
            ctx.report.note(f"fuse: {len(chains)} fusable chain(s), {len(fused)} fused "
                            f"(no {FUSED_OP} op/rule yet): " + "; ".join(" + ".join(c) for c in chains))
        return graph


__all__ = ["FusePass", "fusable_chains", "FUSED_OP"]
