"""Clocks of ``opgraph-bench``: milliseconds per call, on the CPU or a GPU.

A timer runs ``fn`` ``repeat`` times and returns the duration of each call
in milliseconds:

* :class:`CpuTimer`: ``time.perf_counter`` (a monotonic clock) read before
  and after each call; the work is synchronous NumPy, so wall time is the
  work's time.
* :class:`CudaEventTimer`: two CUDA events (``cupy.cuda.Event``) recorded on
  the current stream around each call, all calls queued back to back and the
  stream synchronised once at the end, as the seed's loop of 10 calls
  followed by ``cutorch.synchronize()``. The elapsed time between a call's
  two events is the device time of that call, including any gap in which the
  GPU waited for Python to queue the next kernel (a real cost of a
  Python-driven executor, so it is kept).

Statistics follow the seed (``benchmark.lua`` divided one loop by its
length, i.e. the mean); we keep each call's time so that the median and the
minimum can be reported too (:class:`Timing`).

Tests pass a stub with the same ``measure`` / ``synchronize`` methods.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Protocol

import attrs

from .stability import spread


class Timer(Protocol):
    """What the protocol needs of a clock."""

    #: Human-readable description of the clock (goes into every result file).
    clock: str

    def measure(self, fn: Callable[[], object], *, label: str, repeat: int) -> list[float]:
        """Call ``fn`` ``repeat`` times; milliseconds of each call. ``label``
        names what is timed (``'forward'``, ``'conv2/backward_filter'``)."""

    def synchronize(self) -> None:
        """Wait until all queued work is done."""


def _check_repeat(repeat: int) -> None:
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat={repeat!r}: must be an int >= 1")


class CpuTimer:
    """``time.perf_counter`` around each call (monotonic, sub-microsecond)."""

    clock = "time.perf_counter around each call (monotonic wall clock)"

    def measure(self, fn, *, label: str = "", repeat: int = 1) -> list[float]:
        _check_repeat(repeat)
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    def synchronize(self) -> None:
        return None


class CudaEventTimer:
    """CUDA events around each call on the current CuPy stream (see module doc)."""

    clock = "CUDA events (cupy.cuda.Event) around each call on the current stream"

    def __init__(self):
        import cupy  # only constructed on a machine with a GPU

        self._cupy = cupy

    def measure(self, fn, *, label: str = "", repeat: int = 1) -> list[float]:
        _check_repeat(repeat)
        cupy = self._cupy
        stream = cupy.cuda.get_current_stream()
        stream.synchronize()  # earlier work must not leak into the first call
        events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(repeat)]
        for start, end in events:
            start.record(stream)
            fn()
            end.record(stream)
        events[-1][1].synchronize()
        return [float(cupy.cuda.get_elapsed_time(s, e)) for s, e in events]

    def synchronize(self) -> None:
        self._cupy.cuda.get_current_stream().synchronize()


#: ``--repeat auto`` (:class:`AdaptiveTimer`): calls per round (and the fewest per loop),
#: the relative spread (IQR / median) that ends a loop, its wall-clock cap in seconds
#: and its most calls.
AUTO_ROUND, AUTO_THRESHOLD, AUTO_MAX_SECONDS, AUTO_MAX_CALLS = 5, 0.05, 5.0, 1000


class AdaptiveTimer:
    """``--repeat auto``: a clock that repeats each loop until its median is
    stable, in the manner of ``torch.utils.benchmark.Timer.adaptive_autorange``
    (which stops once the IQR is within ``threshold`` of the median or
    ``max_run_time`` has passed). The rule:

    1. time ``round`` calls (the loop's ``repeat``, :data:`AUTO_ROUND` from the
       driver) on the wrapped clock;
    2. stop when the interquartile range of every call so far is at most
       ``threshold`` (:data:`AUTO_THRESHOLD`, 5 %) of their median;
    3. else time another round, unless the loop has run ``max_seconds``
       (:data:`AUTO_MAX_SECONDS`, wall clock, warm-up excluded) or
       ``max_calls``: then stop with what it has (its spread says how far it
       got, and the column is flagged when that is above 10 %).

    Each loop's ``times_ms`` hold all its calls, so their number shows what it took.
    """

    def __init__(self, timer: Timer, *, threshold: float = AUTO_THRESHOLD,
                 max_seconds: float = AUTO_MAX_SECONDS, max_calls: int = AUTO_MAX_CALLS):
        self.timer, self.threshold = timer, threshold
        self.max_seconds, self.max_calls = max_seconds, max_calls
        self.clock = f"{timer.clock}; --repeat auto: {self.rule()}"

    def rule(self) -> str:
        return (f"rounds of the loop's repeat count until the IQR is within {self.threshold:.0%} of the "
                f"median, at most {self.max_seconds:g} s or {self.max_calls} calls per loop")

    def measure(self, fn, *, label: str = "", repeat: int = AUTO_ROUND) -> list[float]:
        _check_repeat(repeat)
        start, times = time.perf_counter(), []
        while True:
            times += self.timer.measure(fn, label=label, repeat=repeat)
            rel = spread(times)["relative"]
            if rel is not None and rel <= self.threshold:
                return times
            if time.perf_counter() - start >= self.max_seconds or len(times) + repeat > self.max_calls:
                return times

    def synchronize(self) -> None:
        self.timer.synchronize()


def make_timer(device: str) -> Timer:
    """The clock of ``device``: CUDA events on ``'cuda'``, perf_counter on ``'cpu'``."""
    return CudaEventTimer() if device == "cuda" else CpuTimer()


def time_calls(fn: Callable[[], object], *, warmup: int, repeat: int,
               device: str = "cpu") -> list[float]:
    """Milliseconds of each of ``repeat`` calls of ``fn`` after ``warmup``
    untimed calls, on ``device``'s clock (:func:`make_timer`: CUDA events on
    ``'cuda'``, ``time.perf_counter`` on the CPU).

    Raises:
        ValueError: ``warmup < 0`` or ``repeat < 1``.
    """
    if warmup < 0:
        raise ValueError(f"warmup={warmup}: must be >= 0")
    _check_repeat(repeat)
    for _ in range(warmup):
        fn()
    return make_timer(device).measure(fn, repeat=repeat)


def replayed_times_per_call(fn: Callable[[], object], calls: int, *, warmup: int = 3,
                            repeat: int = 20) -> list[float]:
    """Milliseconds per call of ``fn`` on the GPU as a replayed CUDA graph runs it, one per timed
    replay: ``fn`` once eagerly (compiled kernels, plans and pool blocks made outside the
    capture), then ``calls`` of it captured into one graph on a non-blocking stream, the graph
    replayed ``warmup`` times untimed and ``repeat`` times between CUDA events
    (:func:`time_calls`), each replay's time divided by ``calls``: a kernel's device time with the
    launch gaps of a graph, no Python dispatch. What the kernel benchmarks of ``scripts/`` time.

    Raises:
        ValueError: ``calls < 1``, ``warmup < 0`` or ``repeat < 1``.
    """
    if calls < 1:
        raise ValueError(f"calls={calls}: must be >= 1")
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            fn()
        graph = stream.end_capture()
        times = time_calls(lambda: graph.launch(stream), warmup=warmup, repeat=repeat, device="cuda")
    return [t / calls for t in times]


def replayed_ms_per_call(fn: Callable[[], object], calls: int, *, warmup: int = 3, repeat: int = 20) -> float:
    """The median of :func:`replayed_times_per_call` (same arguments, same errors)."""
    return statistics.median(replayed_times_per_call(fn, calls, warmup=warmup, repeat=repeat))


@attrs.frozen
class Timing:
    """Per-call times of one timed loop, in milliseconds per mini-batch."""

    times_ms: tuple[float, ...] = attrs.field(converter=tuple)

    @times_ms.validator
    def _nonempty(self, attribute, value):
        if not value:
            raise ValueError("times_ms: a timing needs at least one call")

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def mean_ms(self) -> float:
        """The seed's figure: the loop's time divided by its length."""
        return statistics.fmean(self.times_ms)

    def as_dict(self) -> dict:
        """Median, min, mean, the spread (quartiles, IQR, max: :func:`stability.spread`)
        and every call's time."""
        sp = spread(self.times_ms)
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "mean_ms": self.mean_ms,
                "q1_ms": sp["q1_ms"], "q3_ms": sp["q3_ms"], "iqr_ms": sp["iqr_ms"], "max_ms": sp["max_ms"],
                "times_ms": list(self.times_ms)}

    @classmethod
    def from_dict(cls, d: dict) -> "Timing":
        return cls(d["times_ms"])


__all__ = ["Timer", "CpuTimer", "CudaEventTimer", "AdaptiveTimer", "AUTO_ROUND", "AUTO_THRESHOLD",
           "AUTO_MAX_SECONDS", "AUTO_MAX_CALLS", "make_timer", "time_calls", "replayed_times_per_call",
           "replayed_ms_per_call", "Timing"]
