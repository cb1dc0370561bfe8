"""Autotune's GPU clock: the device time of a candidate alone, not the host's
time to launch it.

Two CUDA events recorded around one call measure from the first event to the
second as the GPU sees them. When the call's kernels are short, the GPU
reaches the first event at once and then waits for Python and the cuDNN
frontend to launch the kernel: on the H200 a DenseNet-121 1x1 convolution
timed 71 us that way, against 12 us for the same kernel replayed in a CUDA
graph (``docs/performance.md``, eleventh session), and its ten cuDNN engines
all timed within 15 % of each other, so the tuner's ranking was the host's
noise. The step it tunes for is replayed as CUDA graphs, with no host between
kernels.

:class:`HeldStreamTimer` holds the stream first: a one-thread kernel
(``opgraph_hold_stream``) spins until the host writes a release flag in
pinned host memory. Behind it the host queues the events and ``n`` calls,
then releases the flag; the GPU runs the calls back to back, and each
interval between two events is one call's device time. This is the
"blocking kernel" of NVIDIA's nvbench (``nvbench/blocking_kernel.cuh``,
described in its docs; no code taken).

A call that waits for the device itself (a synchronising copy, a host read
of a device value) would wait for the held stream: the kernel gives up after
:data:`HOLD_LIMIT_NS`, says so in a second flag, and the timer measures that
candidate with one pair of events per call instead (the launch clock), and
keeps doing so for its label until autotune moves to the next node. A host
that takes longer than the limit to queue a batch (a long pause) looks the
same and gets the same fallback. Where the hold kernel cannot run (it needs
compute capability 7.0 for ``__nanosleep``), every call is timed by the
launch clock (:attr:`HeldStreamTimer.unavailable` says why).
"""

from __future__ import annotations

import numpy as np

#: How long the hold kernel waits for the release, in nanoseconds: longer than
#: the host needs to queue :data:`BATCH` calls of any candidate (a cuDNN plan's
#: execute is tens of microseconds), short enough that a call that waits for
#: the device costs little before the fallback.
HOLD_LIMIT_NS = 50_000_000

#: Calls queued behind one hold: far below the device's launch queue (about a
#: thousand entries), which would block the host while the stream is held.
BATCH = 8

_SOURCE = r"""
extern "C" __global__ void opgraph_hold_stream(unsigned long long flags_address,
                                               unsigned long long limit_ns) {
    // flags[0]: the host's release; flags[1]: set here when the limit ran out
    volatile int* flags = (volatile int*)flags_address;
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (flags[0] == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > limit_ns) {
            flags[1] = 1;
            return;
        }
        __nanosleep(1000);
    }
}
"""


class HeldStreamTimer:
    """Device time of each call, queued behind a held stream (module doc).

    ``measure(fn, label=, warmup=, repeats=)`` calls ``fn`` ``warmup`` times,
    then returns ``repeats`` durations in seconds (autotune's ``Timer``
    protocol, ``passes/autotune.py``). ``clock_id`` names the clock in the
    autotune cache's keys, so decisions timed by another clock are not reused.
    """

    clock_id = "held-stream"
    clock_name = "device (held stream)"

    def __init__(self, hold_limit_ns: int = HOLD_LIMIT_NS, batch: int = BATCH):
        self.hold_limit_ns = int(hold_limit_ns)
        self.batch = int(batch)
        #: labels whose calls waited for the device, timed by the launch clock from then on;
        #: autotune empties it after each node (``passes/autotune.py``), so another node's
        #: candidates of the same label are held again
        self.waits: set[str] = set()
        self._kernel = self._flags = self._memory = None
        #: why the hold kernel cannot run here (it needs ``__nanosleep``: compute
        #: capability 7.0 or later), or None; every call is then timed by the launch clock
        self.unavailable: str | None = None

    def measure(self, fn, *, label, warmup, repeats):
        for _ in range(warmup):
            fn()
        out: list[float] = []
        while len(out) < repeats and label not in self.waits and self.unavailable is None:
            try:
                self._hold()
            except Exception as e:  # the hold kernel does not compile or launch on this device
                self.unavailable = f"{type(e).__name__}: {e}".splitlines()[0]
                break
            held = self._held_calls(fn, min(self.batch, repeats - len(out)))
            if held is None:  # the hold ran out: fn waits for the device
                self.waits.add(label)
                break
            out += held
        return out + self._launch_calls(fn, repeats - len(out))

    def synchronize(self) -> None:
        """Wait for the work queued on the current stream."""
        import cupy

        cupy.cuda.get_current_stream().synchronize()

    # ---- the device side: small methods, so a test can stand in for them
    def _held_calls(self, fn, n: int) -> list[float] | None:
        """``n`` calls queued behind the hold (:meth:`_hold`, launched just
        before); their seconds, or None when the hold ran out before the release."""
        events = [self._event() for _ in range(n + 1)]
        try:
            events[0].record()
            for e in events[1:]:
                fn()
                e.record()
        finally:  # never leave the stream held behind an exception
            released_late = self._release()
        events[-1].synchronize()
        if released_late:
            return None
        return [self._elapsed(a, b) for a, b in zip(events, events[1:])]

    def _launch_calls(self, fn, n: int) -> list[float]:
        """One pair of events around each call, as autotune timed before."""
        out = []
        for _ in range(n):
            start, end = self._event(), self._event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(self._elapsed(start, end))
        return out

    def _hold(self) -> None:
        import cupy

        if self._kernel is None:
            self._memory = cupy.cuda.alloc_pinned_memory(8)
            self._flags = np.frombuffer(self._memory, dtype=np.int32, count=2)
            self._kernel = cupy.RawKernel(_SOURCE, "opgraph_hold_stream")
        self._flags[:] = 0
        # with unified addressing (every 64-bit CUDA platform) a pinned host
        # pointer is valid on the device as it is
        self._kernel((1,), (1,), (np.uint64(self._memory.ptr), np.uint64(self.hold_limit_ns)))

    def _release(self) -> bool:
        """Release the hold; whether it had already run out (read after the
        stream finished: the kernel writes its flag before it returns)."""
        self._flags[0] = 1
        self.synchronize()
        return bool(self._flags[1])

    @staticmethod
    def _event():
        import cupy

        return cupy.cuda.Event()

    @staticmethod
    def _elapsed(start, end) -> float:
        import cupy

        return cupy.cuda.get_elapsed_time(start, end) / 1e3


__all__ = ["HeldStreamTimer", "HOLD_LIMIT_NS", "BATCH"]
