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
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "mean_ms": self.mean_ms,
                "times_ms": list(self.times_ms)}

    @classmethod
    def from_dict(cls, d: dict) -> "Timing":
        return cls(d["times_ms"])


__all__ = ["Timer", "CpuTimer", "CudaEventTimer", "make_timer", "time_calls", "Timing"]
