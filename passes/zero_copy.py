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
   region), unless its options say ``strided_out: False`` (:data:`STRIDED_OUT`:
   autotune timed the dense write plus the copy faster than the strided
   write, ``passes/autotune_measure.py``). Any other producer (a pooling kernel, say) is ``copied_in``: its
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

Autotune runs before this plan (``passes/pipelines.py``) yet must time a homed
producer in the form it will run (a strided write into the concat's buffer
runs cuDNN's engines up to 3x slower than dense): :func:`predict_homes` runs
the same conditions (:func:`_plan`) on the graph autotune tunes, deciding the
ones that read rule choices conservatively.
"""
from __future__ import annotations

import attrs

from opgraph import ops
from opgraph.buffer_views import Region
from opgraph.graph import Graph
from opgraph.op import Lowered, Source, abstract_of
from opgraph.backends.registry import Rule, rules_for


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


#: The kernel option autotune sets on a homed producer whose dense result plus
#: a copy into its slice timed faster than its strided write (``{STRIDED_OUT:
#: False}``): the plan copies it in (``copied_in``) and no kernel ever sees the
#: key (:func:`kernel_options`). Absent: the rule's own ``writes_strided``.
STRIDED_OUT = "strided_out"


def kernel_options(options) -> dict:
    """``options`` without the plan's own key :data:`STRIDED_OUT`: what a
    kernel, its workspace and its capture declarations are called with (a
    kernel passing ``**ctx.options`` on would raise on it, one reading a few
    keys would ignore it; the zero-copy plan consumes it instead)."""
    return {k: v for k, v in dict(options or {}).items() if k != STRIDED_OUT}


def _copies_in(graph: Graph, v: int, rule: Rule) -> bool:
    """Whether homed producer ``v`` (lowered to ``rule``) copies its result into
    its slice: its rule cannot write a strided view of its layout, or its
    options say :data:`STRIDED_OUT` ``False`` (autotune chose the copy)."""
    op = graph.node(v).op
    if isinstance(op, Lowered) and op.option_dict.get(STRIDED_OUT, True) is False:
        return True
    return not rule.writes_strided(graph.node(v).type.layout)


def _plan(graph: Graph, outputs, registered, contiguous) -> tuple[dict, frozenset]:
    """``(homes, views)`` of ``outputs``' schedule (module docstring, steps 1-3),
    the one copy of the plan's conditions.

    Args:
        registered: node id -> whether its step runs a registry rule (a
            source or an unregistered node does not).
        contiguous: node id -> whether its rule declares
            ``Rule.contiguous_inputs`` (asked of registered nodes only).
    """
    order = graph.topological(graph.ancestors(outputs))
    keep = {v.node for v in outputs}
    scheduled = set(order)

    def contiguous_reader(v: int, besides: int | None = None) -> bool:
        return any(registered(r) and contiguous(r) for r in graph.users(v) if r in scheduled and r != besides)

    def homeable(v: int, c: int) -> bool:
        view, target = graph.node(v), graph.node(c)
        return (registered(v) and v not in homes and v not in keep
                and not isinstance(view.op, Source)
                and view.type.dtype == target.type.dtype and view.type.layout == target.type.layout
                and not contiguous_reader(v, besides=c))

    homes: dict[int, tuple] = {}
    concats = [n for n in order if _is(graph, n, ops.Concat) and registered(n)]
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
    views = frozenset(n for n in order if _is(graph, n, ops.Slice) and registered(n)
                      and n not in keep and n not in homes and not contiguous_reader(n))
    return homes, views


def plan_views(graph: Graph, outputs, rules: dict[int, Rule | None]) -> tuple[dict, frozenset, frozenset]:
    """``(homes, views, copied_in)`` of ``outputs``' schedule (module docstring).

    Args:
        rules: node id -> the registry rule its step runs (None: a source or
            an unregistered node), for every node of the schedule.

    Returns:
        ``homes``: value node id -> ``(concat node id, axis, start)``;
        ``views``: node ids of the ``Slice`` steps run as views;
        ``copied_in``: the homed values whose step copies its result into
        its slice (a producer that cannot write a strided view, or whose
        options say ``strided_out: False``: :data:`STRIDED_OUT`).
    """
    homes, views = _plan(graph, outputs, lambda n: rules.get(n) is not None,
                         lambda n: rules[n].contiguous_inputs)
    copied_in = frozenset(v for v in homes if not _is(graph, v, ops.Concat) and _copies_in(graph, v, rules[v]))
    return homes, views, copied_in


@attrs.frozen
class Home:
    """Where a homed value's output will live: a slice of a concat's buffer.

    Attributes:
        root: node id of the value owning the buffer (the outermost concat).
        shape: the root's logical (NCHW-ordered) shape, in elements.
        layout: the root's layout (``'NHWC'``: the NCHW-shaped view of an
            ``(N, H, W, C)`` buffer, so a channel slice is strided), or None.
        chain: ``(axis, start, stop)`` slices from the root down to the value,
            outermost first (element indices of the logical shape).
    """

    root: int
    shape: tuple
    layout: str | None
    chain: tuple

    def region(self, dtype) -> Region:
        """The :class:`~opgraph.buffer_views.Region` of this home for a root
        buffer of NumPy ``dtype`` (``Region.array`` allocates and slices it)."""
        return Region(self.root, tuple(self.shape), dtype, self.layout == "NHWC" and len(self.shape) == 4,
                      tuple(self.chain))

    def placement(self) -> tuple[tuple, int]:
        """``(strides, offset)``: the element strides of this home's view of the root buffer (the
        root's, in its layout: slicing keeps them) and the element offset of its first element,
        as :meth:`region`'s array has them (for cache keys: ``autotune_contenders.KeyNode``)."""
        shape = tuple(self.shape)
        strides = [1] * len(shape)
        for a in range(len(shape) - 2, -1, -1):
            strides[a] = strides[a + 1] * shape[a + 1]
        if self.layout == "NHWC" and len(shape) == 4:
            _, c, h, w = shape
            strides = [h * w * c, 1, w * c, c]
        _, bounds = self.region(None).bounds()
        return tuple(strides), sum(start * s for (start, _), s in zip(bounds, strides))

    def describe(self) -> str:
        """``NHWC[2x64x28x28] 1:64:96``: the root buffer and the slice (axis,
        start, stop of each step), for cache keys and reports."""
        where = " ".join(f"{a}:{s}:{e}" for a, s, e in self.chain)
        return f"{self.layout or 'NCHW'}[{'x'.join(map(str, self.shape))}] {where}"


