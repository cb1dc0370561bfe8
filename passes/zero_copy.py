"""The zero-copy plan: concat producers write into the concat's buffer, slices are views.

A ``Concat`` copies every input into a new buffer, and its gradient (``Slice``
of the output gradient, ``Concat.vjp``) copies every part out again: on the
GPU these copies are pure memory traffic (GoogLeNet's inception outputs,
DenseNet's dense blocks, whose every layer concatenates all earlier
features). This plan removes them, for one schedule (the outputs'
ancestors in ``Graph.topological`` order):

1. **Producers write into their slice** (``homes``). Concats are visited
   last first; each input ``v`` of concat ``c`` (along ``c``'s axis, from
   offset ``start``) is *homed* in ``c`` (its buffer becomes ``c``'s buffer
   sliced ``start:start + extent``) when

   * ``v`` is not a source, not a requested output, not homed already (a
     value concatenated into several concats lives in the last one; the
     others copy it, or are slices of it, below), and has ``c``'s dtype and
     layout;
   * no other reader of ``v`` declares ``Rule.contiguous_inputs``.

   A producer whose rule declares ``Rule.writes_strided_out`` for its
   output's layout writes there (``out=`` a strided view), as does a concat (its step assembles into any
   region). Any other producer (a pooling kernel, say) is ``copied_in``: its
   step copies its result into the slice at once and its value is that
   slice (the copy the concat would make, made early, so that the concats
   of step 2 still find the value in place and the result's own buffer
   dies at once). An input that is not homed is copied by ``c``'s step.
2. **Concats that are slices of a larger one** (DenseNet): a concat whose
   inputs, in order, already lie side by side along its axis in one buffer
   (each layer's concatenation of a dense block is a prefix of the block's)
   is homed there too, under the same conditions as a producer; its step
   then moves nothing.
3. **Slices as views** (``views``): a ``Slice`` step returns
   ``x[..., start:stop, ...]`` (basic slicing) unless it is a requested
   output, one of its readers declares ``contiguous_inputs``, or it is
   homed in a concat (ShuffleNet's split half concatenated again: its step
   copies it into the concat's buffer instead, step 1).

Whatever shares a buffer this way is excluded from the in-place plan
(:func:`shared_values`): it neither writes into an input nor is written
into. The concat's step becomes the executor's own (``opgraph/buffer_views.py``:
it copies only the inputs not written in place); ``Executable.report``
marks each zero-copy step, and the memory pass counts the concat's buffer
once and every view as free.
"""
from __future__ import annotations

from opgraph import ops
from opgraph.graph import Graph
from opgraph.op import Source, abstract_of
from opgraph.backends.registry import Rule


def _is(graph: Graph, n: int, op_type: type) -> bool:
    return isinstance(abstract_of(graph.node(n).op), op_type)


def _region(homes: dict, graph: Graph, n: int) -> tuple[int, tuple]:
    """``(root, chain)``: the buffer ``n`` lives in and the ``(axis, start,
    stop)`` slices from it down to ``n`` (outermost first)."""
    chain = []
    while n in homes:
        container, axis, start = homes[n]
        chain.append((axis, start, start + graph.node(n).type.shape[axis]))
        n = container
    return n, tuple(reversed(chain))


def plan_views(graph: Graph, outputs, rules: dict[int, Rule | None]) -> tuple[dict, frozenset, frozenset]:
    """``(homes, views, copied_in)`` of ``outputs``' schedule (module docstring).

    Args:
        rules: node id -> the registry rule its step runs (None: a source or
            an unregistered node), for every node of the schedule.

    Returns:
        ``homes``: value node id -> ``(concat node id, axis, start)``;
        ``views``: node ids of the ``Slice`` steps run as views;
        ``copied_in``: the homed values whose step copies its result into
        its slice (a producer that cannot write a strided view).
    """
    order = graph.topological(graph.ancestors(outputs))
    keep = {v.node for v in outputs}
    scheduled = set(order)

    def contiguous_reader(v: int, besides: int | None = None) -> bool:
        return any(rules.get(r) is not None and rules[r].contiguous_inputs
                   for r in graph.users(v) if r in scheduled and r != besides)

    def homeable(v: int, c: int) -> bool:
        view, target = graph.node(v), graph.node(c)
        return (rules.get(v) is not None and v not in homes and v not in keep
                and not isinstance(view.op, Source)
                and view.type.dtype == target.type.dtype and view.type.layout == target.type.layout
                and not contiguous_reader(v, besides=c))

    homes: dict[int, tuple] = {}
    concats = [n for n in order if _is(graph, n, ops.Concat) and rules.get(n) is not None]
    for c in reversed(concats):
        axis = abstract_of(graph.node(c).op).axis % graph.node(c).type.ndim
        start = 0
        for v in graph.input_ids(c):
            if homeable(v, c):
                homes[v] = (c, axis, start)
            start += graph.node(v).type.shape[axis]
    for c in reversed(concats):  # concats whose inputs already lie side by side (DenseNet)
        if c in homes or c in keep or contiguous_reader(c):
            continue
        axis = abstract_of(graph.node(c).op).axis % graph.node(c).type.ndim
        where = [_region(homes, graph, v) for v in graph.input_ids(c)]
        roots = {root for root, _ in where}
        if len(roots) != 1 or any(not chain or chain[-1][0] != axis for _, chain in where):
            continue
        root = roots.pop()
        if root == c or {chain[:-1] for _, chain in where} != {where[0][1][:-1]}:
            continue
        if any(a[1][-1][2] != b[1][-1][1] for a, b in zip(where, where[1:])):
            continue
        first = graph.input_ids(c)[0]
        container, _, start = homes[first]
        if graph.node(container).type.layout == graph.node(c).type.layout:
            homes[c] = (container, axis, start)
    views = frozenset(n for n in order if _is(graph, n, ops.Slice) and rules.get(n) is not None
                      and n not in keep and n not in homes and not contiguous_reader(n))
    copied_in = frozenset(v for v in homes if not _is(graph, v, ops.Concat)
                          and not rules[v].writes_strided(graph.node(v).type.layout))
    return homes, views, copied_in


def shared_values(graph: Graph, homes: dict, views: frozenset) -> set[int]:
    """Values whose buffer another live value shares under the plan: the
    homed values, the concats they live in, the slices run as views and
    their inputs. The in-place plan neither overwrites them nor lets them
    write into an input."""
    shared = set(homes) | {c for c, _, _ in homes.values()} | set(views)
    shared |= {graph.input_ids(s)[0] for s in views}
    return shared


__all__ = ["plan_views", "shared_values"]
