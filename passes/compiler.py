"""``compile``: run the pass pipeline on a graph and build an ``Executable``."""

from __future__ import annotations

from typing import Sequence

from opgraph.executable import Executable
from opgraph.graph import Value, graph_of
from opgraph.op import Lowered, Source

from opgraph.backends.registry import KernelContext, lookup


def _array_module(device: str):
    if device == "cpu":
        import numpy
        return numpy
    import cupy
    return cupy


def _lower_reference(graph, outputs, device):
    g = graph.copy()
    for view in list(g.nodes_in_order(outputs)):
        if not isinstance(view.op, (Source, Lowered)):
            g.replace_op(view.id, Lowered(view.op, "reference", device))
    return g


def compile(outputs: Value | Sequence[Value], device: str = "cpu", policy=None,
            dtype: str | None = None) -> Executable:
    """Lower the graph of ``outputs`` for ``device`` and return a callable.

    Args:
        outputs: one value or a list of values to compute.
        device: ``'cpu'`` (NumPy) or ``'cuda'`` (CuPy).
        policy: a ``LoweringPolicy`` (default: reference lowering).
        dtype: override the floating dtype of every feed (``'float64'`` runs
            the reference oracle in double precision).

    Returns:
        An ``Executable``; calling it with feeds returns the output arrays
        (always a list, in the order given).
    """
    outs = [outputs] if isinstance(outputs, Value) else list(outputs)
    g = graph_of(*outs)
    lowered = _lower_reference(g, outs, device)
    xp = _array_module(device)

    def resolve(op: Lowered):
        rule = lookup(type(op.op), op.algorithm)
        return rule.kernel, KernelContext(xp, device, op.option_dict)

    return Executable(lowered, [lowered.value(v.node) for v in outs], resolve, xp=xp,
                      device=device, dtype=dtype)
