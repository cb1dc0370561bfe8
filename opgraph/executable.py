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
from .errors import ExecutionError, NotLoweredError, did_you_mean
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
        output_views: node id -> position of the input whose buffer the
            step's kernel returns a view of (``Rule.output_view``): nothing
            the executor acts on (the kernel decides at run time); the memory
            pass's replay counts no buffer for it.
    """

    outputs: frozenset = attrs.field(converter=frozenset)
    writes: Mapping[int, int] = attrs.field(factory=dict, converter=lambda m: dict(sorted(m.items())))
    homes: Mapping[int, tuple] = attrs.field(factory=dict, converter=lambda m: dict(sorted(m.items())))
    views: frozenset = attrs.field(factory=frozenset, converter=frozenset)
    copied_in: frozenset = attrs.field(factory=frozenset, converter=frozenset)
    output_views: Mapping[int, int] = attrs.field(factory=dict, converter=lambda m: dict(sorted(m.items())))


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
        source_graph: the user's graph that ``graph`` was compiled from
            (``opgraph.compile`` lowers a copy, which fusion rewrites), so that
            its values and names work as ``grad_outputs`` keys; default ``graph``.

    Attributes:
        types: node id -> the type its value runs in (``dtype`` applied), for
            every node the outputs depend on, sources included.

    Raises:
        NotLoweredError: an abstract node is left; names the node and the pass.
    """

    def __init__(self, graph: Graph, outputs: Sequence[Value], resolve: Resolver, *,
                 xp=np, device: str = "cpu", dtype: str | None = None, source_graph: Graph | None = None):
        self.graph, self.xp, self.device, self.dtype = graph, xp, device, dtype
        self.source_graph = graph if source_graph is None else source_graph
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

        A key is a value (or the name of a node) of the graph this executable
        was compiled from, or of the compiled graph (``exe.outputs``); the
        compiled graph is a rewritten copy (fusion deletes nodes, passes add
        nodes with new ids), so node ids alone identify nothing: a key is
        resolved in its own graph, through that graph's ``grad_inputs``.

        Raises:
            TypeError: not a mapping (a list of arrays, say).
            ExecutionError: a key naming no node, a value of another graph, a
                source (feeds are keyword arguments: ``run({"x": X})`` reads
                the dict as grad_outputs), an output without a gradient
                placeholder in the compiled graph, or two keys naming the
                same output.
        """
        if grad_outputs is None:
            return {}
        if not isinstance(grad_outputs, Mapping):
            raise TypeError(f"grad_outputs must be a dict {{output Value or name: gradient array}}, got "
                            f"{type(grad_outputs).__name__}; feeds are keyword arguments: run(x=..., "
                            "grad_outputs={y: gy})")
        by_grad, key_of = {}, {}
        for key, arr in grad_outputs.items():
            placeholder, output = self._grad_placeholder(key)
            if placeholder in key_of:  # {y: gy, "y": gy2}: which one is meant would be a guess
                raise ExecutionError(f"grad_outputs keys {key_of[placeholder]!r} and {key!r} both name "
                                     f"output {output!r}; give one gradient per output")
            key_of[placeholder] = key
            by_grad[placeholder] = arr
        return by_grad

    def _grad_placeholder(self, key) -> tuple[int, str]:
        """The node id, in the compiled graph, of the gradient placeholder of
        the output that the ``grad_outputs`` key ``key`` names (see
        :meth:`_grad_feeds`), and that output's name."""
        graph = None
        if isinstance(key, Value):
            # by identity: a graph built the same way (or named the same) has the same node ids
            graph = next((g for g in (self.source_graph, self.graph) if key.graph is g), None)
            if graph is None:
                which = (f"another Graph object, also named {key.graph.name!r}"
                         if key.graph.name == self.source_graph.name else f"graph {key.graph.name!r}")
                raise ExecutionError(f"grad_outputs key {key!r} is a value of {which}, not of the graph "
                                     f"{self.source_graph.name!r} this executable was compiled from; "
                                     f"{self._grad_outputs_known()}")
            node = key.node
        elif isinstance(key, str):  # the user's names first: a pass's new node may reuse a later one
            graph = next((g for g in (self.source_graph, self.graph) if key in g), None)
            node = graph[key].node if graph is not None else None
        if graph is None or node not in graph.nx:
            known = set(self.source_graph._by_name) | set(self.graph._by_name)
            raise ExecutionError(f"grad_outputs key {key!r} is neither an output Value nor the name "
                                 f"of a node of graph {self.source_graph.name!r}"
                                 f"{did_you_mean(key, known)}; {self._grad_outputs_known()}")
        view = graph.node(node)
        if isinstance(view.op, Source):
            raise ExecutionError(
                f"grad_outputs key {view.name!r} is a source ({view.op.role}), not an output: feed "
                f"sources as keyword arguments, run({view.name}=...) or run(**feeds) (a dict "
                "passed positionally is read as grad_outputs)")
        placeholder = graph.grad_inputs.get(node)
        if placeholder is None:
            raise ExecutionError(f"grad_outputs key {view.name!r} is not an output with a gradient "
                                 f"placeholder (opgraph.grad made none for {view.name}: call it on that "
                                 f"output before compiling); {self._grad_outputs_known()}")
        # one opgraph.grad made after compile is not in the compiled graph, or a pass's new
        # node holds its id there: the names tell
        if not self._same_node(graph, placeholder):
            raise ExecutionError(f"grad_outputs key {view.name!r}: the gradient placeholder of "
                                 f"{view.name} is not in the compiled graph (opgraph.grad made it after "
                                 f"compiling: compile again); {self._grad_outputs_known()}")
        return placeholder, view.name

    def _same_node(self, graph: Graph, node: int) -> bool:
        """Whether ``node`` of ``graph`` (the source graph or the compiled one)
        is the compiled graph's node of that id."""
        return node in self.graph.nx and self.graph.node(node).name == graph.node(node).name

    def _grad_outputs_known(self) -> str:
        """The end of a bad ``grad_outputs`` key's message: the compiled
        outputs and the outputs whose gradient they read, named as in the
        user's graph (an output that fusion absorbed has a new name in the
        compiled one)."""
        names = []
        for s in self.sources:
            if s.op.role != "grad":
                continue
            for g in (self.source_graph, self.graph):
                out = next((o for o, p in g.grad_inputs.items() if p == s.id), None)
                if out is not None and self._same_node(g, s.id):
                    names.append(g.node(out).name)
                    break
        outs = [v.name for v in self.outputs]
        reads = f"they read the gradient of {sorted(names)}" if names else "they read no output gradient"
        return f"this executable was compiled for outputs {outs}; {reads}"

    def _to_array(self, source, arr):
        want = source.type.dtype
        if self.dtype is not None and is_float(want):
            want = self.dtype
        given = _given_dtype(arr)
        if getattr(given, "kind", None) == "c":
            # NumPy's cast keeps the real part and only warns (ComplexWarning)
            raise ExecutionError(f"{source.op.role} {source.name!r} is {want}: got complex values "
                                 f"({given}); a cast would drop their imaginary part (feed .real if "
                                 "that is meant)")
        if np.dtype(numpy_dtype(want)).kind in "iu":
            _check_integral(self.xp, source, arr, want, given)
        try:
            out = self.xp.asarray(arr, dtype=numpy_dtype(want))
        except (TypeError, ValueError, OverflowError) as e:  # OverflowError: a Python int past int64
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


