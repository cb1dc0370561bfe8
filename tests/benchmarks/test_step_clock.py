"""How ``--profile`` times a step alone (benchmarks/step_clock.py), on the CPU.

CUDA graphs cannot be captured here, so the graph clock runs on stand-ins: a
device clock that kernels and launches advance, a replay that records what
it captured (its launch costs :data:`LAUNCH_MS`, each captured call its
kernel's time, an eager step also :data:`HOST_MS` of dispatch) and a timer
that reads that clock. The tests check the choice of the timing method, the
division by the calls in a graph, the fallback to eager timing with its
reason, that ``slots`` is given back and each replay closed and dropped
before the next is built, and the bookkeeping of the profile record and its
table. The real capture is checked on a GPU (tests/gpu/test_profile_gpu.py).
"""

from __future__ import annotations

import weakref

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.benchmarks import profile as pf, step_clock as sc
from opgraph.benchmarks.profile_table import profile_tables
from opgraph.benchmarks.protocol import random_feeds, training_graph
from opgraph.executable import run_step
from opgraph.passes.policy import LoweringPolicy

from tinymodels import tiny_convnet

LAUNCH_MS, HOST_MS = 0.005, 0.05
POLICY = LoweringPolicy(exclude=["fused"])


class Device:
    """The stand-in device's clock (ms) and its kernels' times by step name."""

    def __init__(self, kernel_ms=None, default_ms=0.002):
        self.now, self.kernel_ms, self.default_ms = 0.0, dict(kernel_ms or {}), default_ms

    def kernel(self, st) -> float:
        return self.kernel_ms.get(st.name, self.default_ms)


class DeviceTimer:
    """A timer (benchmarks/timer.py's interface) reading the device clock."""

    clock = "stand-in device clock"

    def __init__(self, device):
        self.device = device

    def measure(self, fn, *, label="", repeat=1):
        out = []
        for _ in range(repeat):
            t0 = self.device.now
            fn()
            out.append(self.device.now - t0)
        return out

    def synchronize(self):
        return None


class Stream:
    def __init__(self):
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        return False

    def synchronize(self):
        return None


def eager_run(device):
    """run_step, plus the host's dispatch and the kernel on the device clock."""
    def run(st, slots):
        device.now += HOST_MS + device.kernel(st)
        return run_step(st, slots)
    return run


class Replays:
    """Builds stand-in replays; a step named in ``blocked`` is not captured
    (its reason), one in ``alone_only`` captures only as a single call;
    ``fail`` makes every build raise it. Records every replay built."""

    def __init__(self, device, stream, blocked=None, alone_only=(), fail=None):
        self.device, self.stream, self.blocked, self.alone_only = device, stream, dict(blocked or {}), alone_only
        self.fail, self.live, self.states, self.most_live = fail, weakref.WeakSet(), [], 0

    def __call__(self, steps, slots, run, stream):
        assert stream is self.stream and stream.depth == 1, "built outside the capture stream"
        if self.fail is not None:
            raise self.fail
        replay = Replay(self, list(steps), slots, run)
        self.live.add(replay)
        self.most_live = max(self.most_live, len(self.live))
        return replay


class Replay:
    def __init__(self, owner, steps, slots, run):
        self.owner, self.state = owner, {"steps": len(steps), "closed": False}
        owner.states.append(self.state)
        together = len(steps) == 1 or not any(st.name in owner.alone_only for st in steps)
        self.eager_reasons = {st.name: owner.blocked[st.name] for st in steps if st.name in owner.blocked}
        if not together:
            self.eager_reasons.update({st.name: "captured alone but not in a run" for st in steps})
        self.eager = [st for st in steps if st.name in self.eager_reasons]
        self.captured = [st for st in steps if st.name not in self.eager_reasons]
        self.steps, self.captured_steps = len(steps), len(self.captured)
        for st in steps:  # as GraphReplay: the captured outputs are new arrays (its private pool)
            slots[st.node] = np.array(run(st, slots))

    def __call__(self):
        assert not self.state["closed"] and self.owner.stream.depth == 1
        device = self.owner.device
        device.now += LAUNCH_MS + sum(device.kernel(st) for st in self.captured)
        device.now += sum(HOST_MS + device.kernel(st) for st in self.eager)

    def close(self):
        self.state["closed"] = True

    def summary(self):
        return {"steps": self.steps, "captured_steps": self.captured_steps, "graphs": 1 if self.captured else 0,
                "eager_steps": len(self.eager), "eager": dict(self.eager_reasons), "pool_bytes": 0}


