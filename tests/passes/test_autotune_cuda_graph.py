"""Autotune for a step that is replayed as CUDA graphs (``policy.cuda_graph``):
a candidate whose rule declares itself not capturable (FFT, Winograd), or
whose variant does (``Rule.variant_capture_blocker``: the bias gradient's
cuBLAS ``method='gemv'``), would run eagerly between the graphs of the replay,
so it competes only when it beats every correct capturable candidate by more
than a split of the replay costs (``autotune.EAGER_STEP_MS``), or none is
correct; the cached
measurements decide again, nothing is timed twice; and the benchmark's
``+graph`` column compiles that way only when the eager column's graph has
such a step."""

import json

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends import registry
from opgraph.backends.registry import KernelContext, Rule, lookup
from opgraph import ops
from opgraph.benchmarks.graph_column import changed_choices, recompile_note, replay_policy
from opgraph.passes.autotune import EAGER_STEP_MS, AutotunePass, choose
from opgraph.passes.base import PassContext, Pipeline
from opgraph.passes.lower import LowerPass
from opgraph.passes.policy import LoweringPolicy, PolicyError
from opgraph.passes.report import Candidate

from passes_stubs import SCALE_RULES, Scale, StubTimer

WHY = "its transforms run on a handle that refuses stream capture"
GEMV_WHY = "the gemv variant multiplies on a handle that refuses stream capture"


def blocked(*algorithms):
    """``choose``'s capture blocker for rows of these algorithms (any options): :data:`WHY`."""
    return lambda algorithm, options: WHY if algorithm in algorithms else None


def gemv_blocker(options):
    return GEMV_WHY if options.get("method") == "gemv" else None


#: A capturable rule with one variant that is not (as the cuda bias gradient).
METHODS = Rule(Scale, "methods", SCALE_RULES["fast"].kernel, capturable=True,
               variants=lambda op, types, device: [{}, {"method": "gemv"}], variant_capture_blocker=gemv_blocker)


def install(monkeypatch):
    """Scale rules: the reference, ``graphed`` (declares itself capturable) and
    ``split`` (declares it is not: :data:`WHY`)."""
    registry.rules_for(Scale)
    monkeypatch.setitem(registry._RULES, Scale, {
        "reference": SCALE_RULES["reference"],
        "graphed": Rule(Scale, "graphed", SCALE_RULES["fast"].kernel, capturable=True),
        "split": Rule(Scale, "split", SCALE_RULES["fast"].kernel, capturable=WHY)})


def install_methods(monkeypatch):
    """Scale rules: the reference and :data:`METHODS`."""
    registry.rules_for(Scale)
    monkeypatch.setitem(registry._RULES, Scale, {"reference": SCALE_RULES["reference"], "methods": METHODS})


def tune(cache, timer, device="cuda", **policy):
    """One Scale node tuned on ``device`` (NumPy arrays either way: the
    ``cuda`` context only decides which declarations count)."""
    g = og.Graph()
    out = g.add_node(Scale(), [g.input("x", (4, 5))], name="s0")
    ctx = PassContext(device=device, xp=np, policy=LoweringPolicy(autotune=True, cache=str(cache), **policy),
                      timer=timer, versions=lambda: {"numpy": "2.4.0"}, device_name=lambda: "test-gpu")
    Pipeline("t", [LowerPass(), AutotunePass()]).run(g, [out], ctx)
    return ctx.report.node("s0")


def test_choose_leaves_out_a_faster_uncapturable_row_when_a_capturable_one_is_correct():
    split = Candidate("split", time_ms=1.0)
    graphed = Candidate("graphed", time_ms=1.03)
    rows = [split, graphed]
    assert choose(rows, rows, 0.03, blocked("split")) is graphed and graphed.status == "chosen"
    assert split.status == "ok" and WHY in split.reason and "cuda_graph" in split.reason
    again = [Candidate("split", time_ms=1.0), Candidate("graphed", time_ms=1.03)]
    assert choose(again, again, 0.03) is again[0]  # without cuda_graph: the fastest


@pytest.mark.parametrize("saved", [EAGER_STEP_MS * 0.5, EAGER_STEP_MS * 4])
def test_an_uncapturable_row_wins_when_it_saves_more_than_a_split_costs(saved):
    split, graphed = Candidate("split", time_ms=1.0), Candidate("graphed", time_ms=1.0 + saved)
    rows = [split, graphed]
    wins = saved > EAGER_STEP_MS
    assert choose(rows, rows, 0.0, blocked("split")) is (split if wins else graphed)
    assert WHY in split.reason
    assert ("runs eagerly between the CUDA graphs" in split.reason) == wins
    assert (f"{saved:.3f} ms" in split.reason) and (graphed.reason == "")