def predict_homes(graph: Graph, outputs) -> dict[int, Home]:
    """The values the memory pass's zero-copy plan will home in a concat's
    buffer, predicted before autotune chooses their rules: node id ->
    :class:`Home`, for every homed value (concats homed in a larger one
    included; their step is the executor's own, so autotune skips them).

    Made on the graph autotune tunes (after layout, legalize, lower and fuse,
    which set every layout, op and edge; autotune changes only the rules, and
    the memory pass runs next on the same edges) by the plan's own conditions
    (:func:`_plan`), with the two that read rules decided without them:

    * a node's step runs a registry rule when it is ``Lowered`` to a
      registered (op type, algorithm): true of every node autotune may
      re-lower, whatever rule it picks;
    * a reader "declares ``contiguous_inputs``" when *any* rule registered
      for its op type does, since autotune may still choose that one.
      Conservative: such a value is predicted not homed and is timed dense,
      as before this prediction existed; if its reader's final rule reads
      views, the plan homes it after all (no rule of this project declares
      ``contiguous_inputs``, so today the two agree).

    Whether a homed producer writes its slice or copies into it
    (``copied_in``) is left out: it is the rule choice being made.
    """
    def rule_of(n: int) -> Rule | None:
        op = graph.node(n).op
        if not isinstance(op, Lowered):
            return None
        return rules_for(type(op.op)).get(op.algorithm)

    def contiguous(n: int) -> bool:
        return any(r.contiguous_inputs for r in rules_for(type(graph.node(n).op.op)).values())

    homes, _ = _plan(graph, outputs, lambda n: rule_of(n) is not None, contiguous)
    out = {}
    for v in homes:
        root, chain = _region(homes, graph, v)
        t = graph.node(root).type
        out[v] = Home(root, tuple(t.shape), t.layout, chain)
    return out


def shared_values(graph: Graph, homes: dict, views: frozenset) -> set[int]:
    """Values whose buffer another live value shares under the plan: the
    homed values, the concats they live in, the slices run as views and
    their inputs. The in-place plan neither overwrites them nor lets them
    write into an input."""
    shared = set(homes) | {c for c, _, _ in homes.values()} | set(views)
    shared |= {graph.input_ids(s)[0] for s in views}
    return shared


__all__ = ["STRIDED_OUT", "Home", "kernel_options", "plan_views", "predict_homes", "shared_values"]
