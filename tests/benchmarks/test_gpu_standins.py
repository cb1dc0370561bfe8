"""The GPU-only paths of the benchmark (CUDA-event timer, CuPy pool high-water mark,
the cuBLAS peak) run here against a NumPy stand-in for ``cupy``, so their control flow and
arithmetic are tested on the CPU; the real bindings are exercised on the GPU machine."""

from __future__ import annotations

import json
import sys
import time
import types

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends.cuda import matmul_peak
from opgraph.benchmarks import memory, peak, timer
from opgraph.benchmarks.protocol import random_feeds, training_graph


class FakeEvent:
    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


class FakeStream:
    def __init__(self):
        self.syncs = 0

    def synchronize(self):
        self.syncs += 1


class FakePool:
    """Pool whose in-use bytes start at ``resident`` and whose high-water mark ends at ``high``."""

    def __init__(self, resident, high):
        self.resident, self.high, self.freed = resident, high, 0

    def used_bytes(self):
        return self.resident

    def total_bytes(self):
        return self.high

    def free_all_blocks(self):
        self.freed += 1


class FakeMemoryHook:
    """``cupy.cuda.MemoryHook``: while entered, the fake module's ``hook`` (a step calls it)."""

    module = None

    def __enter__(self):
        FakeMemoryHook.module.hook = self
        return self

    def __exit__(self, *exc):
        FakeMemoryHook.module.hook = None


class FakeRandomState:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def standard_normal(self, shape, dtype):
        return self.rng.standard_normal(shape, dtype=dtype)


@pytest.fixture
def fake_cupy(monkeypatch):
    stream, pool = FakeStream(), FakePool(1000, 51000)
    cuda = types.SimpleNamespace(Event=FakeEvent, get_current_stream=lambda: stream,
                                 get_elapsed_time=lambda s, e: (e.t - s.t) * 1e3, MemoryHook=FakeMemoryHook)
    fake = types.SimpleNamespace(
        cuda=cuda, get_default_memory_pool=lambda: pool, random=types.SimpleNamespace(RandomState=FakeRandomState),
        float32=np.float32, float16=np.float16, uint16=np.uint16, uint32=np.uint32, empty=np.empty,
        linalg=np.linalg, stream=stream, pool=pool)
    fake.hook = None
    monkeypatch.setattr(FakeMemoryHook, "module", fake)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def test_cuda_event_timer_queues_all_calls_then_syncs_once(fake_cupy):
    t = timer.CudaEventTimer()
    calls = []
    times = t.measure(lambda: (calls.append(1), time.sleep(0.002)), label="x", repeat=3)
    assert len(calls) == 3 and len(times) == 3 and all(ms >= 1.5 for ms in times)
    assert fake_cupy.stream.syncs == 1  # before the loop; the last event is waited on after
    t.synchronize()
    assert fake_cupy.stream.syncs == 2


def test_allocated_peak_by_hook_and_pool_high_water_mark_minus_resident(fake_cupy, tiny):
    tg = training_graph(tiny)
    exe = og.compile(tg.outputs)
    first, second = exe.steps[0], exe.steps[1]

    def allocating(step, events):  # the pool's events while the step's kernel runs
        def kernel(*a):
            for kind, ptr, size in events:
                getattr(fake_cupy.hook, kind + "_postprocess")(device_id=0, mem_size=size, mem_ptr=ptr,
                                                               pmem_id=0, **({"size": size} if kind == "malloc" else {}))
            return step.kernel(*a)
        return attrs.evolve(step, kernel=kernel)

    exe.steps = [allocating(first, [("malloc", 7, 512), ("malloc", 8, 2048)]),
                 allocating(second, [("free", 7, 512), ("free", 99, 4096), ("malloc", 9, 1024)]),
                 *exe.steps[2:]]
    outs, info = memory.run_and_measure(exe, random_feeds(tiny), "cuda")
    assert len(outs) == len(tg.outputs) and fake_cupy.hook is None  # the hook left after the run
    assert info["allocated_peak_bytes"] == 3072  # 512 + 2048 at once, then 2048 + 1024
    assert info["pool_peak_bytes"] == 50000 and info["pool_resident_bytes"] == 1000
    assert fake_cupy.pool.freed == 1 and info["live_peak_bytes"] > 0
    rec = memory.memory_record(exe.report, info, "cuda")
    assert rec["measured_peak_bytes"] == 3072 and rec["reserved_peak_bytes"] == 50000
    assert "MemoryHook" in rec["method"] and "high-water" in rec["method"]
    plan = exe.report.memory  # the memory pass's in-place plan and peak step, carried over
    assert (rec["peak_step"], rec["inplace_steps"], rec["inplace_bytes"]) == \
        (plan["peak_step"], plan["inplace"], plan["inplace_bytes"])
    assert rec["peak_step"] in {st.name for st in exe.steps}