def test_an_uncapturable_row_still_wins_when_nothing_else_is_correct():
    rows = [Candidate("split", time_ms=1.0), Candidate("graphed", time_ms=0.5, status="wrong")]
    assert choose(rows, rows, 0.03, blocked("split")) is rows[0]
    assert rows[0].reason == ""  # nothing faster was left out


def test_a_slower_uncapturable_row_gets_no_reason():
    rows = [Candidate("split", time_ms=2.0), Candidate("graphed", time_ms=1.0)]
    assert choose(rows, rows, 0.03, blocked("split")) is rows[1] and rows[0].reason == ""


def test_the_tuner_picks_the_capturable_candidate_for_a_replayed_step(monkeypatch, tmp_path):
    install(monkeypatch)
    times = {"reference": 3.0, "split": 1.0, "graphed": 1.03}
    assert tune(tmp_path / "a.json", StubTimer(times)).algorithm == "split"
    rec = tune(tmp_path / "b.json", StubTimer(times), cuda_graph=True)
    assert rec.how == "autotune" and rec.algorithm == "graphed"
    left_out = next(c for c in rec.candidates if c.algorithm == "split")
    assert WHY in left_out.reason
    faster = dict(times, graphed=1.4)  # 0.4 ms saved: more than a split of the replay costs
    kept = tune(tmp_path / "c.json", StubTimer(faster), cuda_graph=True)
    assert kept.algorithm == "split"
    assert any("runs eagerly between the CUDA graphs" in c.reason for c in kept.candidates if c.algorithm == "split")


def test_cuda_graph_chooses_again_from_the_cache_without_timing(monkeypatch, tmp_path):
    install(monkeypatch)
    path = tmp_path / "c.json"
    assert tune(path, StubTimer({"reference": 3.0, "split": 1.0, "graphed": 1.03})).algorithm == "split"
    counter = StubTimer({})
    rec = tune(path, counter, cuda_graph=True)
    assert rec.how == "cache" and rec.algorithm == "graphed" and counter.calls == []
    assert tune(path, counter).algorithm == "split"  # the same entry, chosen for eager again
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_choose_tells_variants_of_one_rule_apart():
    gemv = Candidate("methods", {"method": "gemv"}, time_ms=1.0)
    columns = Candidate("methods", {}, time_ms=1.03)
    rows = [gemv, columns]
    blocker = lambda algorithm, options: METHODS.declared_capture_blocker(options)  # noqa: E731
    assert choose(rows, rows, 0.03, blocker) is columns and gemv.status == "ok"
    assert f"faster, but not capturable ({GEMV_WHY})" in gemv.reason and "cuda_graph" in gemv.reason
    alone = [Candidate("methods", {"method": "gemv"}, time_ms=1.0), Candidate("methods", {}, status="wrong")]
    assert choose(alone, alone, 0.03, blocker) is alone[0]  # nothing else is correct


def test_the_tuner_picks_the_capturable_variant_for_a_replayed_step(monkeypatch, tmp_path):
    install_methods(monkeypatch)
    times = {"reference": 3.0, "methods[method=gemv]": 1.0, "methods": 1.03}
    assert tune(tmp_path / "a.json", StubTimer(times)).options == {"method": "gemv"}
    rec = tune(tmp_path / "b.json", StubTimer(times), cuda_graph=True)
    assert rec.how == "autotune" and rec.algorithm == "methods" and rec.options == {}
    left_out = next(c for c in rec.candidates if c.options == {"method": "gemv"})
    assert GEMV_WHY in left_out.reason


def test_a_cached_uncapturable_variant_is_chosen_again_without_timing(monkeypatch, tmp_path):
    install_methods(monkeypatch)
    path = tmp_path / "c.json"
    times = {"reference": 3.0, "methods[method=gemv]": 1.0, "methods": 1.03}
    assert tune(path, StubTimer(times)).options == {"method": "gemv"}
    counter = StubTimer({})
    rec = tune(path, counter, cuda_graph=True)
    assert rec.how == "cache" and rec.options == {} and counter.calls == []
    assert tune(path, counter).options == {"method": "gemv"}  # the same entry, chosen for eager again
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_a_variant_blocker_adds_to_the_rules_declaration():
    assert METHODS.declared_capture_blocker({"method": "gemv"}) == GEMV_WHY
    assert METHODS.declared_capture_blocker({}) is None and METHODS.declared_capture_blocker() is None
    assert METHODS.capture_blocker({"method": "gemv"}, installed=False) == GEMV_WHY
    needs = attrs.evolve(METHODS, capture_requires=lambda: "nvmath-python is missing")
    assert needs.declared_capture_blocker({}) == "nvmath-python is missing"
    assert needs.declared_capture_blocker({"method": "gemv"}) == GEMV_WHY
    # a rule that declares nothing is left to the trial capture, but for the variant that declares
    undeclared = attrs.evolve(METHODS, capturable=None)
    assert undeclared.declared_capture_blocker({}) is None
    assert undeclared.declared_capture_blocker({"method": "gemv"}) == GEMV_WHY
    assert "does not declare" in undeclared.capture_blocker({})
    # a rule that never captures says so for every variant
    never = attrs.evolve(METHODS, capturable=WHY)
    assert never.declared_capture_blocker({}) == never.declared_capture_blocker({"method": "gemv"}) == WHY


