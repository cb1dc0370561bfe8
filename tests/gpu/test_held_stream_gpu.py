"""Autotune's held-stream clock (``backends/cuda/held_stream.py``) on the GPU:
it measures a kernel of known length without the host time spent before its
launch, where two events around the call measure both; a call that waits for
the device falls back to the event pair instead of hanging.

The kernel spins on the GPU's global timer for a set time, so what the clock
should read is known; the bounds are loose (a clock, not a speed target)."""

from __future__ import annotations

import statistics
import time

import pytest

from opgraph.backends.device import cuda_status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

_SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""

KERNEL_S = 100e-6
HOST_S = 2e-3


def _late_kernel():
    """A call that spends HOST_S on the host, then launches a KERNEL_S kernel."""
    import cupy
    import numpy as np

    spin = cupy.RawKernel(_SPIN, "spin")

    def call():
        time.sleep(HOST_S)
        spin((1,), (1,), (np.uint64(int(KERNEL_S * 1e9)),))
    return call


def test_the_held_clock_reads_the_kernel_and_the_launch_clock_the_host_too():
    from opgraph.backends.cuda.held_stream import HeldStreamTimer
    from opgraph.passes.autotune import CudaEventTimer

    call = _late_kernel()
    held = HeldStreamTimer().measure(call, label="late", warmup=1, repeats=10)
    launch = CudaEventTimer().measure(call, label="late", warmup=1, repeats=10)
    assert len(held) == len(launch) == 10
    assert KERNEL_S * 0.95 <= statistics.median(held) <= KERNEL_S * 3, held
    assert statistics.median(launch) >= HOST_S, launch


def test_a_call_that_waits_for_the_device_is_timed_by_the_event_pair():
    import cupy
    from opgraph.backends.cuda.held_stream import HeldStreamTimer

    call = _late_kernel()

    def waits():
        call()
        cupy.cuda.get_current_stream().synchronize()

    timer = HeldStreamTimer(hold_limit_ns=20_000_000)
    t0 = time.perf_counter()
    times = timer.measure(waits, label="waits", warmup=0, repeats=4)
    assert time.perf_counter() - t0 < 2.0  # the hold ran out once, then no hold at all
    assert timer.waits == {"waits"} and len(times) == 4
    assert all(t >= HOST_S for t in times), times
