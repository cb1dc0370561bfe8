"""``policy.tune_clock``: what autotune's clock measures on the GPU.

``'device'`` (the default) times each candidate's kernels alone, queued behind
a held stream (``backends/cuda/held_stream.py``); ``'launch'`` records two
events around each call, host launch time included. The held timer's logic
runs here against a simulated stream; ``tests/gpu/test_held_stream_gpu.py``
checks it on the device."""

from __future__ import annotations

import json

import pytest

from opgraph.backends import device as devices
from opgraph.backends.cuda.held_stream import HeldStreamTimer
from opgraph.passes.autotune import CudaEventTimer, PerfCounterTimer, default_timer
from opgraph.passes.policy import TUNE_CLOCKS, LoweringPolicy, PolicyError

from passes_stubs import StubTimer, install_scale_rules
from test_autotune import scale_graph, tune


# ---- the policy key ------------------------------------------------------

def test_the_default_clock_is_the_device_and_round_trips():
    assert LoweringPolicy().tune_clock == "device" == TUNE_CLOCKS[0]
    p = LoweringPolicy(tune_clock="launch")
    assert LoweringPolicy.from_mapping(p.to_dict()).tune_clock == "launch"


@pytest.mark.parametrize("bad", ["host", "DEVICE", 1, None])
def test_a_bad_clock_names_the_key_and_the_value(bad):
    with pytest.raises(PolicyError, match="tune_clock") as e:
        LoweringPolicy(tune_clock=bad)
    assert repr(bad) in str(e.value) or str(bad) in str(e.value)