def test_cuda_graph_counts_only_on_cuda(monkeypatch, tmp_path):
    # on the CPU nothing is captured: the fastest wins
    install(monkeypatch)
    times = {"reference": 3.0, "split": 1.0, "graphed": 1.03}
    assert tune(tmp_path / "a.json", StubTimer(times), device="cpu", cuda_graph=True).algorithm == "split"


def test_the_policy_refuses_cuda_graph_without_autotune():
    with pytest.raises(PolicyError, match="cuda_graph.*autotune"):
        LoweringPolicy(cuda_graph=True)
    with pytest.raises(PolicyError, match="cuda_graph.*true or false"):
        LoweringPolicy(autotune=True, cuda_graph="yes")
    pol = LoweringPolicy.from_mapping({"autotune": True, "cuda_graph": True})
    assert pol.to_dict()["cuda_graph"] is True
    assert LoweringPolicy.from_mapping(pol.to_dict()) == pol
    assert "cuda_graph" not in LoweringPolicy(autotune=True).to_dict()


def test_fft_and_winograd_declare_themselves_not_capturable_and_gemm_is_left_to_the_trial():
    for algorithm in ("fft", "winograd"):
        for op_type in (ops.Conv2d, ops.Conv2dBackwardData, ops.Conv2dBackwardFilter):
            assert lookup(op_type, algorithm).declared_capture_blocker(), (op_type, algorithm)
    assert lookup(ops.Conv2d, "gemm").declared_capture_blocker() is None


class _Step:
    def __init__(self, name, algorithm, blocker=None, options=None):
        self.name = name
        self.op = type("L", (), {"algorithm": algorithm, "option_dict": dict(options or {})})()
        self.ctx = KernelContext(np, "cuda", capture_blocker=blocker)


class _Exe:
    def __init__(self, *steps):
        self.steps = steps


def test_the_graph_column_compiles_again_only_when_a_step_would_split_the_replay():
    auto = LoweringPolicy(autotune=True)
    split = _Exe(_Step("conv1", "cudnn"), _Step("conv2.dgrad", "fft", blocker=WHY))
    whole = _Exe(_Step("conv1", "cudnn"), _Step("conv2.dgrad", "cudnn"))
    assert replay_policy(split, auto) == LoweringPolicy(autotune=True, cuda_graph=True)
    assert replay_policy(whole, auto) is None
    assert replay_policy(split, LoweringPolicy(prefer={"conv": ["fft"]})) is None  # not tuned: fft asked for
    assert replay_policy(split, LoweringPolicy(autotune=True, cuda_graph=True)) is None
    changed = changed_choices(split, whole)
    assert changed == {"conv2.dgrad": "fft -> cudnn"}
    note = recompile_note(changed)
    assert "1 step changed: conv2.dgrad (fft -> cudnn)" in note and "cuda_graph" in note
    assert recompile_note({}).endswith("0 steps changed")
    # a variant of one rule changed: the bias gradient's gemv left for the column kernel
    gemv = _Exe(_Step("fc.grad/bias", "cuda", blocker=GEMV_WHY, options={"method": "gemv"}))
    assert replay_policy(gemv, auto) == LoweringPolicy(autotune=True, cuda_graph=True)
    assert changed_choices(gemv, _Exe(_Step("fc.grad/bias", "cuda"))) == {"fc.grad/bias": "cuda[method=gemv] -> cuda"}
    # options both compiles share (the policy's precision) are left out of the labels
    tf32 = {"precision": "tf32"}
    fft = _Exe(_Step("conv2.dgrad", "fft", blocker=WHY, options=tf32))
    engine = _Exe(_Step("conv2.dgrad", "cudnn", options={**tf32, "engine": 3}))
    assert changed_choices(fft, engine) == {"conv2.dgrad": "fft -> cudnn[engine=3]"}
