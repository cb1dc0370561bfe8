"""The benchmark's memory figures on the GPU (benchmarks/memory.py): the
allocation counter hooked into CuPy's pool against what the run must have
held (its live buffers) and what the pool reserved."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.backends.device import cuda_status
from opgraph.benchmarks import memory
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import random_feeds, training_graph

GPU_OK, GPU_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_OK, reason=GPU_WHY)]


def test_allocated_peak_lies_between_the_live_buffers_and_the_reserved_pool(cp):
    model = build("alexnet", batch=4)
    tg = training_graph(model)
    exe = og.compile(tg.outputs, device="cuda")
    feeds = {k: cp.asarray(v) for k, v in random_feeds(model).items()}
    _, info = memory.run_and_measure(exe, feeds, "cuda")
    # every live buffer of the run came from the pool during it; the pool holds at least what it lent
    assert info["live_peak_bytes"] <= info["allocated_peak_bytes"] <= info["pool_peak_bytes"]
    big = cp.empty(64 << 20, dtype=cp.uint8)  # allocated before counting began
    counter = memory.AllocationCounter()
    with memory.counting_hook(counter):
        extra = cp.empty(3 << 20, dtype=cp.uint8)
        del extra, big  # big's free is ignored: it was never counted
    assert 3 << 20 <= counter.peak < 64 << 20 and counter.in_use == 0