@pytest.fixture(scope="module")
def filled():
    """The unfused tiny convnet's training steps, out of place, and ``slots``
    holding every value of one run (what profile_steps times on)."""
    m = tiny_convnet(batch=2)
    tg = training_graph(m)
    exe = og.compile(tg.outputs, device="cpu", policy=POLICY)
    slots = exe.feed(random_feeds(m))
    steps = [attrs.evolve(st, free=(), inplace=None) for st in exe.steps]
    for st in steps:
        slots[st.node] = run_step(st, slots)
    return m, tg, steps, slots


def graph_clock(device, **replays):
    stream = Stream()
    factory = Replays(device, stream, **replays)
    clock = sc.GraphClock(DeviceTimer(device), stream, replay=factory, run_step=eager_run(device),
                          release=lambda: None)
    return clock, factory


def by_name(steps, name):
    return next(st for st in steps if st.name == name)


def test_graph_calls_fill_the_target_and_stop_at_the_cap():
    assert sc.graph_calls(sc.GRAPH_TARGET_MS) == 1 and sc.graph_calls(3.0) == 1
    assert sc.graph_calls(sc.GRAPH_TARGET_MS / 4) == 4
    assert sc.graph_calls(sc.GRAPH_TARGET_MS / 4.5) == 5  # at least the target
    assert sc.graph_calls(1e-6) == sc.MAX_GRAPH_CALLS and sc.graph_calls(0.0) == sc.MAX_GRAPH_CALLS


def test_a_short_step_is_timed_as_k_calls_in_one_graph_sharing_the_launch(filled):
    _, _, steps, slots = filled
    device = Device({"relu1": 0.002})
    clock, factory = graph_clock(device)
    got = clock.step(by_name(steps, "relu1"), slots, warmup=1, repeat=3)
    calls = sc.graph_calls(LAUNCH_MS + 0.002)  # the one-call replay decided k
    assert calls > 1 and (got.timed, got.graph_calls, got.eager_reason) == ("graph", calls, None)
    assert got.ms == pytest.approx(0.002 + LAUNCH_MS / calls)  # device time: no host dispatch
    assert [s["steps"] for s in factory.states] == [1, calls]


def test_a_long_step_is_timed_as_one_call(filled):
    _, _, steps, slots = filled
    device = Device({"conv1": 1.5})
    clock, factory = graph_clock(device)
    got = clock.step(by_name(steps, "conv1"), slots, warmup=0, repeat=2)
    assert (got.timed, got.graph_calls) == ("graph", 1) and got.ms == pytest.approx(1.5 + LAUNCH_MS)
    assert len(factory.states) == 1


def test_a_step_that_cannot_be_captured_is_timed_eagerly_with_the_reason(filled):
    _, _, steps, slots = filled
    device = Device({"fc": 0.01})
    clock, _ = graph_clock(device, blocked={"fc": "declared not capturable: needs nvmath-python"})
    got = clock.step(by_name(steps, "fc"), slots, warmup=1, repeat=3)
    assert (got.timed, got.graph_calls) == ("eager", None)
    assert got.eager_reason == "declared not capturable: needs nvmath-python"
    assert got.ms == pytest.approx(HOST_MS + 0.01)  # called from Python, as before


def test_a_build_that_raises_is_timed_eagerly_and_leaves_the_slots(filled):
    _, _, steps, slots = filled
    before = dict(slots)
    clock, _ = graph_clock(Device(), fail=MemoryError("out of device memory"))
    got = clock.step(by_name(steps, "relu2"), slots, warmup=0, repeat=1)
    assert got.timed == "eager" and got.eager_reason == "graph replay failed: MemoryError: out of device memory"
    assert all(slots[n] is before[n] for n in before)


def test_k_calls_that_do_not_capture_together_keep_the_one_call_time(filled):
    _, _, steps, slots = filled
    clock, factory = graph_clock(Device({"pool1": 0.001}), alone_only={"pool1"})
    got = clock.step(by_name(steps, "pool1"), slots, warmup=0, repeat=2)
    assert (got.timed, got.graph_calls) == ("graph", 1) and got.ms == pytest.approx(0.001 + LAUNCH_MS)
    assert len(factory.states) == 2  # k calls were tried


def test_each_replay_is_closed_and_dropped_and_the_slots_given_back(filled):
    _, _, steps, slots = filled
    before = dict(slots)
    clock, factory = graph_clock(Device({"conv2": 1.0}), blocked={"fc": "cuBLAS"})
    for st in steps:
        clock.step(st, slots, warmup=1, repeat=2)
    assert all(slots[n] is before[n] for n in before)  # no slot left in a dead replay's pool
    assert len(factory.states) > len(steps) and all(s["closed"] for s in factory.states)
    assert factory.most_live == 1 and len(factory.live) == 0  # memory does not grow with the steps


