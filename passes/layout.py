"""The layout pass: record the physical layout of every 4-D value.

Every kernel registered today reads and writes NCHW (C-contiguous) arrays,
so the only honest assignment is NCHW everywhere: this pass stamps
``TensorType.layout = 'NCHW'`` on each 4-D value among the outputs'
ancestors (results never depend on it, SEMANTICS.md) and says so in the
report.

``policy.layout = 'NHWC'`` is not acted on yet: choosing NHWC with the fewest
transposes needs kernels that take NHWC operands (the cuDNN rules detect a
channels-last view from its strides, ``backends/cudnn.py``), and inserting
those transposes is the GPU side's next step. The pass records the request
as a note (on cuda) or that it is ignored (on cpu), never pretends.
"""

from __future__ import annotations

import attrs

from opgraph.graph import Graph

from .base import Pass, PassContext


class LayoutPass(Pass):
    """Stamp NCHW on 4-D values; note an NHWC request (not applied)."""

    name = "layout"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        count = 0
        for view in graph.nodes_in_order(outputs):
            t = view.type
            if t.ndim == 4 and t.layout != "NCHW":
                graph.nx.nodes[view.id]["type"] = attrs.evolve(t, layout="NCHW")
                count += 1
        if ctx.policy.layout == "NHWC":
            where = ("left to the cuda kernels (layout assignment is not implemented)"
                     if ctx.device == "cuda" else "ignored on cpu: every cpu kernel is NCHW")
            ctx.report.note(f"layout: NHWC requested, {where}; values stay NCHW")
        ctx.report.note(f"layout: {count} 4-D values recorded as NCHW")
        return graph


__all__ = ["LayoutPass"]
