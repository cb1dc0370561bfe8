"""Reverse-mode differentiation on the abstract graph.

``grad`` walks the nodes between ``wrt`` and ``outputs`` in reverse
topological order and asks each op's ``vjp`` rule for its inputs'
cotangents; the rules emit abstract ops (``Conv2dBackwardData``, ...) into the
same graph, so the lowering passes later choose an implementation for every
backward node separately. Contributions to a value used several times are
summed with ``Add``. Inputs that need no gradient (nothing in ``wrt`` depends
on them) get no backward node: with ``wrt`` = the parameters only, a model's
first convolution gets no backward-data node, as convnet-benchmarks times it.
Source: Griewank & Walther, "Evaluating Derivatives", ch. 3 (reverse mode).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import networkx as nx

from .errors import NotDifferentiableError, OpgraphError, ShapeError
from .graph import Graph, Value, graph_of
from .op import Source
from .ops import Add, Zeros


def _describe(obj) -> str:
    """``obj`` for an error message: an array (NumPy, CuPy, torch) by its
    type, shape and dtype, not its repr, which prints up to a thousand
    elements; anything else by its type and repr."""
    if hasattr(obj, "shape") and hasattr(obj, "dtype") and not isinstance(obj, Value):
        return f"{type(obj).__name__} of shape {tuple(obj.shape)} and dtype {obj.dtype}"
    return f"{type(obj).__name__} {obj!r}"


def _as_list(v, what: str) -> tuple[list, bool]:
    """``([v], True)`` for one value, ``(list(v), False)`` for a sequence of
    values; anything else (a name, None) is an error naming ``what``."""
    if isinstance(v, Value):
        return [v], True
    # an array is iterable too, but its rows are no more values than it is
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__") or hasattr(v, "shape"):
        raise OpgraphError(f"grad: {what} must be a value or a list of values (opgraph.Value), "
                           f"got {_describe(v)}")
    items = list(v)
    for item in items:
        if not isinstance(item, Value):
            hint = f" (look it up with graph[{item!r}])" if isinstance(item, str) else ""
            raise OpgraphError(f"grad: {what} must hold values (opgraph.Value), got "
                               f"{_describe(item)}{hint}")
    return items, False


def grad(outputs, wrt, grad_outputs: Mapping[Value, Value] | Sequence[Value] | None = None,
         no_grad: Sequence[Value] = ()):
    """Add the backward graph of ``outputs`` w.r.t. ``wrt``; return the gradients.

    Args:
        outputs: a value or a list of values to differentiate.
        wrt: a value or a list; the result has the same structure.
        grad_outputs: cotangents of ``outputs`` (values of the same graph, as a
            list in output order or a dict output -> value). Where none is
            given, a ``grad`` source of the output's type is added and fed at
            run time as ``grad_outputs={output: array}`` (a scalar output's
            placeholder defaults to 1 at run time).
        no_grad: values to treat as constants (no gradient flows through them).

    Returns:
        One value per ``wrt`` entry. An entry the outputs do not depend on gets
        a ``Zeros`` node of its type (documented choice, not an exception).

    Raises:
        ShapeError: a given cotangent's shape differs from its output's.
        NotDifferentiableError: a path crosses an op without a gradient rule, or
            ``wrt`` holds a buffer (``Graph.buffer``).
        OpgraphError: something that is not a value where values are expected
            (a node name: look it up with ``graph[name]``), values of other
            graphs, or ``grad_outputs`` that do not match ``outputs``.
    """
    outs, _ = _as_list(outputs, "outputs")
    targets, single = _as_list(wrt, "wrt")
    no_grad, _ = _as_list(no_grad, "no_grad")
    g = graph_of(*outs, *targets, *no_grad)
    _refuse_buffers(targets)
    seeds = _seed_cotangents(g, outs, grad_outputs)

    frozen = {v.node for v in no_grad}
    wanted_nodes = _depends_on(g, {v.node for v in targets}, frozen)
    relevant = g.ancestors(outs) & wanted_nodes

    cotangent: dict[int, Value] = {}
    for out, seed in zip(outs, seeds):
        _accumulate(g, cotangent, out.node, seed)
    for node in reversed(g.topological(relevant)):
        view = g.node(node)
        if node not in cotangent or isinstance(view.op, Source):
            continue
        in_ids = g.input_ids(node)
        wanted = tuple(u in relevant for u in in_ids)
        if not any(wanted):
            continue
        with g.scope(f"{view.name}.grad"):
            cts = view.op.vjp(view, cotangent[node], wanted)
        for u, ct, want in zip(in_ids, cts, wanted):
            if want and ct is not None:
                _accumulate(g, cotangent, u, ct)

    results = []
    for v in targets:
        if v.node in cotangent:
            results.append(cotangent[v.node])
        else:  # scoped, not an explicit name: a second ``grad`` call gets ``zeros_2``
            with g.scope(f"{v.name}.grad"):
                results.append(g.apply(Zeros, {"type": v.type}, []))
    return results[0] if single else results


def _refuse_buffers(targets: list[Value]) -> None:
    """Buffers (``Graph.buffer``: running statistics) are state, never differentiated."""
    for v in targets:
        if isinstance(v.op, Source) and v.op.role == "buffer":
            raise NotDifferentiableError(f"grad: {v.name} is a buffer (state such as running "
                                         "statistics), which gets no gradient; leave it out of wrt")


def _seed_cotangents(g: Graph, outs: list[Value], grad_outputs) -> list[Value]:
    if grad_outputs is None:
        given = [None] * len(outs)
    elif isinstance(grad_outputs, Mapping):
        stray = [k for k in grad_outputs if not (isinstance(k, Value) and any(k == o for o in outs))]
        if stray:
            raise OpgraphError(f"grad: grad_outputs keys must be the outputs being differentiated "
                               f"({', '.join(o.name for o in outs)}); got {stray!r}")
        given = [grad_outputs.get(o) for o in outs]
    elif hasattr(grad_outputs, "shape"):  # an array: list() would split it into rows
        raise OpgraphError(f"grad: grad_outputs must be values of the graph (a list in output order or a "
                           f"dict output -> value), got {_describe(grad_outputs)}; arrays are fed when the "
                           f"compiled graph runs: run(..., grad_outputs={{{outs[0].name}: array}})")
    else:
        given = list(grad_outputs)
        if len(given) != len(outs):
            raise OpgraphError(f"grad: {len(given)} grad_outputs for {len(outs)} outputs "
                               "(give one per output, None for a placeholder)")
    for gv in given:
        if gv is not None and (not isinstance(gv, Value) or gv.graph is not g):
            hint = "; arrays are fed when the compiled graph runs: run(..., grad_outputs={output: array})"
            raise OpgraphError(f"grad: a cotangent must be a value of the outputs' graph, got {_describe(gv)}"
                               f"{hint if hasattr(gv, 'shape') and not isinstance(gv, Value) else ''}")
    seeds = []
    for out, gv in zip(outs, given):
        if gv is None:
            if out.node in g.grad_inputs:
                gv = g.value(g.grad_inputs[out.node])
            else:
                gv = g.add_node(Source(out.type, "grad"), [], name=f"{out.name}.grad_output")
                g.grad_inputs[out.node] = gv.node
        elif gv.shape != out.shape:
            raise ShapeError(f"cotangent shape {gv.shape} != output shape {out.shape}", out.name)
        seeds.append(gv)
    return seeds


def _depends_on(g: Graph, targets: set[int], frozen: set[int]) -> set[int]:
    """Nodes whose value depends on some target, not through ``frozen``."""
    view = nx.restricted_view(g.nx, frozen - targets, [])
    found = set(targets)
    for t in targets:
        found |= nx.descendants(view, t)
    return found - (frozen - targets)


def _accumulate(g: Graph, cotangent: dict[int, Value], node: int, ct: Value) -> None:
    if ct.graph is not g:
        raise OpgraphError("a gradient rule returned a value of another graph")
    if node in cotangent:
        with g.scope(f"{g.node(node).name}.grad"):
            ct = g.apply(Add, {}, [cotangent[node], ct])
    cotangent[node] = ct
