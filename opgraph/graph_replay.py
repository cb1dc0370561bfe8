"""CUDA-graph replay of a run of lowered steps (``opgraph-bench --cuda-graph``).

An executor strategy beside :mod:`.executable`: it runs the steps of any
backend, importing none (CuPy is imported on first use).

A Python executor pays for every step it dispatches: CuPy's launch path, the
cuDNN frontend's ``execute`` (about 80 us of wall time per call, GPU_NOTES.md),
argument packing. On a model of many small layers (GoogLeNet: ~400 steps per
training step, most convolutions under 0.1 ms on the H200) the GPU then waits
for Python. Capturing the steps into a CUDA graph once and replaying it costs
one launch per graph instead (measured: docs/performance.md, change 10).

Not every kernel can be captured: CuPy refuses any cuBLAS call while a stream
captures ("calling cuBLAS API during stream capture is currently unsupported";
docs/gpu.md), so a ``Linear``, a GEMM or FFT convolution (its products in the
frequency domain are cuBLAS calls) or a cuBLAS bias gradient cannot be in a
graph. Each lowering rule declares whether its kernel captures
(``Rule.capturable`` in ``backends/registry.py``), and the compiler puts the
reason a step cannot be captured on its context (``step.ctx.capture_blocker``,
read here by duck typing: this module imports no backend). :class:`GraphReplay`
runs a step with such a reason eagerly without trying, tries every other step
alone in a throw-away capture (:func:`capture_error`: a declaration is checked,
never trusted), then captures every maximal run of steps that allow it as one
graph and runs the others eagerly between the graphs.

Memory rules that keep a replay correct:

* a graph's kernels read and write the device addresses they had during
  capture, so every value a graph reads or writes is pinned (a reference is
  kept) for the replay's lifetime, and the graphs allocate from a private
  ``cupy.cuda.MemoryPool`` that nothing else uses: a block a graph uses as
  scratch is never handed to another array that the replay would overwrite
  (the scheme of ``torch.cuda.graph``'s private pools);
* all the graphs of one replay share its private pool. They are launched in
  the order they were captured, one after another on one stream, and a block
  is free in the pool only when no array still uses it: so a block that one
  graph used as scratch and freed, and a later graph took, is written by the
  earlier graph only before the later graph rewrites it, in every replay (the
  rule under which ``torch.cuda.graph`` lets graphs share a ``pool``). A pool
  per graph held every graph's scratch at once: fp32 ResNet-50's three phases,
  split into graphs by 12 eager FFT steps, held 27.7 GB against eager's 10.4 GB
  (docs/results/h200-2026-12-04c/call4). Two replays may share one pool
  (``pool=``) only if their caller always launches them in build order;
* a CuPy pool frees every block it handed out when the pool object dies, even
  blocks that arrays still use (an array holds only a weak reference to its
  pool). So the private pool lives as long as the replay object, which must
  live as long as anyone reads ``slots`` (``PhaseRunner`` keeps its replays);
  :meth:`GraphReplay.close` drops the graphs and the pool's unused blocks, not
  the pool;
* before each capture the default pool's idle blocks go back to the device
  (:func:`release_cached`): the arrays earlier captures rebound sit there,
  and a private pool whose ``cudaMalloc`` fails frees only its own idle
  blocks (fp32 ResNet-50's backward-data ran out of an H100's memory with
  the forward's 10.7 GB cached so). An idle block belongs to no array, and
  the graphs never allocate from the default pool, so none of their scratch
  is among them; hence the private pool may not be the default pool. The
  throw-away captures of :func:`capture_error` allocate from the default
  pool instead: a step may create a cached object there (a cuFFT plan's work
  area) that must outlive the trial;
* an eagerly run step allocates a new output on every call, but a graph that
  reads it captured one address: the eager step's result is copied into the
  array captured there (its *static* output), so ``slots`` never changes
  after the build and every later reader sees the current values;
* an in-place step (``Step.writes_into``: the memory pass let it write its
  output into an input that dies there, e.g. a ReLU into its input) runs out
  of place in a replay (:func:`_rerunnable`): phases are replayed apart and
  in any order, so a value a step would destroy may still be read by a step
  of another phase replayed later; and a slot that an in-place run left
  sharing its input's array gets its own copy when the replay is built, so
  that an eager step's copy into its static output never writes into its
  input. The benchmark's phases (``benchmarks/protocol.schedule``) free
  nothing, so their steps write nothing in place anyway.

Capture uses CuPy's default relaxed mode on a non-default stream (the legacy
default stream cannot capture): the caller builds and replays inside
``with stream:`` (:func:`capture_stream`), and the values in ``slots`` must be
complete (the steps ran once: kernels compiled, cuDNN plans and cuFFT plans
built) before the build.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import attrs

from .buffer_views import copy_into

#: ``run_step(step, slots) -> array``: computes one step's output from ``slots``.
RunStep = Callable[[Any, dict], Any]


def _cupy():
    import cupy
    return cupy


def capture_stream():
    """A new non-blocking CuPy stream to capture and replay on."""
    return _cupy().cuda.Stream(non_blocking=True)


def release_cached() -> None:
    """Give the default pool's unused cached blocks back to the device (the
    eager arrays a build rebound), so that they are not counted twice and a
    capture's private pool can have that memory (:meth:`GraphReplay._capture`
    calls it before each capture)."""
    _cupy().get_default_memory_pool().free_all_blocks()


def error_line(e: BaseException) -> str:
    """``'Type: first line of the message'``, at most 200 characters: why a
    step runs eagerly, for a result file."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _captured(stream, fn: Callable[[], Any], pool=None):
    """``(graph, result)``: ``fn`` captured on ``stream``, every allocation from
    ``pool`` (a private ``MemoryPool``; None: the current allocator). The
    capture is ended whatever ``fn`` does; an error in ``fn`` or an
    invalidated capture raises."""
    cupy = _cupy()
    context = cupy.cuda.using_allocator(pool.malloc) if pool is not None else contextlib.nullcontext()
    with context:
        stream.begin_capture()
        try:
            result = fn()
        finally:
            graph = stream.end_capture()
    return graph, result


