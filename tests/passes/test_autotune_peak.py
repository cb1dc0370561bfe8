"""The memory-aware re-choice (``policy.peak_tolerance``, ``passes/autotune_memory.py``):
once every node is chosen, a node whose workspace raises the planned peak above
the activations' peak gets the fastest candidate within the tolerance whose
workspace fits under it; the rows and a note say so; forced nodes, nodes that
fit and hand-edited cache choices are left alone; the cache keeps the
time-based choice.

The graph: ``x`` (a 1 MiB float32 input) -> ``s0`` -> ``s1`` (output), two
Scale nodes of 1 MiB each. The activations peak at 2 MiB at ``s1``'s step
(``s0`` read there, ``s1`` written); 1 MiB is live during ``s0``'s step, so
``s0`` has 1 MiB of headroom. ``s1`` is forced to the reference (no workspace)."""

import json
import warnings

import numpy as np
import pytest

import opgraph as og
from opgraph.backends import registry
from opgraph.backends.registry import Rule
from opgraph.passes.autotune import AutotunePass, choose
from opgraph.passes.autotune_memory import StepRoom
from opgraph.passes.base import PassContext, Pipeline
from opgraph.passes.lower import LowerPass
from opgraph.passes.memory import MemoryPass, plan_inplace, plan_memory, step_bytes
from opgraph.passes.policy import LoweringPolicy, PolicyError
from opgraph.op import Source
from opgraph.passes.report import Candidate

from passes_stubs import SCALE_RULES, Scale, StubTimer

