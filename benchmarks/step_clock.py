"""How ``opgraph-bench --profile`` times one lowered step alone, and the
whole step as one CUDA graph (:mod:`.profile`).

A step called from Python between two CUDA events is timed from the moment
the host starts queueing it: CuPy's launch path or the cuDNN frontend's
``execute`` (tens of microseconds of wall time each, GPU_NOTES.md) is in the
measurement whenever the kernel is shorter. Measured on the H200: DenseNet-121's
2,500 steps timed that way summed to 180 ms while its whole step replayed as
a CUDA graph (``auto+graph``) took 56 ms, and each of its 242 batch-norm
running updates showed 53 us. A profile is read to explain the ``+graph``
time, so on a GPU (:class:`GraphClock`) a step's time is device time:

* the step is captured alone with the machinery of the ``+graph`` column
  (:class:`opgraph.graph_replay.GraphReplay`: a trial capture, a private
  memory pool, pinned values) on a non-blocking stream, replayed
  ``warmup`` times untimed, then ``repeat`` times between CUDA events
  (``timer.CudaEventTimer``); its ``ms`` is the median replay divided by the
  calls of the step in the graph;
* a replay's events enclose the graph's launch as well (the device starts
  the first kernel a few microseconds after the launch), which a step inside
  the whole-step graph does not pay. So a step whose one-call replay takes
  under :data:`GRAPH_TARGET_MS` is captured again as ``k`` calls of itself in
  one graph (:func:`graph_calls`: a replay of about that length, at most
  :data:`MAX_GRAPH_CALLS` calls): the launch is then shared by ``k`` calls,
  and the gap between two kernels of one graph, which the whole-step graph
  pays too, is what remains;
* a step that cannot be captured (its rule declares a blocker, its trial
  capture fails, or the build raises) is timed eagerly, as on the CPU, and
  its node says so (``timed``: ``'eager'``, with ``eager_reason``);
* each step's replay is closed and dropped (its graph, its private pool) and
  ``slots`` is given back as it was before the next step is captured, so the
  memory held does not grow with the number of steps.

The whole step is also replayed as one :class:`~opgraph.graph_replay.GraphReplay`
of every step in order (``graph_step_ms``: steps that cannot be captured run
eagerly between its graphs, as in the ``+graph`` column), beside the eager
whole step.

Every call reads the same inputs: a value that fits in the L2 cache (tens
of MB on an H200) is read from it on all calls but the first, as in any
timing of repeated calls (and a step's replay in the whole-step graph often
reads what the step before it just wrote); a memory-bound row above its
copy-bandwidth limit is that.

On the CPU (:class:`EagerClock`) each step is called ``repeat`` times
between ``time.perf_counter`` readings: the NumPy work is synchronous, so
host time is the work's time there. Tests give either clock a stand-in
replay, run_step and timer.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections import Counter

import attrs

from opgraph.executable import run_step as execute_step
from opgraph.graph_replay import GraphReplay, capture_stream, error_line, release_cached

#: A one-call replay shorter than this (ms) is captured again as several calls.
#: 0.2 ms: a launch of a few microseconds shared by calls that last this long
#: is a few percent of them, and the ~2,500 small steps of DenseNet-121 cost
#: 2,500 x (warmup + repeat) x 0.2 ms of replays, seconds.
GRAPH_TARGET_MS = 0.2
#: The most calls of one step in one graph (a view step, whose graph is empty, reaches it).
MAX_GRAPH_CALLS = 64


def graph_calls(one_call_ms: float) -> int:
    """Calls of a step to capture in one graph, from the median replay of a
    graph of one call (ms): 1 at :data:`GRAPH_TARGET_MS` or more, else enough
    for a replay of about that length, at most :data:`MAX_GRAPH_CALLS`."""
    if one_call_ms >= GRAPH_TARGET_MS:
        return 1
    if one_call_ms <= 0:
        return MAX_GRAPH_CALLS
    return min(MAX_GRAPH_CALLS, math.ceil(GRAPH_TARGET_MS / one_call_ms))


def median_ms(timer, fn, warmup: int, repeat: int, label: str = "profile") -> float:
    """``warmup`` untimed calls of ``fn``, then the median of ``repeat`` timed
    ones on ``timer`` (:mod:`.timer`), in milliseconds."""
    for _ in range(warmup):
        fn()
    timer.synchronize()
    return statistics.median(timer.measure(fn, label=label, repeat=repeat))


@attrs.frozen
class StepTime:
    """One step's time alone: ``ms`` per call; ``timed``: ``'graph'`` or
    ``'eager'``; ``graph_calls``: calls of the step in its graph (None when
    eager); ``eager_reason``: why it was not graph-timed (None when it was)."""

    ms: float
    timed: str
    graph_calls: int | None = None
    eager_reason: str | None = None

    def fields(self) -> dict:
        """The keys this adds to a node of the profile (:func:`.profile.profile_steps`)."""
        return {"ms": self.ms, "timed": self.timed, "graph_calls": self.graph_calls,
                "eager_reason": self.eager_reason}


class EagerClock:
    """Each step called alone from Python (``run_step``) between the timer's
    readings: host dispatch included. The CPU's clock; also how a
    :class:`GraphClock` times a step it cannot capture.

    Args:
        timer: a :mod:`.timer` timer; reason: why steps are not graph-timed
            (each node's ``eager_reason``); run_step: ``(step, slots) -> array``.
    """

    kind = "eager"
    method = "eager: each step called alone from Python (host dispatch included)"

    def __init__(self, timer, *, reason: str, run_step=execute_step):
        self.timer, self.reason, self.run_step = timer, reason, run_step

    def step(self, st, slots: dict, *, warmup: int, repeat: int) -> StepTime:
        """``st`` (a scheduled ``Step``) timed on the values in ``slots``, out of
        place (its output is not stored): ``warmup`` calls, median of ``repeat``."""
        ms = median_ms(self.timer, lambda: self.run_step(st, slots), warmup, repeat)
        return StepTime(ms, "eager", eager_reason=self.reason)

    def whole_graph(self, steps, slots: dict, *, warmup: int, repeat: int) -> dict:
        """``{'graph_step_ms', 'graph_step_capture'}``: None here (no CUDA graphs)."""
        return {"graph_step_ms": None, "graph_step_capture": None}


class GraphClock(EagerClock):
    """Each step timed as a CUDA-graph replay of that step alone (module doc).

    Args:
        timer: the CUDA-event timer; stream: the non-default stream to capture
            and replay on (``graph_replay.capture_stream``).
        replay: ``(steps, slots, run_step, stream) -> GraphReplay``; run_step:
            ``(step, slots) -> array``; release: gives the default pool's cached
            blocks back (``graph_replay.release_cached``), before the whole step
            is captured. Tests pass stand-ins.
    """

    kind = "graph"
    method = (f"CUDA graph: each step captured alone and replayed, device time (a step whose replay "
              f"takes under {GRAPH_TARGET_MS} ms captured as up to {MAX_GRAPH_CALLS} calls of itself, "
              f"sharing one launch); a step that cannot be captured called eagerly from Python")

    def __init__(self, timer, stream, *, replay=GraphReplay, run_step=execute_step, release=release_cached):
        super().__init__(timer, reason="", run_step=run_step)
        self.stream, self.replay, self.release = stream, replay, release

    @contextlib.contextmanager
    def _replay_of(self, steps, slots: dict):
        """A replay of ``steps`` built on the clock's stream, used inside
        ``with stream:``; on exit it is closed and ``slots`` holds again the
        arrays it held before (the replay's pools die with it)."""
        saved = {st.node: slots[st.node] for st in steps}
        self.timer.synchronize()  # the eager work on the default stream wrote the values read here
        replay = None
        try:
            with self.stream:
                replay = self.replay(steps, slots, self.run_step, self.stream)
                yield replay
                self.stream.synchronize()
        finally:
            if replay is not None:
                replay.close()
            slots.update(saved)

    def _replayed_ms(self, steps, slots: dict, warmup: int, repeat: int) -> tuple[float | None, str | None]:
        """``(median ms of one replay of steps, None)``, or ``(None, why)`` when
        not every step was captured."""
        try:
            with self._replay_of(steps, slots) as replay:
                if replay.captured_steps != len(steps):
                    return None, next(iter(replay.eager_reasons.values()), "not captured")
                return median_ms(self.timer, replay, warmup, repeat, "profile (CUDA graph)"), None
        except Exception as e:  # e.g. out of device memory in the private pool: timed eagerly
            return None, f"graph replay failed: {error_line(e)}"

    def step(self, st, slots: dict, *, warmup: int, repeat: int) -> StepTime:
        """``st`` timed as a graph replay of ``k`` calls (:func:`graph_calls`)
        divided by ``k``; eagerly, with the reason, when it cannot be captured."""
        one, why = self._replayed_ms([st], slots, warmup, repeat)
        if why is not None:
            return attrs.evolve(super().step(st, slots, warmup=warmup, repeat=repeat), eager_reason=why)
        calls = graph_calls(one)  # a short replay is mostly the graph's launch: share it (module doc)
        if calls > 1:
            many, why = self._replayed_ms([st] * calls, slots, warmup, repeat)
            if why is None:  # else: k calls would not capture together, one did
                return StepTime(many / calls, "graph", calls)
        return StepTime(one, "graph", 1)

    def whole_graph(self, steps, slots: dict, *, warmup: int, repeat: int) -> dict:
        """``{'graph_step_ms': median ms of one replay of every step in order,
        'graph_step_capture': GraphReplay.summary()}`` (steps, captured steps,
        graphs, eager steps and their reasons, pool bytes); when the build or a
        replay raises, ``graph_step_ms`` is None and the capture ``{'error'}``.
        While the replay lives every value is held twice (in ``slots`` and in
        its private pools), as during the build of the ``+graph`` column's replays."""
        self.release()  # room for the private pools: the default pool's cache is not theirs
        try:
            with self._replay_of(steps, slots) as replay:
                ms = median_ms(self.timer, replay, warmup, repeat, "step (CUDA graphs)")
                return {"graph_step_ms": ms, "graph_step_capture": replay.summary()}
        except Exception as e:  # e.g. out of device memory: the eager figures stand alone
            return {"graph_step_ms": None, "graph_step_capture": {"error": error_line(e)}}


def step_clock(device: str, timer) -> EagerClock:
    """The clock of ``device``'s profile: a :class:`GraphClock` on a new capture
    stream on ``'cuda'``, an :class:`EagerClock` on the CPU."""
    if device == "cuda":
        return GraphClock(timer, capture_stream())
    return EagerClock(timer, reason=f"device {device}: no CUDA graphs")


def timing_summary(clock: EagerClock, nodes) -> dict:
    """``{'clock': 'graph' or 'eager', 'method', 'graph_steps', 'eager_steps',
    'eager_reasons': {reason: steps}}`` of a profile's nodes (each with
    ``timed`` and ``eager_reason``) timed by ``clock``."""
    eager = [n for n in nodes if n["timed"] == "eager"]
    return {"clock": clock.kind, "method": clock.method, "graph_steps": len(nodes) - len(eager),
            "eager_steps": len(eager), "eager_reasons": dict(Counter(n["eager_reason"] for n in eager))}


__all__ = ["GRAPH_TARGET_MS", "MAX_GRAPH_CALLS", "graph_calls", "median_ms", "StepTime", "EagerClock",
           "GraphClock", "step_clock", "timing_summary"]
