"""The executor: a flat schedule of lowered nodes over NumPy or CuPy arrays.

``Executable`` is what ``opgraph.compile`` returns. Building it resolves every
node's kernel once, computes the topological schedule and, for each step, the
buffers whose last reader it is (freed right after, so peak memory follows
liveness). Calling it only feeds sources and runs that list: no graph walk and
no dictionary of ops per call. A 4-D value the layout pass stored NHWC is
kept channels-last after every step (``_stored_channels_last``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np

from .errors import ExecutionError, NotLoweredError
from .graph import Graph, Value
from .op import Lowered, Source
from .types import to_layout


@attrs.frozen
class Step:
    """One scheduled node: ``slots[node] = kernel(ctx, op.op, *slots[args])``."""

    node: int
    name: str
    op: Lowered
    kernel: Callable
    ctx: Any
    args: tuple[int, ...]
    free: tuple[int, ...] = ()


Resolver = Callable[[Lowered], tuple[Callable, Any]]


def run_step(st: Step, slots: dict):
    """``st``'s output computed from ``slots`` (node id -> array), which holds
    its inputs: ``st.kernel(st.ctx, op, *inputs)``. The one place a step runs
    (the executor, the benchmark's phase loops, CUDA-graph capture)."""
    return st.kernel(st.ctx, st.op.op, *[slots[a] for a in st.args])


class Executable:
    """A compiled graph: call it with feeds, get the output arrays.

    Args:
        graph: a graph whose non-source nodes (among the ancestors of
            ``outputs``) are all ``Lowered``.
        outputs: values to return, in order.
        resolve: maps a lowered op to ``(kernel, ctx)`` (from the registry).
        xp: the array module (``numpy`` or ``cupy``).
        dtype: if set (e.g. ``'float64'`` for the reference oracle), floating
            feeds are cast to it instead of their declared dtype.

    Raises:
        NotLoweredError: an abstract node is left; names the node and the pass.
    """

    def __init__(self, graph: Graph, outputs: Sequence[Value], resolve: Resolver, *,
                 xp=np, device: str = "cpu", dtype: str | None = None):
        self.graph, self.xp, self.device, self.dtype = graph, xp, device, dtype
        self.outputs = [graph.value(v.node) for v in outputs]
        order = graph.topological(graph.ancestors(self.outputs))
        self.sources = [graph.node(n) for n in order if isinstance(graph.node(n).op, Source)]
        steps = []
        for n in order:
            view = graph.node(n)
            if isinstance(view.op, Source):
                continue
            if not isinstance(view.op, Lowered):
                raise NotLoweredError(
                    f"node {view.name} ({view.op.name}) is abstract and cannot run; the 'lower' pass "
                    f"chooses its implementation (opgraph.compile runs it)")
            kernel, ctx = resolve(view.op)
            if view.type.layout == "NHWC" and view.type.ndim == 4:
                kernel = _stored_channels_last(kernel, xp)
            steps.append(Step(n, view.name, view.op, kernel, ctx, tuple(graph.input_ids(n))))
        self.steps = _with_frees(steps, {v.node for v in self.outputs})

    # ---- feeding ---------------------------------------------------------
    def feed(self, feeds: Mapping[str, Any], grad_outputs: Mapping | None = None) -> dict[int, Any]:
        """Source slots from keyword feeds, graph param values and grad feeds.

        Raises:
            ExecutionError: an unknown feed name, a missing feed, a wrong shape.
        """
        names = {s.name for s in self.sources}
        unknown = set(feeds) - names
        if unknown:
            raise ExecutionError(f"unknown feed(s) {sorted(unknown)}; this graph's sources are {sorted(names)}")
        by_grad = {}
        for key, arr in (grad_outputs or {}).items():
            node = key.node if isinstance(key, Value) else self.graph[key].node
            if node not in self.graph.grad_inputs:
                raise ExecutionError(f"no gradient placeholder for output {self.graph.node(node).name}; "
                                     "call opgraph.grad on it first")
            by_grad[self.graph.grad_inputs[node]] = arr
        slots = {}
        for s in self.sources:
            if s.name in feeds:
                arr = feeds[s.name]
            elif s.id in by_grad:
                arr = by_grad[s.id]
            elif s.name in self.graph.param_values:
                arr = self.graph.param_values[s.name]
            elif s.op.role == "grad" and s.type.shape == ():
                arr = 1.0  # d(loss)/d(loss)
            else:
                raise ExecutionError(f"no value fed for {s.op.role} {s.name!r} of type {s.type}")
            slots[s.id] = self._to_array(s, arr)
        return slots

    def _to_array(self, source, arr):
        want = source.type.dtype
        if self.dtype is not None and want.startswith("float"):
            want = self.dtype
        if want == "bfloat16":
            import ml_dtypes  # noqa: F401  (registers the dtype; GPU precision path)
        try:
            out = self.xp.asarray(arr, dtype=want)
        except (TypeError, ValueError) as e:
            raise ExecutionError(f"{source.op.role} {source.name!r}: cannot be read as {want} "
                                 f"{source.type.shape} ({e})") from None
        if tuple(out.shape) != source.type.shape:
            raise ExecutionError(f"{source.op.role} {source.name!r} expects shape {source.type.shape}, "
                                 f"got {tuple(out.shape)}")
        # the layout pass's choice (NHWC: channels-last storage, same logical shape)
        return to_layout(self.xp, out, source.type.layout)

    # ---- running ---------------------------------------------------------
    def execute(self, slots: dict[int, Any], steps: Sequence[Step] | None = None) -> dict[int, Any]:
        """Run ``steps`` (default: all) in order, reading and writing ``slots``."""
        for st in self.steps if steps is None else steps:
            slots[st.node] = run_step(st, slots)
            for f in st.free:
                slots.pop(f, None)
        return slots

    def __call__(self, grad_outputs: Mapping | None = None, **feeds) -> list:
        """Run the graph. Feeds by source name; ``grad_outputs={output: array}``.

        Returns:
            The output arrays (NumPy or CuPy), in the order of ``outputs``.
        """
        slots = self.execute(self.feed(feeds, grad_outputs))
        return [slots[v.node] for v in self.outputs]

    @property
    def choices(self) -> dict[str, str]:
        """Node name -> the implementation chosen for it (algorithm, device, options)."""
        return {st.name: st.op.describe() for st in self.steps}

    def report(self) -> str:
        """One line per scheduled node: name, chosen implementation."""
        width = max((len(n) for n in self.choices), default=0)
        return "\n".join(f"{n:<{width}}  {c}" for n, c in self.choices.items())


def _stored_channels_last(kernel: Callable, xp) -> Callable:
    """``kernel`` whose 4-D output is stored channels-last, as the layout pass
    decided for its value. Most kernels write their input's layout already
    (no copy then); one whose output cannot follow (a reshape of a 2-D
    gradient, a padded copy, a GEMM/FFT convolution) pays one transpose here,
    so that every later kernel, and the autotuner's view of it, sees NHWC."""

    def run(ctx, op, *arrays):
        return to_layout(xp, kernel(ctx, op, *arrays), "NHWC")

    run.__name__ = run.__qualname__ = getattr(kernel, "__name__", "kernel")
    run.__wrapped__ = kernel
    run.__doc__ = kernel.__doc__
    return run


def _with_frees(steps: list[Step], keep: set[int]) -> list[Step]:
    """Attach to each step the buffers it reads for the last time."""
    last: dict[int, int] = {}
    for i, st in enumerate(steps):
        for a in st.args:
            last[a] = i
    frees: dict[int, list[int]] = {}
    for node, i in last.items():
        if node not in keep:
            frees.setdefault(i, []).append(node)
    return [attrs.evolve(st, free=tuple(sorted(set(frees.get(i, []))))) for i, st in enumerate(steps)]
