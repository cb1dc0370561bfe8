"""Where the PyTorch peer runs: its clock, memory counters and CUDA-graph capture.

:class:`CpuPeerDevice` and :class:`CudaPeerDevice` give :mod:`.peer_run`
one interface, so that its control flow (which variant runs what, what is
checked, what is recorded) is the same on both devices and can be tested on
the CPU with a stand-in for the CUDA one (``tests/benchmarks/
test_peer_variants.py``).

The whole-step CUDA graph (``torch+graph``, ``torch-compile+graph``) follows
PyTorch's documented recipe for capturing a training step
(``torch.cuda.graphs``, "Whole-network capture"): warm-up iterations on a
side stream (so that lazily created state, cuDNN's benchmark choices and
``torch.compile``'s compiled code exist before capture, and the capture sees
no first-call work), then one step captured with ``torch.cuda.graph`` into a
private memory pool, then :meth:`CudaPeerDevice.capture`'s ``replay``
relaunches it. A replay rewrites the tensors the capture returned (the
static outputs) in place.
"""

from __future__ import annotations

import time
from typing import Callable

from .timer import CpuTimer

#: Warm-up steps on the side stream before the capture (PyTorch's example uses 3).
CAPTURE_WARMUP = 3


class CpuPeerDevice:
    """The CPU: ``time.perf_counter``, no allocation counter, no CUDA graph."""

    name = "cpu"

    def __init__(self, torch):
        self.torch = torch
        self.timer = CpuTimer()

    def graph_unavailable(self) -> str | None:
        """Why a whole-step CUDA graph cannot run here (None where it can)."""
        return "the training step as a CUDA graph (torch.cuda.graph) needs a GPU (this run: --device cpu)"

    def measure_memory(self, step: Callable[[], object]) -> dict:
        """Peak bytes of one ``step`` (not counted on the CPU)."""
        return {"measured_peak_bytes": None, "reserved_peak_bytes": None}

    def capture(self, step: Callable[[], object]):
        raise RuntimeError(self.graph_unavailable())

    def release(self) -> None:
        return None

    def versions(self) -> dict:
        return {"torch": self.torch.__version__, "cudnn": None}


class TorchCudaTimer:
    """``torch.cuda.Event`` pairs around each call on the current stream, all
    calls queued back to back, one synchronisation at the end (as
    :class:`.timer.CudaEventTimer`)."""

    clock = "CUDA events (torch.cuda.Event) around each call"

    def __init__(self, torch):
        self.torch = torch

    def measure(self, fn, *, label: str = "", repeat: int = 1) -> list[float]:
        torch = self.torch
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeat)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [float(s.elapsed_time(e)) for s, e in events]

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


class CudaPeerDevice:
    """A GPU: CUDA events, ``torch.cuda`` memory statistics, whole-step CUDA graphs."""

    name = "cuda"

    def __init__(self, torch):
        self.torch = torch
        self.timer = TorchCudaTimer(torch)
        torch.backends.cudnn.benchmark = True

    def graph_unavailable(self) -> str | None:
        return None

    def measure_memory(self, step: Callable[[], object]) -> dict:
        """``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over one
        ``step``, minus what was allocated / reserved before (the reserved
        figure starts from what is in use, as CuPy's pool figure does)."""
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before, before_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return {"measured_peak_bytes": torch.cuda.max_memory_allocated() - before,
                "reserved_peak_bytes": torch.cuda.max_memory_reserved() - before_reserved}

    def capture(self, step: Callable[[], object]):
        """``step`` captured once (module docstring).

        Returns:
            ``(replay, static, seconds, memory)``: ``replay()`` relaunches the
            graph; ``static`` is what the captured ``step`` returned (rewritten
            by each replay); ``seconds`` the wall time of the warm-up and the
            capture; ``memory`` the bytes allocated and reserved during the
            capture (the graph's private pool: what the replays keep).
        """
        torch = self.torch
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUP):
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        before, before_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = step()
        torch.cuda.synchronize()
        memory = {"measured_peak_bytes": torch.cuda.max_memory_allocated() - before,
                  "reserved_peak_bytes": torch.cuda.max_memory_reserved() - before_reserved}
        return graph.replay, static, time.perf_counter() - t0, memory

    def release(self) -> None:
        """Give cached blocks back (to CuPy's pool, for the next columns)."""
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def versions(self) -> dict:
        return {"torch": self.torch.__version__, "cudnn": self.torch.backends.cudnn.version()}


def peer_device(torch, device: str):
    """The :class:`CpuPeerDevice` or :class:`CudaPeerDevice` of ``device``."""
    return CudaPeerDevice(torch) if device == "cuda" else CpuPeerDevice(torch)


__all__ = ["CAPTURE_WARMUP", "CpuPeerDevice", "CudaPeerDevice", "TorchCudaTimer", "peer_device"]
