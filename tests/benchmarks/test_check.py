"""Correctness before timing: per-node checks against the float64 reference."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends import registry
from opgraph.benchmarks import check, driver, graph_column, lowerings as lw
from opgraph.benchmarks.protocol import random_feeds, training_graph
from opgraph.op import abstract_of
from opgraph.ops import Conv2dBackwardFilter


@pytest.fixture
def setup(tiny):
    tg = training_graph(tiny)
    feeds = random_feeds(tiny, seed=1)
    return tg, feeds, check.Reference(tg, feeds, "cpu")


def test_reference_is_float64_and_equals_the_reference_pipeline(setup):
    tg, feeds, ref = setup
    want = og.compile(tg.outputs, pipeline="reference", dtype="float64")(**feeds)
    assert len(ref.outputs) == len(want) == 1 + len(tg.model.params)
    for a, b in zip(ref.outputs, want):
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, b)
    assert ref.names[0] == "fc" and ref.names[1] == "conv1.weight"


@pytest.mark.parametrize("policy", [
    {"prefer": {"conv": ["gemm"]}},                                   # conv + relu fused
    {"prefer": {"conv": ["winograd"]}},                               # conv2 only; conv1 falls back
    {"prefer": {"conv": ["gemm"]}, "explicit_padding": ["gemm"]},     # Pad / PadBackward nodes
    {"prefer": {"conv": ["fft"]}, "exclude": ["fused"]},              # no fusion
])
def test_lowerings_pass_the_per_node_check(setup, policy):
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy=policy)
    res = check.check_lowering(exe, ref)
    assert res.passed, res.failures
    ops = {abstract_of(st.op).name for st in exe.steps}
    assert res.nodes_checked == sum(abstract_of(st.op).name in check.CHECKED_OPS for st in exe.steps)
    assert res.nodes_checked >= 9 and res.max_rel_error < 1e-3
    if "explicit_padding" in policy:
        assert {"Pad", "PadBackward"} <= ops
    outs = exe(**feeds)
    e2e = check.end_to_end(np, outs, ref)
    assert e2e["finite"] and e2e["output"] < 1e-5


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_graph_compiled_in_another_dtype_is_checked_in_that_dtype(setup, dtype):
    """compile(dtype=...) of a float32 graph: each step is fed and judged in the
    dtype it runs in (run_types.py), not the graph's declared float32."""
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy={"prefer": {"conv": ["gemm"]}}, dtype=dtype)
    res = check.check_lowering(exe, ref)
    assert res.passed, res.failures[:3]
    assert res.nodes_checked >= 9 and res.max_rel_error > 1e-4  # judged on half-precision values


def test_a_wrong_kernel_is_caught(setup):
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy={"prefer": {"conv": ["gemm"]}})
    i = next(i for i, st in enumerate(exe.steps) if st.name == "conv2.grad/conv2d_backward_filter")
    good = exe.steps[i]
    exe.steps[i] = attrs.evolve(good, kernel=lambda ctx, op, *a: good.kernel(ctx, op, *a) * 1.001)
    res = check.check_lowering(exe, ref)
    assert not res.passed
    (f,) = res.failures
    assert f["node"] == "conv2.grad/conv2d_backward_filter" and f["tolerance"] == 1e-4
    assert f["rel_error"] == pytest.approx(1e-3, rel=1e-2)


def test_a_kernel_that_changes_the_dtype_is_caught(setup):
    # right values in float64 where the graph is float32: every later value would follow
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy={"prefer": {"conv": ["gemm"]}})
    i = next(i for i, st in enumerate(exe.steps) if st.name == "conv2.grad/conv2d_backward_filter")
    good = exe.steps[i]
    exe.steps[i] = attrs.evolve(good, kernel=lambda ctx, op, *a: good.kernel(ctx, op, *a).astype(np.float64))
    res = check.check_lowering(exe, ref)
    (f,) = res.failures
    assert not res.passed and f["node"] == "conv2.grad/conv2d_backward_filter"
    assert f["dtype"] == "returns float64, the node's type is float32"


