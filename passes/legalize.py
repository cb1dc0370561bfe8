"""The legalize pass: explicit ``Pad`` nodes for algorithms without implicit padding.

Some implementations take no padding (classic FFT and Winograd kernels, fbfft)
or only symmetric padding (cuDNN's legacy API). For a convolution node whose
lowering will be such an algorithm, the padding ``E`` it cannot take moves
into explicit nodes (``P`` is the node's padding, ``P - E`` what stays implicit):

* ``Conv2d(P)(x, w[, b])``  ->  ``Conv2d(P - E)(Pad(E)(x), w[, b])`` (so also the
  fused ``Conv2dBiasRelu(P)(x, w, b)``: every op of family ``conv`` whose
  direction is not ``dgrad`` pads its first input);
* ``Conv2dBackwardFilter(P)(x, gy)``  ->  ``Conv2dBackwardFilter(P - E)(Pad(E)(x), gy)``;
* ``Conv2dBackwardData(P, input_shape=S)(gy, w)``  ->
  ``PadBackward(E)(Conv2dBackwardData(P - E, input_shape=S + E)(gy, w))``.

Why these are exact: a convolution with padding ``P`` equals one with padding
``P - E`` of the input zero-padded by ``E`` (zeros are zeros, whichever
stage adds them); the backward ops are the adjoints of that composition, and
the adjoint of ``Pad(E)`` is the crop ``PadBackward(E)``. Numeric equivalence
is tested in ``tests/passes/test_legalize.py``.

Which algorithm "will" lower a node is asked of the node's survey (the one
the lower pass reads, ``passes/candidates.py``) with missing padding
ignored (``padded_ok``): the forced algorithm if any; under autotune every
applicable candidate (so each is timed on the same legal graph); otherwise
the first applicable one. ``E`` is the largest demand among those, declared
by the rules' tags (``needs_explicit_padding``: all of the padding;
``symmetric_padding_only``: the asymmetric excess) or the policy's
``explicit_padding`` list of algorithm names (``candidates.explicit_padding``).
This pass is the only place padding is legalized: a backend declares what
it cannot take and never pads on its own (cuDNN's rules declare
``symmetric_padding_only``, and its kernels refuse asymmetric padding).

Output node ids are kept: the rewritten node keeps its id (``Graph.rewrite``;
for the backward data case it becomes the ``PadBackward``), so users and
outputs need no rewiring. New nodes are named ``<node>/pad`` and ``<node>/unpadded``;
``ctx.aliases`` tells the lower pass which name ``policy.force`` keys see.
"""

from __future__ import annotations

import attrs

from opgraph.graph import Graph
from opgraph.ops import Pad, PadBackward

from .base import Pass, PassContext
from .candidates import NO_PADDING, survey_node
from .lower import is_abstract


def _fresh(graph: Graph, base: str) -> str:
    if base not in graph:
        return base
    k = 2
    while f"{base}_{k}" in graph:
        k += 1
    return f"{base}_{k}"


def _minus(pad, extra):
    return tuple((b - eb, e - ee) for (b, e), (eb, ee) in zip(pad, extra))


def _max(a, b):
    return tuple((max(x0, y0), max(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))


def demanded_padding(view, ctx: PassContext) -> tuple:
    """The padding of conv node ``view`` that must become explicit (``E``):
    the largest demand (``Entry.padding``, from the rules' tags) among the
    candidates the node may get (module docstring)."""
    s = survey_node(view, ctx)
    if s.forced is not None:
        considered = list(s.entries)
    else:
        applicable = s.applicable(padded_ok=True)
        considered = applicable if ctx.policy.autotune else applicable[:1]
    need = NO_PADDING
    for entry in considered:
        need = _max(need, entry.padding)
    return need


def _keep_layout(graph: Graph, new, like) -> None:
    """Store the new 4-D value ``new`` as ``like`` (a value the layout pass
    stamped) is stored: the layout pass runs before this one."""
    layout = like.type.layout
    if layout is not None and new.type.ndim == 4:
        graph.set_layout(new.node, layout)


def legalize_node(graph: Graph, view, extra, ctx: PassContext) -> None:
    """Rewrite conv node ``view`` so that padding ``extra`` is explicit."""
    op, name = view.op, view.name
    inner_op = attrs.evolve(op, padding=_minus(op.padding, extra))
    if op.direction == "dgrad":
        (top, bottom), (left, right) = extra
        n, c, h, w = op.input_shape
        inner_op = attrs.evolve(inner_op, input_shape=(n, c, h + top + bottom, w + left + right))
        inner = graph.add_node(inner_op, view.inputs, name=_fresh(graph, f"{name}/unpadded"))
        _keep_layout(graph, inner, view)
        graph.rewrite(view.id, PadBackward(padding=extra), [inner])
        ctx.aliases[inner.name] = ctx.aliases.get(name, name)  # force keys of the conv follow it
        ctx.aliases[name] = None  # the crop itself is not forceable
    else:  # Conv2d (x, w[, b]), Conv2dBiasRelu (x, w, b), Conv2dBackwardFilter (x, gy): pad x
        x, *rest = view.inputs
        padded = graph.add_node(Pad(padding=extra), [x], name=_fresh(graph, f"{name}/pad"))
        _keep_layout(graph, padded, x)
        ctx.aliases[padded.name] = None
        graph.rewrite(view.id, inner_op, [padded, *rest])
    ctx.report.note(f"legalize: {name}: padding {extra} made explicit "
                    f"({'PadBackward after' if op.direction == 'dgrad' else 'Pad before'} "
                    f"{op.name}, implicit padding left {inner_op.padding})")


class LegalizePass(Pass):
    """Insert explicit padding where the chosen algorithm needs it."""

    name = "legalize"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        for view in list(graph.nodes_in_order(outputs)):
            if not (is_abstract(view.op) and view.op.family == "conv"):
                continue
            if view.op.padding == NO_PADDING:
                continue
            extra = demanded_padding(view, ctx)
            if extra != NO_PADDING:
                legalize_node(graph, view, extra, ctx)
        return graph


__all__ = ["LegalizePass", "legalize_node", "demanded_padding"]