def _rerunnable(steps: Sequence) -> tuple:
    """``steps`` as a replay may run them any number of times, in any order of
    phases: every step out of place (``inplace=None``). An in-place step would
    destroy a value that a step of another phase, replayed later, still reads,
    and an eager step's copy into its static output would write into its
    input's array (module doc)."""
    return tuple(attrs.evolve(st, inplace=None) if getattr(st, "inplace", None) is not None else st
                 for st in steps)


def capture_error(step, slots: dict, run_step: RunStep, stream) -> str | None:
    """Why ``step`` cannot be captured (the error of a throw-away capture of
    it alone, allocating from the default pool: module doc), or None when it
    can. The graph is never launched and ``slots`` is untouched."""
    try:
        _captured(stream, lambda: run_step(step, slots))
    except Exception as e:  # cuBLAS refused, an invalidated capture, a host sync
        return error_line(e)
    return None


def declared_blocker(step) -> str | None:
    """Why ``step``'s rule says its kernel cannot be captured
    (``step.ctx.capture_blocker``, set by the compiler from the rule's
    declaration and the libraries installed), or None (capturable, or not
    declared: a trial capture decides)."""
    why = getattr(getattr(step, "ctx", None), "capture_blocker", None)
    return f"declared not capturable: {why}" if why else None


class ReleasedScratch(RuntimeError):
    """The private pool gave blocks back to the device during a capture
    (:meth:`GraphReplay._check_kept`): the replay is not built."""


@attrs.define
class _Segment:
    steps: tuple
    capture: bool  # asked to be captured (every step passed capture_error)
    graph: Any = None  # None: the steps run eagerly