MIB = 2**20
SHAPE = (1024, 256)  # float32: 1 MiB
#: engine[e=0] is the fastest with 64 MiB of scratch (far above s0's 1 MiB of headroom),
#: e=1 needs 0.5 MiB (fits), e=2 16 MiB (does not fit, but less than e=0).
ENGINE_WS = {0: 64 * MIB, 1: MIB // 2, 2: 16 * MIB}
ACTIVATIONS = 2 * MIB


def install(monkeypatch, engines=(0, 1), workspace=ENGINE_WS):
    """Scale rules: the reference and ``engine``, whose variants ``engine[e=N]``
    declare ``workspace[N]`` bytes (a forced ``engine`` runs e=0)."""
    engine = Rule(Scale, "engine", SCALE_RULES["fast"].kernel,
                  variants=lambda op, types, device: [{"e": e} for e in engines],
                  workspace=lambda op, types, options: workspace[options.get("e", 0)])
    registry.rules_for(Scale)  # load the backends first
    monkeypatch.setitem(registry._RULES, Scale, {"reference": SCALE_RULES["reference"], "engine": engine})


def compile_chain(cache, timer, force=None, **policy):
    """Lower, autotune and plan the memory of x -> s0 -> s1; returns the report."""
    g = og.Graph()
    s0 = g.add_node(Scale(), [g.input("x", SHAPE)], name="s0")
    s1 = g.add_node(Scale(), [s0], name="s1")
    force = {"s1": "reference", **(force or {})}
    ctx = PassContext(policy=LoweringPolicy(autotune=True, cache=str(cache), force=force, **policy), timer=timer,
                      versions=lambda: {"numpy": "2.4.0"}, device_name=lambda: "test-cpu")
    Pipeline("t", [LowerPass(), AutotunePass(), MemoryPass()]).run(g, [s1], ctx)
    return ctx.report


def rows(report, node="s0"):
    return {c.label: c for c in report.node(node).candidates}


def times(slower_fits=1.05, **more):
    """The stub medians (ms): e=0 the fastest, e=1 ``slower_fits`` x as long."""
    return {"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": slower_fits, **more}


def test_the_chain_has_one_mib_of_headroom_at_s0(monkeypatch, tmp_path):
    install(monkeypatch)
    report = compile_chain(tmp_path / "c.json", StubTimer(times()), peak_tolerance=0)
    assert report.memory["activation_peak_bytes"] == ACTIVATIONS
    assert report.memory["planned_peak_bytes"] == MIB + ENGINE_WS[0]  # s0's step: 1 MiB live + 64 MiB


def test_a_candidate_within_the_tolerance_that_fits_is_chosen(monkeypatch, tmp_path):
    install(monkeypatch)
    path = tmp_path / "c.json"
    report = compile_chain(path, StubTimer(times()))  # default peak_tolerance 20 %; e=1 is 5 % slower
    rec, t = report.node("s0"), rows(report)
    assert rec.how == "autotune" and rec.options == {"e": 1} and rec.workspace == ENGINE_WS[1]
    assert rec.chosen.startswith("engine") and "e=1" in rec.chosen
    assert t["engine[e=1]"].status == "chosen" and t["engine[e=0]"].status == "ok"
    assert report.memory["planned_peak_bytes"] == report.memory["activation_peak_bytes"] == ACTIVATIONS
    assert t["engine[e=1]"].reason == ("within 20 % of the fastest engine[e=0] (1.050 vs 1.000 ms), keeps its "
                                       "step under the reachable peak of 2.0 MiB (the activations': 2.0 MiB) "
                                       "instead of 65.0 MiB (peak_tolerance)")
    assert t["engine[e=0]"].reason == ("its 64.0 MiB of workspace raises the planned peak to 65.0 MiB, above the "
                                       "reachable 2.0 MiB (the activations': 2.0 MiB); engine[e=1] is within 20 % "
                                       "of the fastest and fits")
    (note,) = [n for n in report.notes if "memory peak" in n]
    assert note == ("autotune: 1 node(s) chosen again for the memory peak (peak_tolerance 20 %): s0; "
                    "planned peak 65.0 MiB -> 2.0 MiB (the activations' 2.0 MiB)")
    # the cache keeps the measurements and the time-based choice: the peak's depends on the whole graph
    (entry,) = json.loads(path.read_text())["entries"].values()
    assert entry["algorithm"] == "engine" and entry["options"] == {"e": 0} and entry["tuned"]["options"] == {"e": 0}
    # ... and the next compile makes the same re-choice from the cached rows, timing nothing
    counter = StubTimer({})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not taken for a hand edit
        again = compile_chain(path, counter)
    assert counter.calls == [] and again.node("s0").how == "cache" and again.node("s0").options == {"e": 1}
    assert again.memory["planned_peak_bytes"] == ACTIVATIONS
    assert rows(again)["engine[e=1]"].reason == t["engine[e=1]"].reason


def test_the_executable_runs_the_new_choice(monkeypatch, tmp_path):
    install(monkeypatch)
    g = og.Graph()
    x = g.input("x", SHAPE)
    s1 = g.add_node(Scale(), [g.add_node(Scale(), [x], name="s0")], name="s1")
    policy = LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json"), force={"s1": "reference"})
    exe = og.compile([s1], policy=policy, timer=StubTimer(times()))
    assert exe.report.node("s0").options == {"e": 1}
    assert exe.report.memory["planned_peak_bytes"] == exe.report.memory["activation_peak_bytes"] == ACTIVATIONS
    feed = np.ones(SHAPE, np.float32)
    np.testing.assert_array_equal(exe(x=feed)[0], 4 * feed)


def test_peak_tolerance_zero_keeps_the_fastest(monkeypatch, tmp_path):
    install(monkeypatch)
    report = compile_chain(tmp_path / "c.json", StubTimer(times()), peak_tolerance=0)
    assert report.node("s0").options == {"e": 0} and rows(report)["engine[e=1]"].reason == ""
    assert report.memory["planned_peak_bytes"] == MIB + ENGINE_WS[0]
    assert not any("memory peak" in n for n in report.notes)


def test_a_fitting_candidate_outside_the_tolerance_is_not_chosen(monkeypatch, tmp_path):
    install(monkeypatch)
    report = compile_chain(tmp_path / "a.json", StubTimer(times(slower_fits=1.3)))  # 30 % slower, 20 % allowed
    assert report.node("s0").options == {"e": 0}
    assert all(c.reason == "" for c in report.node("s0").candidates)
    assert not any("memory peak" in n for n in report.notes)
    wider = compile_chain(tmp_path / "b.json", StubTimer(times(slower_fits=1.3)), peak_tolerance="35%")
    assert wider.node("s0").options == {"e": 1}


def test_the_reachable_peak_counts_the_least_workspace_within_the_tolerance(monkeypatch, tmp_path):
    """e=1 (fits the activations' peak) is outside the tolerance, e=2's 16 MiB
    within it: the lowest planned peak reachable is s0's step with e=2, which
    wins there."""
    install(monkeypatch, engines=(0, 1, 2))
    report = compile_chain(tmp_path / "c.json", StubTimer(times(slower_fits=1.3, **{"engine[e=2]": 1.04})))
    rec, t = report.node("s0"), rows(report)
    assert rec.options == {"e": 2} and t["engine[e=2]"].status == "chosen"
    assert t["engine[e=2]"].reason == ("within 20 % of the fastest engine[e=0] (1.040 vs 1.000 ms), keeps its "
                                       "step under the reachable peak of 17.0 MiB (the activations': 2.0 MiB) "
                                       "instead of 65.0 MiB (peak_tolerance)")
    assert t["engine[e=0]"].reason.endswith("engine[e=2] is within 20 % of the fastest and fits")
    assert report.memory["planned_peak_bytes"] == MIB + ENGINE_WS[2]


def test_when_nothing_fits_the_least_workspace_within_the_tolerance_wins():
    room = StepRoom(held=MIB, ceiling=ACTIVATIONS, activation_peak=ACTIVATIONS)
    fast = Candidate("engine", {"e": 0}, time_ms=1.0, workspace=64 * MIB)
    less = Candidate("engine", {"e": 2}, time_ms=1.04, workspace=16 * MIB)
    assert choose([fast, less], [fast, less], 0.0, room=room, peak_tolerance=0.2) is less
    assert less.reason == ("within 20 % of the fastest engine[e=0] (1.040 vs 1.000 ms), lowers its step to "
                           "17.0 MiB from 65.0 MiB (the reachable peak: 2.0 MiB (the activations': 2.0 MiB)) "
                           "(peak_tolerance)")
    assert fast.reason.endswith("engine[e=2] is within 20 % of the fastest with less")


def test_one_reason_writes_its_sizes_in_one_unit():
    """fresh-user report: "raises the planned peak to 0.1 MiB, above the reachable 68,164 B": the
    sizes of one sentence straddled format_size's 0.1 MiB switch; they now share a unit, bytes
    where two of them would read the same in MiB (review: "0.1 MiB, above the reachable 0.1")."""
    room = StepRoom(held=60_000, ceiling=68_164, activation_peak=68_164)
    fast = Candidate("engine", {"e": 0}, time_ms=1.0, workspace=50_000)
    less = Candidate("engine", {"e": 2}, time_ms=1.04, workspace=0)
    assert choose([fast, less], [fast, less], 0.0, room=room, peak_tolerance=0.2) is less
    assert ("its 50,000 B of workspace raises the planned peak to 110,000 B, above the reachable 68,164 B "
            "(the activations': 68,164 B)") in fast.reason
    assert "MiB" not in fast.reason and "MiB" not in less.reason


def test_a_node_whose_workspace_fits_is_never_changed(monkeypatch, tmp_path):
    # e=0 the fastest with 0.5 MiB (under s0's 1 MiB of headroom), e=1 with none
    install(monkeypatch, workspace={0: MIB // 2, 1: 0})
    report = compile_chain(tmp_path / "c.json", StubTimer(times()))
    assert report.node("s0").options == {"e": 0}
    assert all(c.reason == "" for c in report.node("s0").candidates)
    assert report.memory["planned_peak_bytes"] == ACTIVATIONS


def test_a_forced_node_is_never_changed(monkeypatch, tmp_path):
    install(monkeypatch)
    report = compile_chain(tmp_path / "c.json", StubTimer(times()), force={"s0": "engine"})
    rec = report.node("s0")
    assert rec.how == "forced" and rec.algorithm == "engine" and rec.workspace == ENGINE_WS[0]
    assert report.memory["planned_peak_bytes"] == MIB + ENGINE_WS[0]


def test_a_candidate_that_would_change_the_zero_copy_plan_is_not_taken(monkeypatch, tmp_path):
    """s0 is written straight into its slice of a concat by ``engine`` (it
    declares ``writes_strided_out``); ``lean`` fits the headroom but would be
    copied into the slice, another buffer plan: the headroom measured under the
    first plan would not hold, so the choice stays and a note says why."""
    def into(ctx, op, x, out=None):
        y = 2 * x
        if out is None:
            return y
        out[...] = y
        return out

    engine = Rule(Scale, "engine", into, writes_strided_out=True, fresh_output=True,
                  workspace=lambda op, types, options: 64 * MIB)
    lean = Rule(Scale, "lean", SCALE_RULES["fast"].kernel, fresh_output=True)
    registry.rules_for(Scale)
    monkeypatch.setitem(registry._RULES, Scale, {"reference": SCALE_RULES["reference"], "engine": engine,
                                                 "lean": lean})
    g = og.Graph()
    x = g.input("x", SHAPE)
    s0 = g.add_node(Scale(), [x], name="s0")
    s1 = g.add_node(Scale(), [x], name="s1")
    out = og.concat([s0, s1], 0, name="cat")
    ctx = PassContext(policy=LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json"),
                                            force={"s1": "reference"}),
                      timer=StubTimer({"reference": 2.5, "engine": 1.0, "lean": 1.05}),
                      versions=lambda: {"numpy": "2.4.0"}, device_name=lambda: "test-cpu")
    Pipeline("t", [LowerPass(), AutotunePass(), MemoryPass()]).run(g, [out], ctx)
    assert ctx.report.node("s0").algorithm == "engine"
    assert {c.label: c.status for c in ctx.report.node("s0").candidates}["engine"] == "chosen"
    assert "autotune: s0: lean would lower the planned peak, but it changes the in-place or zero-copy plan; " \
           "engine[cpu]" in "\n".join(ctx.report.notes)
    assert not any("memory peak" in n for n in ctx.report.notes)


def edit_entry(path, options):
    """Set the cache entry's top-level choice, as a user would in an editor."""
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    entry["options"] = options
    path.write_text(json.dumps(data))


def test_a_hand_edited_cache_choice_is_never_changed(monkeypatch, tmp_path):
    # e=2 as fast as e=0, with the same 64 MiB: the tuner's choice is e=0; the user picks e=2
    install(monkeypatch, engines=(0, 1, 2), workspace={0: 64 * MIB, 1: MIB // 2, 2: 64 * MIB})
    path = tmp_path / "c.json"
    assert compile_chain(path, StubTimer(times(**{"engine[e=2]": 1.0}))).node("s0").options == {"e": 1}
    edit_entry(path, {"e": 2})
    report = compile_chain(path, StubTimer({}))
    assert report.node("s0").options == {"e": 2} and any("hand-edited choice engine[e=2] used" in n
                                                         for n in report.notes)
    assert report.memory["planned_peak_bytes"] == MIB + 64 * MIB


def test_a_hand_edit_the_rows_agree_with_is_never_changed(monkeypatch, tmp_path):
    """An edit equal to what the rows choose is no conflict for ``hand_edit``
    (nothing to report), but it is still the user's choice."""
    install(monkeypatch)
    path = tmp_path / "c.json"
    compile_chain(path, StubTimer(times(slower_fits=1.02)))  # within 3 %: the tuner's choice is e=1
    edit_entry(path, {"e": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = compile_chain(path, StubTimer({}), workspace_tolerance=0)  # the rows choose e=0 too
    assert report.node("s0").options == {"e": 0}
    assert report.memory["planned_peak_bytes"] == MIB + ENGINE_WS[0]


@pytest.mark.parametrize("drop_tuned", [False, True])
def test_a_hand_edit_not_used_names_the_choice_the_memory_re_choice_made(monkeypatch, tmp_path, drop_tuned):
    """Fresh-user report: the warning said 'gemm chosen ... instead' where the
    memory-aware re-choice then ran 'direct'. It names the choice that runs."""
    install(monkeypatch)
    monkeypatch.setitem(registry._RULES[Scale], "wrong", SCALE_RULES["wrong"])
    path = tmp_path / "c.json"
    assert compile_chain(path, StubTimer(times(wrong=0.5))).node("s0").options == {"e": 1}  # the peak's choice
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    assert entry["options"] == {"e": 0}  # the cache keeps the time-based choice
    entry.update(algorithm="wrong", options={})  # edited to the row that is wrong
    if drop_tuned:
        entry.pop("tuned")
    path.write_text(json.dumps(data))
    with pytest.warns(RuntimeWarning) as caught:
        report = compile_chain(path, StubTimer({}))
    (message,) = [str(w.message) for w in caught if "is not used" in str(w.message)]
    assert report.node("s0").options == {"e": 1} and rows(report)["engine[e=1]"].status == "chosen"
    used = ("engine[e=1] used instead, chosen for the memory peak (peak_tolerance 20 %) over engine[e=0], the "
            "measured candidates' own choice")
    assert used in message and "engine[e=0] chosen from the entry's measured candidates instead" not in message
    assert message in report.notes
    # peak_tolerance 0: nothing moves, and the warning names the measurements' choice as before
    with pytest.warns(RuntimeWarning, match=r"engine\[e=0\] chosen from the entry's measured candidates instead"):
        assert compile_chain(path, StubTimer({}), peak_tolerance=0).node("s0").options == {"e": 0}


def test_pruned_and_uncapturable_rows_do_not_compete_for_the_peak():
    room = StepRoom(held=MIB, ceiling=ACTIVATIONS, activation_peak=ACTIVATIONS)

    def fresh():
        return [Candidate("engine", {"e": 0}, time_ms=1.0, workspace=64 * MIB),
                Candidate("engine", {"e": 1}, time_ms=1.05, workspace=0)]

    fast, once = fresh()
    once.reason = "pruned after 1 timed run"  # one timed run is not a median
    assert choose([fast, once], [fast], 0.03, room=room, peak_tolerance=0.1) is fast
    fast, fits = fresh()
    blocker = lambda algorithm, options: "refuses capture" if options == {"e": 1} else None  # noqa: E731
    assert choose([fast, fits], [fast, fits], 0.03, blocker, room=room, peak_tolerance=0.1) is fast
    fast, fits = fresh()
    assert choose([fast, fits], [fast, fits], 0.03, room=room, peak_tolerance=0.1) is fits
    assert fits.status == "chosen" and fast.status == "ok"


def test_step_bytes_is_the_memory_plans_accounting():
    from opgraph.benchmarks.models import build

    model = build("L1", batch=2)
    outs = [model.output, *og.grad(model.output, model.params)]
    graph = og.compile(outs, device="cpu").graph
    plan = plan_inplace(graph, outs, zero_copy=True)
    steps = step_bytes(graph, outs, None, plan)
    memory = plan_memory(graph, outs, None, plan)
    assert max(s.live for s in steps.values()) == memory["activation_peak_bytes"]
    assert max(s.planned for s in steps.values()) == memory["planned_peak_bytes"]
    assert set(steps) == {n for n in graph.topological(graph.ancestors(outs))
                          if not isinstance(graph.node(n).op, Source)}


# ---- the policy key and the flag --------------------------------------------------------------

# the default, a file's value and a bad one: test_autotune_workspace.py, beside workspace_tolerance's


def test_peak_tolerance_flag():
    assert LoweringPolicy.from_cli(peak_tolerance="10%").peak_tolerance == 0.1
    assert LoweringPolicy.from_cli(peak_tolerance="0").peak_tolerance == 0
    assert LoweringPolicy.from_cli().peak_tolerance == 0.20
    with pytest.raises(PolicyError) as e:
        LoweringPolicy.from_cli(peak_tolerance="2")
    assert "--peak-tolerance" in str(e.value) and "'2'" in str(e.value) and "fraction from 0 to 1" in str(e.value)


def test_peak_tolerance_without_autotune_is_idle():
    assert LoweringPolicy(peak_tolerance=0.3).idle_autotune_keys() == ["peak_tolerance=0.3"]
    assert LoweringPolicy(peak_tolerance=0.3, autotune=True).idle_autotune_keys() == []


# ---- what the re-choice may gain: the reachable peak, the slack, a copied-in result ------------

def test_a_step_it_may_not_change_sets_the_peak_and_nothing_moves(monkeypatch, tmp_path):
    """s1 forced to ``engine`` (64 MiB at its 2 MiB step: 66 MiB planned): s0's
    65 MiB step stays under that peak, so a slower s0 would save nothing."""
    install(monkeypatch)
    report = compile_chain(tmp_path / "c.json", StubTimer(times()), force={"s1": "engine"})
    assert report.node("s0").options == {"e": 0} and report.node("s1").how == "forced"
    assert report.memory["planned_peak_bytes"] == ACTIVATIONS + ENGINE_WS[0]
    assert not any("memory peak" in n for n in report.notes)
    assert all(c.reason == "" for c in report.node("s0").candidates)


def test_the_reachable_peak_takes_each_changeable_step_at_its_least_workspace():
    from opgraph.passes.autotune_memory import reachable_peak
    from opgraph.passes.memory import StepBytes
    steps = {1: StepBytes(live=MIB, copied=0, workspace=64 * MIB),         # may change: 16 MiB at least
             2: StepBytes(live=2 * MIB, copied=0, workspace=0),            # the activations' peak
             3: StepBytes(live=MIB, copied=MIB, workspace=8 * MIB)}        # fixed: 10 MiB
    assert reachable_peak(steps, {1: 16 * MIB}) == 17 * MIB
    assert reachable_peak(steps, {1: 0}) == 10 * MIB  # then step 3 sets it
    assert reachable_peak({2: steps[2]}, {}) == 2 * MIB


def test_a_step_a_few_kib_above_the_reachable_peak_keeps_its_choice():
    room = StepRoom(held=2 * MIB, ceiling=2 * MIB, activation_peak=2 * MIB)
    assert not room.raises(4096)  # under 1 % of the peak: not worth a slower kernel
    assert room.raises(64 * 1024)
    assert room.headroom == 0


def test_a_result_copied_into_its_concat_slice_counts_in_its_step(monkeypatch):
    """A concat producer whose rule cannot write a strided view holds its own
    result beside the slice while it copies: ``StepBytes.copied``, which the
    re-choice's headroom and the planned peak both count."""
    lean = Rule(Scale, "lean", SCALE_RULES["fast"].kernel, fresh_output=True)
    registry.rules_for(Scale)
    monkeypatch.setitem(registry._RULES, Scale, {"reference": SCALE_RULES["reference"], "lean": lean})
    g = og.Graph()
    x = g.input("x", SHAPE)
    s0 = g.add_node(Scale(), [x], name="s0")
    s1 = g.add_node(Scale(), [x], name="s1")
    out = og.concat([s0, s1], 0, name="cat")
    ctx = PassContext(policy=LoweringPolicy(force={"s0": "lean", "s1": "lean"}))
    g, (out,) = Pipeline("t", [LowerPass()]).run(g, [out], ctx)
    plan = plan_inplace(g, [out], zero_copy=True)
    s0 = next(n for n in g.topological(g.ancestors([out])) if g.node(n).name == "s0")
    assert s0 in plan.copied_in
    steps = step_bytes(g, [out], None, plan)
    assert steps[s0].copied == MIB and steps[s0].workspace == 0
    assert plan_memory(g, [out], None, plan)["planned_peak_bytes"] == max(s.planned for s in steps.values())


def test_a_cached_entry_without_rows_is_used_as_written(monkeypatch, tmp_path):
    """A hand-written entry (``algorithm``, ``options``, ``rechoose``; no
    ``candidates``) is no crash: the node runs it and the re-choice leaves it."""
    install(monkeypatch)
    path = tmp_path / "c.json"
    compile_chain(path, StubTimer(times()))
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    del entry["candidates"]
    entry.update(algorithm="engine", options={"e": 0})
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = compile_chain(path, StubTimer({}))
    assert report.node("s0").how == "cache" and report.node("s0").options == {"e": 0}
    assert not any("memory peak" in n for n in report.notes)