def test_allocation_counter_ignores_blocks_allocated_before():
    c = memory.AllocationCounter()
    c.malloc(1, 512)
    c.free(2)  # allocated before counting began
    c.malloc(3, 1024)
    c.free(1)
    assert (c.in_use, c.peak) == (1024, 1536)


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-6), ("bf16", 1e-2), ("fp16", 1e-3)])
def test_peak_operands_and_flow(fake_cupy, monkeypatch, precision, tol):
    a, b, a32, b32 = matmul_peak._operands(fake_cupy, 64, precision)
    ref = np.random.default_rng(0)
    x = ref.standard_normal((64, 64), dtype=np.float32)
    # storage rounding only: bf16 keeps the top 16 bits (truncation, relative error < 2^-7)
    assert np.max(np.abs(a32 - x) / np.maximum(np.abs(x), 1e-30)) < tol
    if precision == "bf16":
        assert a.dtype == np.uint16 and np.array_equal(a32.view(np.uint32) & 0xFFFF, np.zeros((64, 64)))

    def numpy_gemm(cupy, a, b, c, n, prec):  # what cuBLAS computes, in row-major terms
        up = (lambda v: (v.astype(np.uint32) << 16).view(np.float32)) if prec == "bf16" else \
            (lambda v: v.astype(np.float32))
        c[...] = up(b) @ up(a)

    monkeypatch.setattr(matmul_peak, "_gemm", numpy_gemm)
    out = matmul_peak.measure_matmul_peak(precision, n=128, repeat=2)
    assert out["tflops"] > 0 and out["check_rel_error"] < 1e-5 and precision in out["method"]


def test_peak_refuses_a_wrong_binding(fake_cupy, monkeypatch):
    monkeypatch.setattr(matmul_peak, "_gemm", lambda cupy, a, b, c, n, p: c.fill(1.0))
    with pytest.raises(RuntimeError, match="cublasGemmEx check failed"):
        matmul_peak.measure_matmul_peak("tf32", n=64, repeat=1)
    res = peak.measure_peaks("cuda", ["tf32"])
    assert res["tf32"]["tflops"] is None and "check failed" in res["tf32"]["error"]


def test_trace_on_the_gpu_path_uses_a_cuda_event_pair_per_step(fake_cupy, tiny):
    """``--trace`` on cuda: each step between two CUDA events on the current
    stream, one synchronisation at the end, device times from an event before
    the first step, and the host's launch spans beside them."""
    from opgraph.benchmarks.protocol import schedule
    from opgraph.benchmarks.trace import GPU_TID, HOST_TID, TraceCollector

    tg = training_graph(tiny)
    exe = og.compile(tg.outputs)
    sched = schedule(exe, tg)
    slots = exe.feed(random_feeds(tiny))
    for st in sched.steps:  # values every step reads, as after the timed loops
        slots[st.node] = st.kernel(st.ctx, st.op.op, *[slots[a] for a in st.args])
    syncs = fake_cupy.stream.syncs
    trace = TraceCollector()
    trace.add("tiny fp32 gemm", sched, slots, "cuda")
    assert fake_cupy.stream.syncs == syncs + 1  # before the step; the last event is waited on after
    events = [e for e in trace.events if e["ph"] == "X"]
    gpu = [e for e in events if e["tid"] == GPU_TID]
    host = [e for e in events if e["tid"] == HOST_TID]
    assert [e["args"]["node"] for e in gpu] == [st.name for st in sched.steps] == [e["args"]["node"] for e in host]
    starts = [e["ts"] for e in gpu]
    assert starts == sorted(starts) and starts[0] >= 0 and all(e["dur"] >= 0 for e in gpu)
    for a, b in zip(gpu, gpu[1:]):  # queued back to back: no overlap on the stream
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    names = {m["args"]["name"] for m in trace.events if m["name"] == "thread_name"}
    assert names == {"gpu (CUDA events)", "host (launch)"}
    json.loads(trace.render())