def _given_dtype(arr):
    """The dtype of the feed ``arr``: its own (an array's, a NumPy or CuPy
    one, or a torch tensor's), else NumPy's reading of it (a list, a
    number); None where NumPy cannot read it (the cast reports that)."""
    if hasattr(arr, "dtype"):
        dtype = arr.dtype
        if hasattr(dtype, "is_floating_point") and not isinstance(dtype, np.dtype):  # a torch dtype
            return _numpy_kind_of_torch(dtype)
        return dtype
    try:
        return np.asarray(arr).dtype
    except (TypeError, ValueError, OverflowError):
        return None


def _numpy_kind_of_torch(dtype):
    """The NumPy dtype of torch ``dtype`` (``torch.int64`` -> int64), or for one NumPy lacks
    (``torch.bfloat16``) one of its kind, so the feed checks read every tensor as they read an
    array (a float tensor fed to a class-index input was truncated: review)."""
    # the kind first: with ml_dtypes imported, np.dtype('bfloat16') exists with kind 'V' (review)
    if dtype.is_complex:
        return np.dtype("complex64" if dtype.itemsize <= 8 else "complex128")
    if dtype.is_floating_point:
        return np.dtype("float64" if dtype.itemsize == 8 else "float32")
    try:
        return np.dtype(str(dtype).removeprefix("torch."))
    except TypeError:
        return np.dtype("int64")


def _check_integral(xp, source, arr, want: str, given_dtype) -> None:
    """Refuse data fed to an integer source that the cast to ``want`` would
    change: floating values unless every one is a whole number in ``want``'s
    range (the cast would truncate 1.7 to class 1; PyTorch's cross-entropy
    refuses float targets outright), and integers outside that range (a
    uint64 2**63 + 1 would wrap to a negative class). ``given_dtype``:
    ``arr``'s (:func:`_given_dtype`).

    Raises:
        ExecutionError: naming the source and the first bad value.
    """
    kind = getattr(given_dtype, "kind", None)
    if kind not in ("f", "i", "u"):
        return
    info = np.iinfo(numpy_dtype(want))
    if kind != "f":
        have = np.iinfo(given_dtype)
        if have.min >= info.min and have.max <= info.max:  # every value fits: nothing to look at
            return
    try:
        given = xp.asarray(arr)
    except (TypeError, ValueError) as e:  # a torch bfloat16 tensor: NumPy has no such dtype
        raise ExecutionError(f"{source.op.role} {source.name!r}: cannot be read as {want} "
                             f"{source.type.shape} ({e})") from None
    if given.ndim == 0:
        given = given.reshape(1)
    if kind == "f":
        bad = ~xp.isfinite(given) | (given != xp.trunc(given)) | (given < info.min) | (given > info.max)
    elif kind == "u":  # never below a minimum <= 0 (a negative bound would not fit an unsigned compare)
        bad = given > info.max
    else:
        bad = (given < info.min) | (given > info.max)
    if bool(bad.any()):
        value = given[bad].ravel()[0].item()
        if kind == "f":
            raise ExecutionError(f"{source.op.role} {source.name!r} is {want}: got floating values such as "
                                 f"{value!r}, which are not whole numbers in its range (class indices "
                                 "are integers; round them yourself if that is meant)")
        raise ExecutionError(f"{source.op.role} {source.name!r} is {want}: got {given.dtype} values such as "
                             f"{value!r}, outside its range {info.min}..{info.max}")


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