def test_relative_error():
    ref = np.array([3.0, 4.0])
    assert check.relative_error(np, np.array([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert np.isnan(check.relative_error(np, np.array([np.nan, 4.0]), ref))
    assert np.isnan(check.relative_error(np, np.zeros(3), ref))
    assert check.relative_error(np, np.array([0.5, 0.0]), np.zeros(2)) == 0.5  # absolute


def test_mismatching_lowering_is_reported_and_not_timed(setup, monkeypatch):
    tg, feeds, ref = setup
    rules = registry.rules_for(Conv2dBackwardFilter)
    good = rules["winograd"]
    bad = attrs.evolve(good, kernel=lambda ctx, op, *a: good.kernel(ctx, op, *a) * 1.01)
    monkeypatch.setitem(registry._RULES[Conv2dBackwardFilter], "winograd", bad)
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("winograd")], warmup=0, repeat=1)
    [rec] = driver.run_lowering(tg, feeds, ref, lw.Lowering("winograd"), s.base_policy, s,
                              driver.make_timer("cpu"), None)
    assert rec["status"] == "mismatch"
    assert "conv2.grad/conv2d_backward_filter" in rec["reason"] and "not timed" in rec["reason"]
    assert "times" not in rec and not rec["check"]["passed"]
    # the fallback layer (conv1: 5x5) is not winograd, so it was not the culprit
    assert [f["node"] for f in rec["check"]["failures"]] == ["conv2.grad/conv2d_backward_filter"]


def test_auto_column_is_checked_and_timed(setup):
    tg, feeds, ref = setup
    base = driver.LoweringPolicy(cache="off")  # no autotune cache file from a test
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("auto")], warmup=0, repeat=1,
                        base_policy=base)
    [rec] = driver.run_lowering(tg, feeds, ref, lw.Lowering("auto"), base, s, driver.make_timer("cpu"),
                              None)
    assert rec["status"] == "ok" and rec["check"]["passed"] and rec["not_applicable"] == {}
    assert set(rec["algorithms"]["Conv2dBackwardFilter"]) <= {"gemm", "fft", "winograd", "direct"}
    assert rec["totals"]["total_ms"] > 0


def test_a_failed_reference_fails_the_model_not_the_run(monkeypatch, tiny):
    def boom(*a, **k):
        raise MemoryError("out of memory")

    monkeypatch.setattr(driver.chk, "Reference", boom)
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm,direct"), warmup=0, repeat=1)
    doc = driver.run_benchmark([tiny], s)
    assert [r["status"] for r in doc["results"]] == ["error", "error"]
    assert "float64 reference failed" in doc["results"][0]["reason"]


def fake_capture(monkeypatch, replays: bool):
    """No GPU here: stand-ins for CuPy's stream, pool and capture. A "capture"
    runs the NumPy kernels at once; its "graph" runs them again on launch when
    ``replays`` (the values then follow the live input, as a real replay's do),
    or does nothing (a replay reading stale arrays)."""
    import contextlib
    from types import SimpleNamespace

    from opgraph import graph_replay

    class Stream:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def synchronize(self):
            pass

    class Pool:
        def malloc(self, n):
            pass

        def free_all_blocks(self):
            pass

        def total_bytes(self):
            return 0

    def captured(stream, fn, pool=None):
        return SimpleNamespace(launch=(lambda stream=None: fn()) if replays else
                               (lambda stream=None: None)), fn()

    fake = SimpleNamespace(cuda=SimpleNamespace(Stream=lambda non_blocking=False: Stream(), MemoryPool=Pool,
                                                using_allocator=lambda malloc: contextlib.nullcontext()),
                           get_default_memory_pool=Pool)
    monkeypatch.setattr(graph_replay, "_cupy", lambda: fake)
    monkeypatch.setattr(graph_replay, "_captured", captured)


def graph_columns(setup, repeat=2):
    tg, feeds, ref = setup
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("gemm")], warmup=0, repeat=repeat,
                        cuda_graph=True)
    return s, driver.run_lowering(tg, feeds, ref, lw.Lowering("gemm"), s.base_policy, s,
                                  driver.make_timer("cpu"), None)


def test_cuda_graph_adds_a_graph_column_from_the_same_compile(setup, monkeypatch):
    # the plumbing of the +graph record; replay semantics: tests/test_graph_replay.py
    # and tests/gpu/test_cuda_graph.py
    fake_capture(monkeypatch, replays=True)
    tg, feeds, ref = setup
    x_before = feeds[tg.model.input.name].copy()
    s, (eager, graph) = graph_columns(setup)
    assert eager["lowering"] == "gemm" and graph["lowering"] == "gemm+graph"
    assert graph["status"] == "ok" and graph["check"]["passed"], graph.get("reason")
    assert graph["check"]["new_input_max_diff"] <= graph_column.graph_follow_tolerance("float32")
    assert set(graph["times"]) == set(eager["times"]) and len(graph["times"]["forward"]["times_ms"]) == 2
    assert len(graph["step"]["times_ms"]) == len(eager["step"]["times_ms"]) == 2  # whole step, one loop each
    assert graph["graph"]["forward"]["captured_steps"] == graph["graph"]["forward"]["steps"] > 0
    assert any(n.startswith("CUDA graphs:") for n in graph["notes"])
    assert all(not row["ms"] for row in graph["layers"])  # per-layer times stay with the eager record
    assert driver.unit_count([tg.model], s) == 2
    np.testing.assert_array_equal(feeds[tg.model.input.name], x_before)  # the image written back


