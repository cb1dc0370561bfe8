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

**Permutes stay views** (NHWC policy only). A ``Transpose`` of a 4-D value
stores its output in the layout its input's buffer already gives it, when
that is exactly NCHW or NHWC: ConvNeXt's ``permute(0, 2, 3, 1)`` of an NHWC
activation is the C-contiguous (N, H, W, C) buffer itself, so it is labelled
NCHW (a free view, :func:`transpose_layout`), and its ``permute(0, 3, 1, 2)``
back of that NCHW value is NHWC again (a view too). Stamping the policy
layout on them instead made the executor copy the permuted value into "NHWC
storage of the (N, H, W, C) shape" (every layer-norm row over C strided) and
copy again at the permute back. The ops that work in any layout
(:data:`FOLLOWING`: element-wise ops, activations, the layer-norm family,
MatMul/Linear, SumTo, reshapes, their gradients) take the layout their
inputs share (a 2-D value carries the layout of the 4-D value it was
reshaped from, so the Linear layers between the permutes stay NCHW); mixed
inputs, sources and every other op (convolutions, pooling, batch norm,
concat, pad, ...: kernels written or tuned for the policy layout) get the
policy layout, and a value such an op reads is stored in the policy layout
(pinned), so those kernels never see another layout.
"""

from __future__ import annotations

from opgraph import ops
from opgraph.graph import Graph
from opgraph.op import Source, abstract_of

from .base import Pass, PassContext

#: the physical order of the logical (N, C, H, W) axes, outermost first, of each layout
ORDERS = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 2, 3, 1)}

#: op types whose kernels work in either layout (they read through strides, or
#: plan in the stored layout) and write their output in it: a 4-D output takes the
#: layout its inputs share. Only permutes create a layout unlike the policy's,
#: so in a graph without one these ops get the policy layout as before.
FOLLOWING = frozenset({
    ops.Add, ops.Div, ops.Neg, ops.Mul, ops.BroadcastAdd, ops.BroadcastTo, ops.SumTo,
    ops.Gelu, ops.GeluBackward, ops.Sigmoid, ops.SigmoidBackward, ops.Silu, ops.SiluBackward,
    ops.Hardsigmoid, ops.HardsigmoidBackward, ops.Hardswish, ops.HardswishBackward,
    ops.Hardtanh, ops.HardtanhBackward, ops.Relu, ops.ReluBackward,
    ops.Threshold, ops.ThresholdBackward,
    ops.LayerNorm, ops.LayerNormBackwardData, ops.LayerNormBackwardScale, ops.LayerNormDoubleBackward,
    ops.Linear, ops.MatMul, ops.Reshape, ops.Flatten,
})


def transpose_layout(layout: str, perm) -> str | None:
    """The layout a 4-D ``x.transpose(perm)`` has as a view of ``x`` stored in
    ``layout``: the output's axes in the physical order of the input's, if that
    is exactly NCHW or NHWC storage, else None (the permute is a copy).

    Output axis ``i`` is input axis ``perm[i]``, so input axis ``a`` is output
    axis ``inv[a]``; walking the input's axes outermost first gives the
    output's physical order."""
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    order = tuple(inv[a] for a in ORDERS[layout])
    return next((name for name, o in ORDERS.items() if o == order), None)


def _propagate(graph: Graph, order, policy: str, pinned: set[int]) -> dict[int, str | None]:
    """Node id -> layout of each 4-D value, and for another value the layout
    it carries for 4-D values computed from it (None: none)."""
    tag: dict[int, str | None] = {}
    for n in order:
        view = graph.node(n)
        four = view.type.ndim == 4
        op = abstract_of(view.op)
        if isinstance(op, Source) or n in pinned:
            tag[n] = policy if four else None
            continue
        args = graph.input_ids(n)
        if type(op) is ops.Transpose:
            x = graph.node(args[0]).type
            if four and x.ndim == 4:
                tag[n] = transpose_layout(tag[args[0]], op.perm) or policy
            else:  # a copy into C order: carries nothing
                tag[n] = policy if four else None
            continue
        if type(op) in FOLLOWING:
            seen = {tag[a] for a in args} - {None}
            shared = seen.pop() if len(seen) == 1 else None
            tag[n] = (shared or policy) if four else shared
            continue
        tag[n] = policy if four else None
    return tag


class LayoutPass(Pass):
    """Stamp ``TensorType.layout`` on each 4-D value among the outputs' ancestors."""

    name = "layout"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        layout = "NHWC" if ctx.policy.layout == "NHWC" and ctx.device == "cuda" else "NCHW"
        if ctx.policy.layout == "NHWC" and layout == "NCHW":
            ctx.report.note(f"layout: NHWC requested but ignored on {ctx.device}: "
                            "the CPU kernels are written for NCHW")
        order = [v.id for v in graph.nodes_in_order(outputs)]
        if layout == "NHWC":
            tags = self._tags(graph, order, layout)
        else:  # NCHW: every 4-D value C-contiguous, permutes copy into C order
            tags = {n: layout for n in order}
        values = sources = 0
        other: dict[str, int] = {}
        for n in order:
            view = graph.node(n)
            if view.type.ndim != 4:
                continue
            values += 1
            sources += isinstance(view.op, Source)
            graph.set_layout(n, tags[n])
            if tags[n] != layout:
                other[tags[n]] = other.get(tags[n], 0) + 1
        transposes = f", {sources} transposes at the sources" if layout == "NHWC" else ""
        stored = values - sum(other.values())
        kept = "".join(f"; {k} 4-D values stored {name}: permutes of {layout} values and what is computed "
                       f"from them, so that each permute is a view (no copy)" for name, k in sorted(other.items()))
        ctx.report.note(f"layout: {stored} 4-D values stored {layout}{transposes}{kept}")
        return graph

    @staticmethod
    def _tags(graph: Graph, order, policy: str) -> dict[int, str | None]:
        """The propagated layouts, with every value that an op outside
        :data:`FOLLOWING` (and not a permute) reads pinned to ``policy``."""
        pinned: set[int] = set()
        while True:
            tags = _propagate(graph, order, policy, pinned)
            more = set()
            for n in order:
                op = abstract_of(graph.node(n).op)
                if isinstance(op, Source) or type(op) in FOLLOWING or type(op) is ops.Transpose:
                    continue
                more.update(a for a in graph.input_ids(n)
                            if graph.node(a).type.ndim == 4 and tags[a] != policy)
            if more <= pinned:
                return tags
            pinned |= more


__all__ = ["LayoutPass", "FOLLOWING", "ORDERS", "transpose_layout"]