class GraphReplay:
    """``steps`` over ``slots`` replayed as CUDA graphs where they allow capture.

    Usage (what ``benchmarks/protocol.PhaseRunner.graph_phases`` does)::

        exe = opgraph.compile(outputs, device="cuda")
        slots = exe.feed(feeds)          # sources by node id
        for st in exe.steps:             # one full run that frees nothing, out of place
            slots[st.node] = run_step(attrs.evolve(st, free=(), inplace=None), slots)
        stream = capture_stream()
        with stream:
            replay = GraphReplay(exe.steps, slots, run_step, stream)
            replay()                     # again, e.g. after writing new input in place
        outputs = [slots[v.node] for v in exe.outputs]

    with ``run_step = opgraph.executable.run_step`` (``st.kernel(st.ctx, st.op.op,
    *[slots[a] for a in st.args])``, with ``out=`` for an in-place step, which
    leaves its output and its dead input on one array in ``slots``, as the
    replays will). ``Executable.execute`` is not a way to fill ``slots``: it
    frees each buffer after its last reader.

    Args:
        steps: scheduled steps (``opgraph.executable.Step``), in order; each
            writes ``slots[step.node]``. A step may be listed several times
            (``--profile`` captures k calls of one step in one graph,
            ``benchmarks/step_clock.py``): its trial capture runs once.
        slots: node id -> device array; holds every value the steps read and,
            from a previous run, every value they write (see module doc).
        run_step: computes one step's output (the executor's kernel call).
        stream: the non-default stream everything runs on; the caller is
            inside ``with stream:`` for the build and every call.
        eager: node ids never to capture (tests; a step known to misbehave).
        pool: the private ``cupy.cuda.MemoryPool`` the graphs allocate from;
            None: a new one. Pass another replay's ``pool`` only when the two
            are always launched in the order they were built (module doc);
            :meth:`close` then leaves the shared pool's idle blocks alone (they
            may be the other replay's scratch), and ``summary()['pool_bytes']``
            is the whole shared pool's.

    Raises:
        ReleasedScratch: device memory ran out during a capture and the pool
            gave back blocks earlier graphs use (:meth:`_check_kept`).
        ValueError: ``pool`` is CuPy's default memory pool.

    After the build, ``slots`` holds the arrays the graphs use (their values
    are those of one replay) and must not be rebound by anyone else.

    Attributes:
        eager_reasons: step name -> why it runs eagerly.
        graphs: number of captured graphs.
        captured_steps: number of steps inside graphs.
    """

    def __init__(self, steps: Sequence, slots: dict, run_step: RunStep, stream, *,
                 eager: frozenset = frozenset(), pool=None):
        if pool is not None and pool is _cupy().get_default_memory_pool():
            raise ValueError("pool: the default memory pool cannot be a replay's private pool (its idle blocks "
                             "are given back before each capture; module docstring)")
        self.slots, self.run_step, self.stream = slots, run_step, stream
        steps = _rerunnable(steps)
        for st in steps:  # a slot filled by an in-place run shares its input's array: part them
            value = slots.get(st.node)
            if value is not None and any(slots.get(a) is value for a in st.args):
                slots[st.node] = value.copy(order="K")
        reasons = {}
        for st in {st.node: st for st in steps}.values():  # a step listed k times is tried once
            why = ("excluded by the caller" if st.node in eager
                   else declared_blocker(st) or capture_error(st, slots, run_step, stream))
            if why is not None:
                reasons[st.node] = why
        self._pinned: list = []
        # the graphs' one private pool, kept while the replay lives (module doc)
        self.pool = pool if pool is not None else _cupy().cuda.MemoryPool()
        self._own_pool = pool is None  # close() frees idle blocks of its own pool only
        self.segments: list[_Segment] = []
        for st in steps:
            capture = st.node not in reasons
            if self.segments and self.segments[-1].capture == capture:
                self.segments[-1].steps += (st,)
            else:
                self.segments.append(_Segment((st,), capture))
        entry = {st.node: slots.get(st.node) for st in steps}
        try:
            for seg in self.segments:
                if seg.capture:
                    self._capture(seg, reasons)
                else:
                    for st in seg.steps:
                        self._run_eager(st)
        except BaseException:  # this object (and a pool of its own) dies: leave no slot in it
            slots.update(entry)
            raise
        self.eager_reasons = {st.name: reasons[st.node] for st in steps if st.node in reasons}
        self.steps = len(steps)
        self.graphs = sum(1 for s in self.segments if s.graph is not None)
        self.captured_steps = sum(len(s.steps) for s in self.segments if s.graph is not None)

    def _capture(self, seg: _Segment, reasons: dict) -> None:
        slots, run_step = self.slots, self.run_step
        inside = {st.node for st in seg.steps}
        self._pinned += [slots[a] for st in seg.steps for a in st.args if a not in inside]

        def body():
            for st in seg.steps:
                slots[st.node] = run_step(st, slots)

        before = {st.node: slots.get(st.node) for st in seg.steps}
        release_cached()  # the arrays earlier captures rebound (module docstring)
        held = int(self.pool.total_bytes())
        try:
            seg.graph, _ = _captured(self.stream, body, self.pool)
        except Exception as e:  # each step captured alone, together they did not
            why = f"captured alone but not in a run of {len(seg.steps)} steps ({error_line(e)})"
            for st in seg.steps:
                reasons[st.node] = why
                slots[st.node] = before[st.node]  # not the failed capture's unwritten arrays
            seg.graph = None
        self._check_kept(held)  # a failed capture allocated from the pool too
        if seg.graph is None:
            for st in seg.steps:
                self._run_eager(st)
            return
        self._pinned += [slots[st.node] for st in seg.steps]
        seg.graph.launch(self.stream)  # the values, for the eager steps that follow

    def _check_kept(self, held: int) -> None:
        """Raise :class:`ReleasedScratch` if the private pool gave blocks back to
        the device during a capture: CuPy's pool, when ``cudaMalloc`` fails, frees
        all its idle blocks and retries, and an idle block may be the scratch of a
        graph captured earlier, whose replays would then write memory that
        another array may own (a silently wrong value, never an error)."""
        if int(self.pool.total_bytes()) < held:
            raise ReleasedScratch(
                "device memory ran out while capturing a CUDA graph: the replay's private pool gave "
                "back blocks that earlier graphs use as scratch, so the replay cannot be trusted; "
                "free memory (a smaller batch, or fewer columns in one run) and build it again")

    def _run_eager(self, st) -> None:
        """Run one step eagerly at build time. The array in its slot (from the
        previous run) becomes its static output, pinned; without one of the
        right shape and dtype, this run's output does."""
        out = self.run_step(st, self.slots)
        static = self.slots.get(st.node)
        if static is None or tuple(static.shape) != tuple(out.shape) or static.dtype != out.dtype:
            self.slots[st.node] = static = out
        else:
            copy_into(static, out)
        self._pinned.append(static)

    def __call__(self) -> None:
        """One replay: every graph launched, every eager step run, in order.

        Raises:
            RuntimeError: the replay was closed (:meth:`close`).
        """
        if self.segments is None:
            raise RuntimeError("this GraphReplay was closed; build a new one to replay")
        stream = self.stream
        for seg in self.segments:
            if seg.graph is not None:
                seg.graph.launch(stream)
            else:
                for st in seg.steps:
                    copy_into(self.slots[st.node], self.run_step(st, self.slots))

    def close(self) -> None:
        """Drop the graphs and the pinned references, and give the private
        pool's unused blocks back to the device (a pool of its own; a shared
        one is left as it is), now rather than when the
        garbage collector gets to them (a benchmark builds replays column after
        column). The replay cannot be called afterwards. The pool itself stays
        with this object: the arrays in ``slots`` live in it and stay valid
        while it lives (module doc)."""
        for seg in self.segments or ():
            seg.graph = None
        self.segments, self._pinned = None, []
        if self._own_pool:  # a shared pool's idle blocks may be another replay's scratch
            self.pool.free_all_blocks()

    @property
    def pool_bytes(self) -> int:
        """Bytes the private pool holds (in use and cached; all of a shared pool)."""
        return int(self.pool.total_bytes())

    def summary(self) -> dict:
        """Counts and reasons, for a result file."""
        return {"steps": self.steps, "captured_steps": self.captured_steps, "graphs": self.graphs,
                "eager_steps": self.steps - self.captured_steps, "eager": dict(self.eager_reasons),
                "pool_bytes": self.pool_bytes, "pool_shared": not self._own_pool}


__all__ = ["GraphReplay", "ReleasedScratch", "capture_error", "declared_blocker", "capture_stream", "release_cached",
           "error_line", "RunStep"]
