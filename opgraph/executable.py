"""The executor: a flat schedule of lowered nodes over NumPy or CuPy arrays.

``Executable`` is what ``opgraph.compile`` returns. Building it resolves every
node's kernel once, computes the topological schedule and, for each step, the
buffers whose last reader it is (freed right after, so peak memory follows
liveness: :func:`last_readers`, which the memory pass follows too). Calling it
only feeds sources and runs that list: no graph walk and no dictionary of ops
per call. A 4-D value the layout pass stored NHWC is kept channels-last after
every step (``_stored_channels_last``).

In-place steps: the memory pass (``passes/memory.py``) decides which
element-wise steps write their output into the buffer of an input that dies
at that step (ReLU into x, ReLU-backward into gy, a gradient sum into an
addend) and records it on the lowered graph (:class:`InplacePlan`,
``Graph.inplace_plan``). Building the executable copies each decision into
its step (``Step.inplace``) after checking that it holds in this schedule;
:func:`run_step` then passes that input as the kernel's ``out=``. The
executor decides nothing itself: with no plan (a graph that did not go
through the memory pass, or an executable built for other outputs than the
plan's) every step allocates its output.

Zero-copy steps: the same plan may say that a concat's producers write into
their slice of its buffer, that a concat is a slice of a larger one, and that
a ``Slice`` is a view (``InplacePlan.homes`` / ``views``, decided by
``passes/zero_copy.py``); building the executable gives those steps a
``Step.view`` (``opgraph/buffer_views.py``), which :func:`run_step` runs
instead of the plain kernel call, and ``report`` marks them.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np

from .buffer_views import StepView, step_views
from .errors import ExecutionError, NotLoweredError
from .graph import Graph, Value
from .op import Lowered, Source
from .types import TensorType, is_float, numpy_dtype, to_layout
from .run_types import run_types


@attrs.frozen
class InplacePlan:
    """The memory pass's in-place decisions for one schedule.

    Attributes:
        outputs: node ids of the requested outputs it was planned for (the
            schedule is that of their ancestors).
        writes: node id -> position among its inputs of the input whose
            buffer the node's output takes (that input's last reader is the
            node; ``passes/memory.py`` gives every condition).
        homes: value node id -> ``(concat node id, axis, start)``: the
            value's buffer is that concat's buffer sliced ``start:start +
            extent`` along ``axis`` (its producer writes there, or it is a
            concat whose inputs are all there already); ``passes/zero_copy.py``
            gives the conditions.
        views: node ids of the ``Slice`` steps that return a view of their input.
        copied_in: the homed values whose step copies its kernel's result
            into its slice (the kernel cannot write a strided view).
    """

    outputs: frozenset = attrs.field(converter=frozenset)
    writes: Mapping[int, int] = attrs.field(factory=dict, converter=lambda m: dict(sorted(m.items())))
    homes: Mapping[int, tuple] = attrs.field(factory=dict, converter=lambda m: dict(sorted(m.items())))
    views: frozenset = attrs.field(factory=frozenset, converter=frozenset)
    copied_in: frozenset = attrs.field(factory=frozenset, converter=frozenset)


@attrs.frozen
class Step:
    """One scheduled node: ``slots[node] = kernel(ctx, op.op, *slots[args])``.

    ``free``: the inputs whose last reader this step is (dropped after it).
    ``inplace``: the position among ``args`` of the input whose buffer the
    output takes (the plan's decision), or None; it applies only while that
    input is among ``free`` (:attr:`writes_into`).
    ``view``: how the step runs when its output is a view (a zero-copy
    concat, a producer writing into its slice of one, a slice), or None.
    """

    node: int
    name: str
    op: Lowered
    kernel: Callable
    ctx: Any
    args: tuple[int, ...]
    free: tuple[int, ...] = ()
    inplace: int | None = None
    view: StepView | None = None

    @property
    def writes_into(self) -> int | None:
        """Node id of the input whose array this step overwrites with its
        output, or None. An in-place write reuses a buffer that dies at this
        step, so a copy of the step that frees nothing (``attrs.evolve(st,
        free=())``: the benchmark's phase loops, which keep every value to
        re-run phases) writes nothing in place."""
        if self.inplace is None:
            return None
        target = self.args[self.inplace]
        return target if target in self.free else None


#: ``resolve(op, out_type) -> (kernel, ctx)``: a lowered op and its node's
#: output type as it runs (the compile dtype applied, ``run_types.py``) to the
#: kernel that runs it and the context it gets.
Resolver = Callable[[Lowered, TensorType], tuple[Callable, Any]]


def run_step(st: Step, slots: dict):
    """``st``'s output computed from ``slots`` (node id -> array), which holds
    its inputs: ``st.kernel(st.ctx, op, *inputs)``, with ``out=`` the input
    array it overwrites when it runs in place (:attr:`Step.writes_into`; the
    kernel then returns that array). The one place a step runs (the executor,
    the benchmark's phase loops, CUDA-graph capture)."""
    inputs = [slots[a] for a in st.args]
    if st.view is not None:  # a zero-copy step (opgraph/buffer_views.py)
        return st.view.run(st, slots, inputs)
    if st.writes_into is not None:
        return st.kernel(st.ctx, st.op.op, *inputs, out=inputs[st.inplace])
    return st.kernel(st.ctx, st.op.op, *inputs)


class Executable:
    """A compiled graph: call it with feeds, get the output arrays.

    Args:
        graph: a graph whose non-source nodes (among the ancestors of
            ``outputs``) are all ``Lowered``.
        outputs: values to return, in order.
        resolve: maps a lowered op and its node's output type as it runs
            (``dtype`` applied: :func:`opgraph.run_types.run_types`) to
            ``(kernel, ctx)`` (from the registry; the context carries the type).
        xp: the array module (``numpy`` or ``cupy``).
        dtype: if set (e.g. ``'float64'`` for the reference oracle), floating
            feeds are cast to it instead of their declared dtype.

    Attributes:
        types: node id -> the type its value runs in (``dtype`` applied), for
            every node the outputs depend on, sources included.

    Raises:
        NotLoweredError: an abstract node is left; names the node and the pass.
    """

    def __init__(self, graph: Graph, outputs: Sequence[Value], resolve: Resolver, *,
                 xp=np, device: str = "cpu", dtype: str | None = None):
        self.graph, self.xp, self.device, self.dtype = graph, xp, device, dtype
        self.outputs = [graph.value(v.node) for v in outputs]
        order = graph.topological(graph.ancestors(self.outputs))
        self.sources = [graph.node(n) for n in order if isinstance(graph.node(n).op, Source)]
        steps, types = [], run_types(graph, order, dtype)
        self.types = types
        for n in order:
            view = graph.node(n)
            if isinstance(view.op, Source):
                continue
            if not isinstance(view.op, Lowered):
                raise NotLoweredError(
                    f"node {view.name} ({view.op.name}) is abstract and cannot run; the 'lower' pass "
                    f"chooses its implementation (opgraph.compile runs it)")
            kernel, ctx = resolve(view.op, types[n])
            if view.type.layout == "NHWC" and view.type.ndim == 4:
                kernel = _stored_channels_last(kernel, xp)
            steps.append(Step(n, view.name, view.op, kernel, ctx, tuple(graph.input_ids(n))))
        keep = {v.node for v in self.outputs}
        self.steps = _with_frees(steps, keep, last_readers(graph, order))
        plan = graph.inplace_plan
        if plan is not None and plan.outputs == keep:  # a plan for this schedule
            self.steps = _with_inplace(self.steps, graph, plan)
            views = step_views(graph, plan, xp, types)
            self.steps = [attrs.evolve(st, view=views[st.node]) if st.node in views else st
                          for st in self.steps]

    # ---- feeding ---------------------------------------------------------
    def feed(self, feeds: Mapping[str, Any], grad_outputs: Mapping | None = None) -> dict[int, Any]:
        """Source slots from keyword feeds, graph param values and grad feeds.

        A feed naming a source of the graph that the compiled outputs do not
        read is ignored: a training loop feeds one dict of every parameter to
        an executable that computes only some gradients (``dw`` does not read
        ``w``). A name that is no source of the graph is an error.

        Raises:
            ExecutionError: a feed naming no source of the graph, a missing
                feed, a wrong shape, a non-integral value fed to an integer
                input, a ``grad_outputs`` key that is no output with a
                gradient placeholder.
            TypeError: ``grad_outputs`` is not a mapping.
        """
        known = {s.name for s in self.graph.sources()}
        unknown = set(feeds) - known
        if unknown:
            raise ExecutionError(f"unknown feed(s) {sorted(unknown)}: no source of graph "
                                 f"{self.graph.name!r} has that name; its sources are {sorted(known)}")
        by_grad = self._grad_feeds(grad_outputs)
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

    def _grad_feeds(self, grad_outputs) -> dict[int, Any]:
        """``grad_outputs`` ({output Value or its node name: gradient}) by the
        node id of each output's gradient placeholder.

        Raises:
            TypeError: not a mapping (a list of arrays, say).
            ExecutionError: a key naming no node, a source (feeds are keyword
                arguments: ``run({"x": X})`` reads the dict as grad_outputs),
                or an output without a gradient placeholder.
        """
        if grad_outputs is None:
            return {}
        if not isinstance(grad_outputs, Mapping):
            raise TypeError(f"grad_outputs must be a dict {{output Value or name: gradient array}}, got "
                            f"{type(grad_outputs).__name__}; feeds are keyword arguments: run(x=..., "
                            "grad_outputs={y: gy})")
        by_grad = {}
        for key, arr in grad_outputs.items():
            if isinstance(key, Value):
                node = key.node
            elif isinstance(key, str) and key in self.graph:
                node = self.graph[key].node
            else:
                raise ExecutionError(f"grad_outputs key {key!r} is neither an output Value nor the name "
                                     f"of a node of graph {self.graph.name!r}")
            view = self.graph.node(node)
            if isinstance(view.op, Source):
                raise ExecutionError(
                    f"grad_outputs key {view.name!r} is a source ({view.op.role}), not an output: feed "
                    f"sources as keyword arguments, run({view.name}=...) or run(**feeds) (a dict "
                    "passed positionally is read as grad_outputs)")
            if node not in self.graph.grad_inputs:
                raise ExecutionError(f"no gradient placeholder for output {view.name}; "
                                     "call opgraph.grad on it first")
            by_grad[self.graph.grad_inputs[node]] = arr
        return by_grad

    def _to_array(self, source, arr):
        want = source.type.dtype
        if self.dtype is not None and is_float(want):
            want = self.dtype
        if np.dtype(numpy_dtype(want)).kind in "iu":
            _check_integral(self.xp, source, arr, want)
        try:
            out = self.xp.asarray(arr, dtype=numpy_dtype(want))
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
        """One line per scheduled node: name, chosen implementation, and
        ``[zero-copy: ...]`` where its output is a view (``Step.view``)."""
        width = max((len(st.name) for st in self.steps), default=0)
        return "\n".join(f"{st.name:<{width}}  {st.op.describe()}"
                         + (f"  [{st.view.describe()}]" if st.view is not None else "") for st in self.steps)


def _check_integral(xp, source, arr, want: str) -> None:
    """Refuse floating data fed to an integer source unless every value is a
    whole number in ``want``'s range: the cast would truncate 1.7 to class 1
    (PyTorch's cross-entropy refuses float targets outright).

    Raises:
        ExecutionError: naming the source and the first bad value.
    """
    given = arr if hasattr(arr, "dtype") else np.asarray(arr)
    if getattr(given.dtype, "kind", "i") != "f":
        return
    given = xp.asarray(given)
    if given.ndim == 0:
        given = given.reshape(1)
    info = np.iinfo(numpy_dtype(want))
    bad = ~xp.isfinite(given) | (given != xp.trunc(given)) | (given < info.min) | (given > info.max)
    if bool(bad.any()):
        value = given[bad].ravel()[0].item()
        raise ExecutionError(f"{source.op.role} {source.name!r} is {want}: got floating values such as "
                             f"{value!r}, which are not whole numbers in its range (class indices "
                             "are integers; round them yourself if that is meant)")


def _stored_channels_last(kernel: Callable, xp) -> Callable:
    """``kernel`` whose 4-D output is stored channels-last, as the layout pass
    decided for its value. Most kernels write their input's layout already
    (no copy then); one whose output cannot follow (a reshape of a 2-D
    gradient, a padded copy, a GEMM/FFT convolution) pays one transpose here,
    so that every later kernel, and the autotuner's view of it, sees NHWC."""

    def run(ctx, op, *arrays, **kw):
        y = kernel(ctx, op, *arrays, **kw)
        if kw.get("out") is not None:  # in place: the input's array, of this NHWC type already
            return y
        return to_layout(xp, y, "NHWC")

    run.__name__ = run.__qualname__ = getattr(kernel, "__name__", "kernel")
    run.__wrapped__ = kernel
    run.__doc__ = kernel.__doc__
    return run


def last_readers(graph: Graph, order: Sequence[int]) -> dict[int, int]:
    """Value node id -> the node of ``order`` (a schedule) that reads it last;
    a value nothing in ``order`` reads is absent. The liveness the executor
    frees by and the memory pass (``passes/memory.py``) plans with."""
    last: dict[int, int] = {}
    for n in order:
        for u in graph.input_ids(n):
            last[u] = n
    return last


def _with_frees(steps: list[Step], keep: set[int], last: Mapping[int, int]) -> list[Step]:
    """Attach to each step the buffers it reads for the last time (``last``:
    :func:`last_readers`); the requested outputs ``keep`` are never freed."""
    frees: dict[int, list[int]] = {}
    for node, reader in last.items():
        if node not in keep:
            frees.setdefault(reader, []).append(node)
    return [attrs.evolve(st, free=tuple(sorted(frees.get(st.node, ())))) for st in steps]


def _with_inplace(steps: list[Step], graph: Graph, plan: InplacePlan) -> list[Step]:
    """``steps`` with the plan's in-place decisions (``Step.inplace``), each
    checked against this schedule: the input is freed at that step (its last
    reader, not a requested output), is not a source, and has the output's
    type (shape, dtype, layout). What the plan knows beyond that (which
    kernels may write in place, which buffers no other value shares) comes
    from the registry, which the executor does not see.

    Raises:
        ExecutionError: a decision does not hold: the graph was rewritten
            after the memory pass planned it.
    """
    by_node = {st.node: st for st in steps}
    for node, pos in plan.writes.items():
        st = by_node.get(node)
        why = _inplace_conflict(graph, st, pos)
        if why is not None:
            name = st.name if st is not None else f"node {node}"
            raise ExecutionError(f"in-place plan: {name} cannot write its output into its input {pos}: "
                                 f"{why}; the memory pass must run after every pass that rewrites the graph")
    return [attrs.evolve(st, inplace=plan.writes[st.node]) if st.node in plan.writes else st
            for st in steps]


def _inplace_conflict(graph: Graph, st: Step | None, pos: int) -> str | None:
    """Why step ``st`` cannot write its output into input ``pos``, or None."""
    if st is None or not 0 <= pos < len(st.args):
        return "no such step or input in this schedule"
    target, out = graph.node(st.args[pos]), graph.node(st.node)
    if target.id not in st.free:
        return f"{target.name} is read after it or is a requested output"
    if isinstance(target.op, Source):
        return f"{target.name} is a source"
    if target.type != out.type:
        return f"{target.name} is {target.type}, the output {out.type}"
    return None