def test_a_policy_file_sets_the_clock(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('autotune = true\ntune_clock = "launch"\n')
    assert LoweringPolicy.from_toml(f).tune_clock == "launch"
    f.write_text('tune_clock = "wall"\n')
    with pytest.raises(PolicyError, match=r"p\.toml.*tune_clock.*wall"):
        LoweringPolicy.from_toml(f)


# ---- which timer each clock gets ----------------------------------------

def test_cuda_device_clock_is_the_held_stream_and_launch_the_event_pair():
    assert isinstance(devices.tune_timer("cuda", "device"), HeldStreamTimer)
    assert devices.tune_timer("cuda", "launch") is None
    assert isinstance(default_timer("cuda", "device"), HeldStreamTimer)
    assert type(default_timer("cuda", "launch")) is CudaEventTimer


@pytest.mark.parametrize("clock", TUNE_CLOCKS)
def test_the_cpu_clock_is_the_wall_clock_either_way(clock):
    assert type(default_timer("cpu", clock)) is PerfCounterTimer


class _ClockedStub(StubTimer):
    clock_id = "held-stream"


def test_the_cache_key_names_the_clock_so_another_clocks_decision_is_not_reused(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    times = {"fast": 1.0, "slow": 5.0, "reference": 3.0}
    cache = tmp_path / "c.json"
    _, report = tune(scale_graph()[1], cache, StubTimer(times))
    assert report.node("s0").how == "autotune"
    (plain,) = json.loads(cache.read_text())["entries"]
    assert "tune_clock" not in plain
    _, report = tune(scale_graph()[1], cache, _ClockedStub(times))
    assert report.node("s0").how == "autotune"  # timed again, not the other clock's entry
    keys = set(json.loads(cache.read_text())["entries"]) - {plain}
    assert len(keys) == 1 and "tune_clock=held-stream" in keys.pop()
    _, report = tune(scale_graph()[1], cache, _ClockedStub(times))
    assert report.node("s0").how == "cache"


# ---- the held timer against a simulated stream ---------------------------

class _Event:
    def __init__(self, stream):
        self.stream, self.at = stream, None

    def record(self):
        self.stream.record(self)

    def synchronize(self):
        pass


class _Stream:
    """A GPU stand-in: ``host_gap`` seconds pass on the device between one
    call's launch and its kernel unless the stream is held; a kernel of
    ``kernel`` seconds runs per call."""

    def __init__(self, kernel, host_gap, runs_out=False):
        self.kernel, self.host_gap, self.runs_out = kernel, host_gap, runs_out
        self.clock, self.held, self.holds, self.releases = 0.0, False, 0, 0

    def record(self, event):
        event.at = self.clock

    def call(self):
        self.clock += (0.0 if self.held else self.host_gap) + self.kernel


class _SimulatedHeld(HeldStreamTimer):
    def __init__(self, stream, **kw):
        super().__init__(**kw)
        self.stream = stream

    def _hold(self):
        self.stream.held, self.stream.holds = True, self.stream.holds + 1

    def _release(self):
        self.stream.held, self.stream.releases = False, self.stream.releases + 1
        return self.stream.runs_out

    def _event(self):
        return _Event(self.stream)

    @staticmethod
    def _elapsed(start, end):
        return end.at - start.at


def test_held_calls_measure_the_kernel_without_the_host_gap():
    s = _Stream(kernel=12e-6, host_gap=60e-6)
    t = _SimulatedHeld(s, batch=4)
    times = t.measure(s.call, label="cudnn[engine=0]", warmup=2, repeats=10)
    assert times == pytest.approx([12e-6] * 10)
    assert s.holds == s.releases == 3  # 4 + 4 + 2 calls behind three holds
    # the launch clock on the same stream: the gap is in every call
    launch = _SimulatedHeld(s)._launch_calls(s.call, 3)
    assert launch == pytest.approx([72e-6] * 3)


def test_warmup_calls_are_not_timed():
    s = _Stream(kernel=1e-6, host_gap=0.0)
    calls = []
    t = _SimulatedHeld(s)
    assert len(t.measure(lambda: (calls.append(1), s.call()), label="x", warmup=3, repeats=2)) == 2
    assert len(calls) == 5


def test_a_call_that_waits_for_the_device_falls_back_to_the_launch_clock_for_its_label():
    s = _Stream(kernel=10e-6, host_gap=50e-6, runs_out=True)
    t = _SimulatedHeld(s, batch=4)
    times = t.measure(s.call, label="gemm", warmup=0, repeats=5)
    assert times == pytest.approx([60e-6] * 5)  # the held batch was thrown away
    assert t.waits == {"gemm"} and s.holds == 1
    assert t.measure(s.call, label="gemm", warmup=0, repeats=2) == pytest.approx([60e-6] * 2)
    assert s.holds == 1  # that label is never held again
    s.runs_out = False
    assert t.measure(s.call, label="cudnn", warmup=0, repeats=2) == pytest.approx([10e-6] * 2)


def test_an_exception_in_a_call_still_releases_the_stream():
    s = _Stream(kernel=1e-6, host_gap=0.0)
    t = _SimulatedHeld(s)

    def boom():
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError, match="kernel failed"):
        t.measure(boom, label="boom", warmup=0, repeats=3)
    assert s.holds == s.releases == 1 and not s.held


def test_a_wait_on_one_node_leaves_the_next_nodes_candidates_held():
    from opgraph.passes.autotune_timers import take_waits

    s = _Stream(kernel=10e-6, host_gap=50e-6, runs_out=True)
    t = _SimulatedHeld(s, batch=4)
    assert t.measure(s.call, label="gemm", warmup=0, repeats=3) == pytest.approx([60e-6] * 3)  # node A waits
    assert take_waits(t) == ["gemm"] and t.waits == set()  # autotune moves to node B
    s.runs_out = False
    assert t.measure(s.call, label="gemm", warmup=0, repeats=3) == pytest.approx([10e-6] * 3)
    assert take_waits(t) == [] and take_waits(StubTimer({})) == []


def test_a_failing_first_event_still_releases_the_stream():
    s = _Stream(kernel=1e-6, host_gap=0.0)

    class _Broken(_SimulatedHeld):
        first = True

        def _event(self):
            e = _Event(self.stream)
            if _Broken.first:
                _Broken.first = False

                def fail():
                    raise RuntimeError("cudaErrorLaunchFailure")
                e.record = fail
            return e

    with pytest.raises(RuntimeError, match="LaunchFailure"):
        _Broken(s).measure(s.call, label="x", warmup=0, repeats=2)
    assert s.holds == s.releases == 1 and not s.held


def test_the_autotune_summary_names_the_clock(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    _, report = tune(scale_graph()[1], tmp_path / "c.json", _ClockedStub({"fast": 1.0}))
    assert report.autotune["clock"] == "_ClockedStub"
    from opgraph.passes.autotune_clock import describe
    assert describe(report.autotune).startswith("autotune ") and "(_ClockedStub clock)" in describe(report.autotune)
    _ClockedStub.clock_name = "device (held stream)"
    try:
        _, report = tune(scale_graph()[1], tmp_path / "d.json", _ClockedStub({"fast": 1.0}))
        assert report.autotune["clock"] == "device (held stream)"
    finally:
        del _ClockedStub.clock_name


def test_clock_keys_without_autotune_are_noted_not_ignored():
    import opgraph as og

    assert LoweringPolicy(tune_clock="launch").idle_autotune_keys() == ["tune_clock='launch'"]
    assert LoweringPolicy(tune_clock="launch", autotune=True).idle_autotune_keys() == []
    assert LoweringPolicy().idle_autotune_keys() == []
    g = og.Graph()
    x = g.input("x", (1, 2, 4, 4))
    y = og.relu(x)
    exe = og.compile(y, policy=LoweringPolicy(tune_clock="launch", engine_limit=3))
    (line,) = [n for n in exe.report.notes if n.startswith("policy ")]
    assert "engine_limit=3" in line and "tune_clock='launch'" in line and "no effect" in line


def test_a_device_where_the_hold_kernel_cannot_run_times_every_call_by_the_launch_clock(monkeypatch, tmp_path):
    s = _Stream(kernel=10e-6, host_gap=50e-6)

    class _NoHold(_SimulatedHeld):
        def _hold(self):
            raise RuntimeError("NVRTC_ERROR_COMPILATION: __nanosleep is undefined\nmore")

    t = _NoHold(s)
    assert t.measure(s.call, label="a", warmup=0, repeats=3) == pytest.approx([60e-6] * 3)
    assert t.unavailable == "RuntimeError: NVRTC_ERROR_COMPILATION: __nanosleep is undefined"
    install_scale_rules(monkeypatch, ["reference", "fast"])

    class _Stubbed(StubTimer):
        unavailable = "RuntimeError: no __nanosleep"

    _, report = tune(scale_graph()[1], tmp_path / "c.json", _Stubbed({"fast": 1.0}))
    assert any("cannot hold the stream here (RuntimeError: no __nanosleep)" in n for n in report.notes)