def test_a_replay_that_does_not_follow_a_new_input_is_a_mismatch(setup, monkeypatch):
    fake_capture(monkeypatch, replays=False)
    _, (eager, graph) = graph_columns(setup)
    assert eager["status"] == "ok" and graph["status"] == "mismatch"
    assert "a graph reads a stale array" in graph["reason"] and "times" not in graph


def test_the_new_input_is_made_and_written_on_the_replay_stream(setup):
    # The replay stream does not wait for the default stream: on the H200, a copy of the
    # image made outside it raced the write into the captured input (NaN in the check).
    from opgraph.benchmarks.protocol import PhaseRunner, schedule

    tg, feeds, _ = setup
    exe = og.compile(tg.outputs, device="cpu")
    runner = PhaseRunner(schedule(exe, tg), exe.feed(feeds), driver.make_timer("cpu"))
    runner.warmup(1)
    depth, log, tracked = [0], [], set()

    class Stream:
        def __enter__(self):
            depth[0] += 1

        def __exit__(self, *exc):
            depth[0] -= 1

        def synchronize(self):
            pass

    class Recorded(np.ndarray):  # records the stream depth of each access to tracked arrays
        def _note(self, what, result=None):
            if id(self) in tracked:
                log.append((what, depth[0]))
                if result is not None:
                    tracked.add(id(result))
            return result

        def copy(self, *a, **k):
            return self._note("copy", super().copy(*a, **k))

        def __neg__(self):
            return self._note("neg", super().__neg__())

        def __setitem__(self, key, value):
            self._note("set")
            super().__setitem__(key, value)

    node = next(src.id for src in exe.sources if src.name == tg.model.input.name)
    runner.slots[node] = x = runner.slots[node].view(Recorded)
    tracked.add(id(x))
    runner.graph_stream = Stream()
    runner.replay_all = lambda: runner.run(runner.sched.steps)
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("gemm")])
    worst, why = graph_column.graph_follows(runner, exe, tg, feeds, s)
    assert why is None and worst <= graph_column.graph_follow_tolerance("float32")
    assert [w for w, _ in log] == ["copy", "neg", "set", "set"]  # the last: the image written back
    assert all(d > 0 for _, d in log), log


def test_graph_check_compares_the_replay_with_the_eager_errors():
    eager = {"output": 1e-6, "max_grad": 2e-4, "finite": True, "non_finite": []}
    ok = {"output": 3e-6, "max_grad": 1.1e-3, "finite": True, "non_finite": []}
    assert graph_column.graph_check(eager, ok) == (True, None)
    stale = dict(ok, max_grad=0.9)  # a replay reading the wrong array
    passed, why = graph_column.graph_check(eager, stale)
    assert not passed and "max_grad relative error 0.9" in why
    nan = dict(ok, finite=False, non_finite=["conv1.weight"])
    assert graph_column.graph_check(eager, nan) == (False, "non-finite values in conv1.weight")


def test_a_lowering_that_does_not_time_gets_a_placeholder_graph_column(tiny):
    s = driver.Settings(device="cpu", lowerings=[lw.Lowering("winograd")], warmup=0, repeat=1,
                        check=False, cuda_graph=True, time_limit=0.0)
    doc = driver.run_benchmark([tiny], s)
    recs = [(r["lowering"], r["status"]) for r in doc["results"]]
    assert recs == [("winograd", "skipped"), ("winograd+graph", "skipped")]
    assert doc["results"][1]["reason"].startswith("not replayed: the eager column is skipped")
    assert driver.unit_count([tiny], s) == len(doc["results"])


def test_a_fused_pool_relu_gradient_is_checked_against_the_reference_relu_gradient(setup):
    # the fused node computes what the abstract ReluBackward computed: its kept float64 value
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs)
    fused = [st.node for st in exe.steps if abstract_of(st.op).name == "MaxPool2dBackwardRelu"]
    assert fused
    for nid in fused:
        twin = check.abstract_twin(exe.graph, ref.graph, nid)
        assert ref.graph.node(twin).op.name == "ReluBackward" and twin in ref.values
    assert check.check_lowering(exe, ref).passed


def test_the_saved_winner_ops_are_checked_against_the_reference_values_they_replace(setup):
    # pool-argmax (on the CPU with fused-reference; pool-scan excluded): the take computes MaxPool2d's value, the masked
    # gather the ReluBackward that MaxPool2dBackwardRelu had absorbed
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy={"include": ["fused-reference"], "exclude": ["pool-scan"]})
    kinds = {abstract_of(st.op).name: st.node for st in exe.steps}
    assert {"MaxPool2dArgmax", "MaxPool2dTake", "MaxPool2dBackwardIndices"} <= set(kinds)
    take = check.abstract_twin(exe.graph, ref.graph, kinds["MaxPool2dTake"])
    assert ref.graph.node(take).op.name == "MaxPool2d" and take in ref.values
    gather = check.abstract_twin(exe.graph, ref.graph, kinds["MaxPool2dBackwardIndices"])
    assert ref.graph.node(gather).op.name == "ReluBackward" and gather in ref.values
    assert check.check_lowering(exe, ref).passed


