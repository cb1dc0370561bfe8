"""Fixtures of the GPU tests.

Test modules here mark themselves ``gpu`` and skip at collection when CuPy
or a GPU is absent (``requires_gpu`` below reads ``device.cuda_status``, which
never raises), so the whole folder collects cleanly on a CPU-only machine.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

GPU_OK, GPU_WHY = cuda_status()


@pytest.fixture(scope="session")
def cp():
    """The ``cupy`` module (only reached when the test is not skipped)."""
    import cupy
    return cupy


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: fresh data per test, reproducible."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def rel_err(out, ref) -> float:
    """``||out - ref|| / ||ref||`` in float64 on the host; inf when out holds a
    NaN that ref does not (NaN never passes)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if np.isnan(out).any() and not np.isnan(ref).any():
        return float("inf")
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (den if den else 1.0))


@pytest.fixture
def relerr():
    return rel_err


def channels_last(cp, a):
    """The NCHW-shaped view of an NHWC-contiguous copy of ``a``."""
    return cp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.fixture
def to_cl(cp):
    return lambda a: channels_last(cp, a)


@pytest.fixture
def replay_phases(cp):
    """``run(runner) -> (replays, stream)``: a ``benchmarks.protocol.PhaseRunner``'s
    phases captured as CUDA graphs on a new capture stream, each replayed once
    in order and the stream synchronised, so that ``runner.slots`` holds one
    replay's values."""
    from opgraph.benchmarks.protocol import PHASES
    from opgraph.graph_replay import capture_stream

    def run(runner):
        stream = capture_stream()
        with stream:
            replays = runner.graph_phases(stream)
            for p in PHASES:
                replays[p]()
            stream.synchronize()
        return replays, stream
    return run


@pytest.fixture
def captured_replay(cp):
    """``run(fn, change) -> (out, keep)``: ``fn()`` called once eagerly (kernels
    compiled and loaded outside the capture), then captured into a CUDA graph on
    a non-blocking stream with a private memory pool (the device synchronised
    first); ``change()`` runs on that stream after
    the capture (e.g. writes the input in place), then the graph is replayed.
    ``out`` is what ``fn`` returned during the capture, holding the replay's
    result; ``keep`` (the graph and its pool) must outlive every use of it."""
    def run(fn, change):
        fn()
        # the capture stream is non-blocking: it must not overtake work enqueued
        # on the default stream (inputs made by the caller)
        cp.cuda.Device().synchronize()
        stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
        with stream, cp.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            try:
                out = fn()
            finally:
                graph = stream.end_capture()
            change()
            graph.launch(stream)
            stream.synchronize()
        return out, (graph, pool)
    return run
