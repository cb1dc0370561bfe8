"""The layout pass: choose the physical layout of every 4-D value.

Logical shapes stay NCHW everywhere; the layout is how a 4-D buffer is
stored. NCHW is C-contiguous; NHWC is channels-last, i.e. the NCHW-shaped view
of an (N, H, W, C) buffer. Every kernel reads its operands through their
strides (NumPy/CuPy semantics, the cuDNN rules build their tensor descriptors
from the strides, our CuPy pooling kernels take a channels-last flag), and
the cuDNN convolutions and CuPy pooling/element-wise kernels write their
output in their input's layout. So a single transpose per 4-D graph source
(image, conv weights, output gradients), done when the executor feeds it,
puts the whole network in NHWC: that is the fewest transposes possible.

NHWC is assigned only on ``cuda`` and only when the policy asks for it
(tensor-core precisions gain from it; ``opgraph-bench --layout nhwc``). On the
CPU every value stays NCHW: the NumPy kernels are written for it, and NHWC
would only add copies. Results never depend on the layout (SEMANTICS.md).
"""

from __future__ import annotations

from opgraph.graph import Graph
from opgraph.op import Source

from .base import Pass, PassContext


class LayoutPass(Pass):
    """Stamp ``TensorType.layout`` on each 4-D value among the outputs' ancestors."""

    name = "layout"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        layout = "NHWC" if ctx.policy.layout == "NHWC" and ctx.device == "cuda" else "NCHW"
        if ctx.policy.layout == "NHWC" and layout == "NCHW":
            ctx.report.note(f"layout: NHWC requested but ignored on {ctx.device}: "
                            "the CPU kernels are written for NCHW")
        values = sources = 0
        for view in graph.nodes_in_order(outputs):
            t = view.type
            if t.ndim != 4:
                continue
            values += 1
            sources += isinstance(view.op, Source)
            graph.set_layout(view.id, layout)
        transposes = f", {sources} transposes at the sources" if layout == "NHWC" else ""
        ctx.report.note(f"layout: {values} 4-D values stored {layout}{transposes}")
        return graph


__all__ = ["LayoutPass"]