def test_the_one_scan_is_checked_with_the_winners_it_fills(setup):
    # pool-scan (a default; on the CPU with fused-reference): the scan computes MaxPool2d's value
    # and fills its slot; the slot's own step is not checked (it only allocates), what the scan
    # writes into it is
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy={"include": ["fused-reference"]})
    kinds = {abstract_of(st.op).name: st.node for st in exe.steps}
    assert {"MaxPool2dArgmaxSlot", "MaxPool2dScan", "MaxPool2dBackwardIndices"} <= set(kinds)
    scan = check.abstract_twin(exe.graph, ref.graph, kinds["MaxPool2dScan"])
    assert ref.graph.node(scan).op.name == "MaxPool2d"
    result = check.check_lowering(exe, ref)
    assert result.passed
    # a scan that computes the value but leaves the slot as it found it fails
    def value_only(ctx, op, x, slot):
        from opgraph.backends.registry import rules_for
        pool = og.ops.MaxPool2d(**{k: getattr(op, k) for k in ("kernel_size", "stride", "padding", "ceil_mode")})
        return rules_for(og.ops.MaxPool2d)["reference"].kernel(ctx, pool, x)
    exe.steps = [attrs.evolve(st, kernel=value_only) if abstract_of(st.op).name == "MaxPool2dScan" else st
                 for st in exe.steps]
    broken = check.check_lowering(exe, ref)
    assert not broken.passed and {f["op"] for f in broken.failures} == {"MaxPool2dScan"}
    assert broken.nodes_checked == result.nodes_checked


def test_the_relu_gradient_is_checked_with_the_bias_gradient_it_fills(setup):
    # relu-bias-sums (a default; on the CPU with fused-reference): the ReLU gradient's sums are the
    # bias gradient's value
    tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy={"include": ["fused-reference"]})
    kinds = {abstract_of(st.op).name: st.node for st in exe.steps}
    assert {"ReluBackwardSumsSlot", "ReluBackwardSums"} <= set(kinds)
    slot = check.abstract_twin(exe.graph, ref.graph, kinds["ReluBackwardSumsSlot"])
    assert ref.graph.node(slot).op.name == "BiasAddBackward"
    result = check.check_lowering(exe, ref)
    assert result.passed

    def sums_off_by_two_percent(ctx, op, y, gy, sums):
        from opgraph.backends.registry import rules_for
        g = rules_for(og.ops.ReluBackwardSums)["reference"].kernel(ctx, op, y, gy, sums)
        sums *= 1.02  # beyond fp32's tolerance, as a sum over the wrong rows would be
        return g
    exe.steps = [attrs.evolve(st, kernel=sums_off_by_two_percent) if abstract_of(st.op).name == "ReluBackwardSums"
                 else st for st in exe.steps]
    broken = check.check_lowering(exe, ref)
    assert not broken.passed and {f["op"] for f in broken.failures} == {"ReluBackwardSums"}


def test_the_new_input_tolerance_follows_the_storage_dtype():
    # a nondeterministic sum stored in bf16 differs by its rounding (2^-8), a stale array by ~1
    assert graph_column.graph_follow_tolerance("float32") == graph_column.graph_follow_tolerance("float64") == 1e-3
    assert 2.0 ** -8 < graph_column.graph_follow_tolerance("bfloat16") < 0.1
    assert graph_column.graph_follow_tolerance("float16") == graph_column.graph_follow_tolerance("bfloat16")


def test_capture_notes_give_each_phase_and_say_when_the_replay_is_slower():
    summary = {"forward": {"steps": 10, "captured_steps": 8, "eager_steps": 2, "graphs": 2,
                           "eager": {"fc": "declared not capturable: nvmath-python is not installed"}},
               "backward_data": {"steps": 5, "captured_steps": 5, "eager_steps": 0, "graphs": 1, "eager": {}}}
    notes = graph_column.capture_notes(summary, {"median_ms": 2.0}, {"median_ms": 2.5})
    assert notes[0] == "CUDA graphs: 13 of 15 steps captured in 3 graphs; 2 run eagerly between them"
    assert notes[1] == "captured/eager steps per phase: forward 8/2; backward_data 5/0"
    assert "slower than eager" in notes[2] and "nvmath-python is not installed" in notes[2]
    assert len(graph_column.capture_notes(summary, {"median_ms": 2.0}, {"median_ms": 1.5})) == 2