def test_the_whole_step_is_one_replay_of_every_step(filled):
    _, _, steps, slots = filled
    before = dict(slots)
    device = Device({"conv1": 0.5}, default_ms=0.01)
    clock, factory = graph_clock(device, blocked={"fc": "cuBLAS"})
    got = clock.whole_graph(steps, slots, warmup=1, repeat=3)
    fc = by_name(steps, "fc")
    want = LAUNCH_MS + sum(device.kernel(st) for st in steps) + HOST_MS
    assert got["graph_step_ms"] == pytest.approx(want) and device.kernel(fc) == 0.01
    capture = got["graph_step_capture"]
    assert (capture["steps"], capture["eager_steps"], capture["eager"]) == (len(steps), 1, {"fc": "cuBLAS"})
    assert all(slots[n] is before[n] for n in before) and all(s["closed"] for s in factory.states)
    eager = sc.EagerClock(DeviceTimer(device), reason="cpu").whole_graph(steps, slots, warmup=0, repeat=1)
    assert eager == {"graph_step_ms": None, "graph_step_capture": None}


def test_a_whole_step_that_fails_to_build_is_reported_not_timed(filled):
    _, _, steps, slots = filled
    clock, _ = graph_clock(Device(), fail=RuntimeError("cudaErrorMemoryAllocation"))
    got = clock.whole_graph(steps, slots, warmup=0, repeat=1)
    assert got == {"graph_step_ms": None, "graph_step_capture": {"error": "RuntimeError: cudaErrorMemoryAllocation"}}


def test_the_device_picks_the_clock(monkeypatch):
    timer = DeviceTimer(Device())
    cpu = sc.step_clock("cpu", timer)
    assert type(cpu) is sc.EagerClock and cpu.reason == "device cpu: no CUDA graphs"
    stream = Stream()
    monkeypatch.setattr(sc, "capture_stream", lambda: stream)  # CuPy is not installed here
    cuda = sc.step_clock("cuda", timer)
    assert isinstance(cuda, sc.GraphClock) and cuda.stream is stream and cuda.timer is timer


def test_a_graph_timed_profile_marks_each_node_and_its_table_says_how(filled):
    m, tg, _, _ = filled
    device = Device({"conv1": 0.3})
    timer = DeviceTimer(device)
    clock, _ = graph_clock(device, blocked={"fc": "declared not capturable: needs nvmath-python"})
    prof = pf.profile_steps(tg, random_feeds(m), "cpu", POLICY, timer, warmup=0, repeat=2, clock=clock)
    timed = {n["name"]: n for n in prof["nodes"]}
    assert (timed["fc"]["timed"], timed["fc"]["graph_calls"]) == ("eager", None)
    assert timed["conv1"]["timed"] == "graph" and timed["conv1"]["eager_reason"] is None
    assert prof["timing"] == {"clock": "graph", "method": sc.GraphClock.method, "graph_steps": len(timed) - 1,
                              "eager_steps": 1, "eager_reasons": {"declared not capturable: needs nvmath-python": 1}}
    assert timed["conv1"]["ms"] == pytest.approx(0.3 + LAUNCH_MS)
    kernels = sum(device.kernel_ms.get(name, device.default_ms) for name in timed)
    assert prof["graph_step_ms"] == pytest.approx(LAUNCH_MS + kernels + HOST_MS)  # one launch; fc eager
    assert prof["nodes_ms"] == pytest.approx(sum(n["ms"] for n in prof["nodes"]))
    assert prof["graph_step_capture"]["eager_steps"] == 1
    rows = pf.group_by_op(prof["nodes"], None, None)
    assert sum(r["eager_steps"] for r in rows) == 1
    record = {"title": "tiny", "batch": 2, "dtype": "float32", "layout": "NCHW", "precision": "fp32",
              "lowering": "auto", "model": "tiny", **prof, "by_op": rows}
    (table,) = profile_tables({"limits": {}, "models": [record]})
    assert "as CUDA graphs" in table.caption and f"({len(timed) - 1} graph-timed, 1 eager)" in table.caption
    assert any("CUDA graph: each step captured alone" in n for n in table.notes)
    assert any("1 steps timed eagerly: declared not capturable: needs nvmath-python (1)" in n for n in table.notes)
    fc_row = next(r for r in table.rows if r[0] == "Linear")
    assert fc_row[2] == "1 (1 eager)"
