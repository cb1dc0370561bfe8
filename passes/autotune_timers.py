"""The autotune pass's timers: how one candidate's runs are timed, per device and clock.

A :class:`Timer` runs a candidate's kernel and returns its durations; the pass
asks it for one timed run, then warm-up and timed runs (``measure``), and
never looks at how it times them. Here: CPU wall time
(:class:`PerfCounterTimer`), CUDA events around each call
(:class:`CudaEventTimer`, the policy's ``tune_clock = 'launch'``), and
:func:`default_timer`, which picks the device backend's own timer first
(``DeviceSupport.tune_timer``: the held-stream ``'device'`` clock,
``backends/cuda/held_stream.py``). Separate from the pass because tests and
benchmarks use the timers alone, and a backend supplies its own through the
registry without knowing the pass.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from opgraph.backends.registry import device_support


class Timer(Protocol):
    """Times one candidate: ``measure(fn, label=..., warmup=..., repeats=...)``
    calls ``fn`` ``warmup`` times untimed, then returns ``repeats`` durations
    in seconds. ``label`` (``'winograd[tile=2]'``) lets a test stub answer
    known times per candidate. Optional: ``synchronize()`` (``autotune_clock``)."""

    def measure(self, fn: Callable[[], object], *, label: str, warmup: int,
                repeats: int) -> list[float]: ...


class PerfCounterTimer:
    """CPU wall time with ``time.perf_counter`` around each call."""

    clock_name = "wall"

    def measure(self, fn, *, label, warmup, repeats):
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out


class CudaEventTimer:
    """GPU time between two CUDA events recorded around each call (CuPy): the
    policy's ``tune_clock = 'launch'``. The GPU reaches the first event before
    the host has launched the call's kernels, so a kernel shorter than its
    launch is timed as the launch (``backends/cuda/held_stream.py``)."""

    clock_name = "launch (events around each call)"

    def measure(self, fn, *, label, warmup, repeats):
        import cupy

        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeats):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
        return out

    def synchronize(self) -> None:
        """Wait for the work queued on the current stream."""
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def take_waits(timer) -> list[str]:
    """The labels a held-stream timer timed by the launch clock on the node just
    tuned (:class:`backends.cuda.held_stream.HeldStreamTimer`), emptied so that
    the next node's candidates are held again; [] for other timers."""
    waits = getattr(timer, "waits", None)
    if not waits:
        return []
    out = sorted(waits)
    waits.clear()
    return out


def default_timer(device: str, clock: str = "device") -> Timer:
    """Autotune's timer for ``device`` and the policy's ``tune_clock``: the
    device backend's (``DeviceSupport.tune_timer``: on cuda, ``'device'`` times
    each candidate's kernels alone), else CUDA events around each call on
    ``'cuda'`` and ``time.perf_counter`` elsewhere."""
    support = device_support()
    timer = support.tune_timer(device, clock) if support.tune_timer else None
    if timer is not None:
        return timer
    return CudaEventTimer() if device == "cuda" else PerfCounterTimer()


__all__ = ["Timer", "PerfCounterTimer", "CudaEventTimer", "take_waits", "default_timer"]
