"""The peer's CUDA device (:class:`CudaPeerDevice`) against a stand-in for
``torch.cuda``: the capture recipe (warm-up on a side stream, then one captured
step), its memory figures, and the event timer; the real bindings run on the GPU
machine (``opgraph-bench --compare torch+graph``)."""

from __future__ import annotations

import contextlib
import time
import types

import pytest

from opgraph.benchmarks import peer_device
from opgraph.benchmarks.peer_device import CAPTURE_WARMUP, CpuPeerDevice, CudaPeerDevice


class FakeStream:
    def __init__(self, cuda, name):
        self.cuda, self.name = cuda, name

    def wait_stream(self, other):
        self.cuda.log.append(f"{self.name} waits for {other.name}")


class FakeEvent:
    def __init__(self, enable_timing=False):
        assert enable_timing

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


class FakeCuda:
    """What CudaPeerDevice uses of ``torch.cuda``; allocation figures it reads in turn."""

    Event = FakeEvent

    def __init__(self):
        self.log, self.current, self.capturing = [], None, False
        self.default = FakeStream(self, "default")
        self.allocated, self.peak, self.reserved, self.peak_reserved = 1000, 1000, 4000, 4000
        cuda = self

        class CUDAGraph:
            def replay(self):
                cuda.log.append("replay")

        self.CUDAGraph = CUDAGraph

    def Stream(self):
        return FakeStream(self, "side")

    def current_stream(self):
        return self.current or self.default

    @contextlib.contextmanager
    def stream(self, s):
        self.current = s
        try:
            yield
        finally:
            self.current = None

    @contextlib.contextmanager
    def graph(self, g):
        self.capturing = True
        self.log.append("capture begins")
        try:
            yield
        finally:
            self.capturing = False
            self.log.append("capture ends")

    def synchronize(self):
        self.log.append("sync")

    def memory_allocated(self):
        return self.allocated

    def memory_reserved(self):
        return self.reserved

    def reset_peak_memory_stats(self):
        self.peak, self.peak_reserved = self.allocated, self.reserved

    def max_memory_allocated(self):
        return self.peak

    def max_memory_reserved(self):
        return self.peak_reserved

    def empty_cache(self):
        self.log.append("empty_cache")


@pytest.fixture
def fake_torch():
    cudnn = types.SimpleNamespace(benchmark=False, version=lambda: 91900)
    return types.SimpleNamespace(cuda=FakeCuda(), backends=types.SimpleNamespace(cudnn=cudnn),
                                 __version__="2.13.0")


def test_capture_warms_up_on_a_side_stream_then_captures_one_step(fake_torch):
    cuda = fake_torch.cuda
    dev = CudaPeerDevice(fake_torch)
    assert fake_torch.backends.cudnn.benchmark is True and dev.graph_unavailable() is None
    steps = []

    def step():
        steps.append((cuda.current_stream().name, cuda.capturing))
        if cuda.capturing:  # the graph's private pool: what the replays keep
            cuda.peak += 300
            cuda.peak_reserved += 2048
        return ("y", "dw")

    replay, static, seconds, memory = dev.capture(step)
    assert steps == [("side", False)] * CAPTURE_WARMUP + [("default", True)]
    assert cuda.log[:2] == ["side waits for default", "default waits for side"]
    assert cuda.log.index("capture begins") > cuda.log.index("default waits for side")
    assert static == ("y", "dw") and seconds >= 0
    assert memory == {"measured_peak_bytes": 300, "reserved_peak_bytes": 2048}
    replay()
    assert cuda.log[-1] == "replay" and len(steps) == CAPTURE_WARMUP + 1  # a replay runs no Python step


def test_memory_of_one_step_and_the_versions(fake_torch):
    cuda = fake_torch.cuda
    dev = CudaPeerDevice(fake_torch)

    def step():
        cuda.peak += 5000
        cuda.peak_reserved += 8192

    assert dev.measure_memory(step) == {"measured_peak_bytes": 5000, "reserved_peak_bytes": 8192}
    assert "empty_cache" in cuda.log
    assert dev.versions() == {"torch": "2.13.0", "cudnn": 91900}


def test_the_event_timer_queues_every_call_then_syncs(fake_torch):
    calls = []
    times = peer_device.TorchCudaTimer(fake_torch).measure(lambda: calls.append(time.sleep(0.002)), repeat=3)
    assert len(calls) == len(times) == 3 and all(ms >= 1.5 for ms in times)
    assert fake_torch.cuda.log == ["sync", "sync"]  # before the loop and after it, not between calls


def test_the_cpu_has_no_graphs(fake_torch):
    dev = CpuPeerDevice(fake_torch)
    assert "needs a GPU" in dev.graph_unavailable()
    with pytest.raises(RuntimeError, match="needs a GPU"):
        dev.capture(lambda: None)
    assert dev.measure_memory(lambda: None) == {"measured_peak_bytes": None, "reserved_peak_bytes": None}
    assert isinstance(peer_device.peer_device(fake_torch, "cuda"), CudaPeerDevice)
