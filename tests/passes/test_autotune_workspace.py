"""The autotuner's workspace tie-break (``policy.workspace_tolerance``): among
the correct candidates within the tolerance of the fastest, the smallest
workspace wins; the report says so; a cached decision is chosen again from its
measurements under the current tolerance."""

import json
import warnings

import pytest

import opgraph as og
from opgraph.backends import registry
from opgraph.backends.registry import Rule
from opgraph.passes.autotune import AutotunePass, choose
from opgraph.passes.base import PassContext, Pipeline
from opgraph.passes.lower import LowerPass
from opgraph.passes.policy import LoweringPolicy, PolicyError, parse_fraction
from opgraph.passes.report import Candidate

from passes_stubs import SCALE_RULES, Scale, StubTimer

MIB = 2**20
#: Scratch bytes of each engine variant (like cuDNN engines of one conv node).
ENGINE_WS = {0: 300 * MIB, 1: 10 * MIB, 2: 200 * MIB, 3: 10 * MIB}


def install_engines(monkeypatch, engines=(0, 1)):
    """Scale rules: the reference (the correctness check) and one rule whose
    variants ``engine[e=N]`` declare :data:`ENGINE_WS` bytes of workspace."""
    engine = Rule(Scale, "engine", SCALE_RULES["fast"].kernel,
                  variants=lambda op, types, device: [{"e": e} for e in engines],
                  workspace=lambda op, types, options: ENGINE_WS[options["e"]])
    registry.rules_for(Scale)  # load the backends first
    monkeypatch.setitem(registry._RULES, Scale, {"reference": SCALE_RULES["reference"], "engine": engine})


def tune(cache, timer, **policy):
    # the memory-aware re-choice off unless asked for: the graph's activations are
    # 80 bytes, so every workspace here raises its planned peak (test_autotune_peak.py)
    policy.setdefault("peak_tolerance", 0)
    g = og.Graph()
    out = g.add_node(Scale(), [g.input("x", (4, 5))], name="s0")
    ctx = PassContext(policy=LoweringPolicy(autotune=True, cache=str(cache), **policy), timer=timer,
                      versions=lambda: {"numpy": "2.4.0"}, device_name=lambda: "test-cpu")
    Pipeline("t", [LowerPass(), AutotunePass()]).run(g, [out], ctx)
    return ctx.report


def rows(report):
    return {c.label: c for c in report.node("s0").candidates}


def test_the_near_fastest_candidate_with_the_smallest_workspace_is_chosen(monkeypatch, tmp_path):
    install_engines(monkeypatch, engines=(0, 1, 2))
    timer = StubTimer({"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": 1.02, "engine[e=2]": 1.01})
    report = tune(tmp_path / "c.json", timer)  # default tolerance 3 %
    rec, t = report.node("s0"), rows(report)
    assert rec.how == "autotune" and rec.options == {"e": 1} and rec.workspace == 10 * MIB
    assert t["engine[e=1]"].status == "chosen"
    assert t["engine[e=0]"].status == "ok" and t["engine[e=2]"].status == "ok"


def test_a_candidate_just_outside_the_tolerance_is_not_chosen(monkeypatch, tmp_path):
    install_engines(monkeypatch)
    times = {"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": 1.04}  # 4 % slower
    assert tune(tmp_path / "a.json", StubTimer(times)).node("s0").options == {"e": 0}
    assert tune(tmp_path / "b.json", StubTimer(times), workspace_tolerance=0.05).node("s0").options == {"e": 1}


def test_tolerance_zero_keeps_the_fastest_even_on_a_tie(monkeypatch, tmp_path):
    install_engines(monkeypatch)
    near = {"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": 1.001}
    report = tune(tmp_path / "a.json", StubTimer(near), workspace_tolerance=0)
    assert report.node("s0").options == {"e": 0} and rows(report)["engine[e=1]"].reason == ""
    tie = {"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": 1.0}  # policy order breaks it
    assert tune(tmp_path / "b.json", StubTimer(tie), workspace_tolerance=0).node("s0").options == {"e": 0}
    assert tune(tmp_path / "c.json", StubTimer(tie)).node("s0").options == {"e": 1}


def test_equal_workspaces_go_to_the_faster_median(monkeypatch, tmp_path):
    install_engines(monkeypatch, engines=(0, 1, 3))  # e=1 and e=3: 10 MiB each
    timer = StubTimer({"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": 1.02, "engine[e=3]": 1.01})
    assert tune(tmp_path / "c.json", timer).node("s0").options == {"e": 3}


def test_the_fastest_with_the_smallest_workspace_changes_nothing(monkeypatch, tmp_path):
    install_engines(monkeypatch, engines=(1, 0))
    report = tune(tmp_path / "c.json", StubTimer({"reference": 2.5, "engine[e=1]": 1.0, "engine[e=0]": 1.01}))
    assert report.node("s0").options == {"e": 1}
    assert all(c.reason == "" for c in report.node("s0").candidates)


def test_the_report_says_why_the_slower_candidate_won(monkeypatch, tmp_path):
    install_engines(monkeypatch)
    path = tmp_path / "c.json"
    report = tune(path, StubTimer({"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": 1.02}))
    t = rows(report)
    why = ("within 3 % of the fastest engine[e=0] (1.020 vs 1.000 ms), 290.0 MiB less workspace "
           "(workspace_tolerance)")
    assert t["engine[e=1]"].reason == why
    assert t["engine[e=0]"].reason == "fastest, but engine[e=1] is within 3 % with 290.0 MiB less workspace"
    text = report.format()
    assert why in text and "fastest, but engine[e=1]" in text
    again = tune(path, StubTimer({}))  # from the cache: the rows keep their reasons
    assert again.node("s0").how == "cache" and rows(again)["engine[e=1]"].reason == why


def test_pruned_candidates_do_not_compete():
    """Only rows timed in full are near-fastest: one timed run is not a median."""
    fast = Candidate("engine", {"e": 0}, time_ms=1.0, workspace=300 * MIB)
    once = Candidate("engine", {"e": 1}, time_ms=1.01, workspace=0, reason="pruned after 1 timed run")
    assert choose([fast, once], [fast], 0.03) is fast and fast.status == "chosen" and once.status == "ok"
    again = [Candidate("engine", {"e": 0}, time_ms=1.0, workspace=300 * MIB),
             Candidate("engine", {"e": 1}, time_ms=1.01, workspace=0)]
    assert choose(again, again, 0.03) is again[1]
    assert choose([Candidate("x", status="wrong"), Candidate("y", status="failed")], [], 0.03) is None


def test_a_cached_decision_is_chosen_again_under_another_tolerance(monkeypatch, tmp_path):
    # the entry keeps every candidate's measurements: a new tolerance re-chooses
    # from them, with nothing timed again and one entry in the file
    install_engines(monkeypatch)
    path = tmp_path / "c.json"
    times = {"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": 1.02}
    assert tune(path, StubTimer(times)).node("s0").options == {"e": 1}
    counter = StubTimer({})
    for tol, engine in ((0, 0), (0.03, 1), (0.01, 0)):
        report = tune(path, counter, workspace_tolerance=tol)
        assert report.node("s0").how == "cache" and report.node("s0").options == {"e": engine}, tol
        assert [c.label for c in report.node("s0").candidates if c.status == "chosen"] == [f"engine[e={engine}]"]
    assert counter.calls == []
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_an_entry_written_before_the_tie_break_keeps_its_choice(monkeypatch, tmp_path):
    """Entries of earlier versions (no ``rechoose`` tag: rows not all checked
    as today's, the output dtype among them) are read, not re-tuned, and keep
    their algorithm and options whatever the tolerance."""
    install_engines(monkeypatch)
    key = tune(tmp_path / "probe.json", StubTimer({})).node("s0").cache_key
    old_rows = [{"algorithm": "reference", "options": {}, "status": "ok", "time_ms": 2.5, "workspace": 0},
                {"algorithm": "engine", "options": {"e": 0}, "status": "chosen", "time_ms": 1.0,
                 "workspace": ENGINE_WS[0]},
                {"algorithm": "engine", "options": {"e": 1}, "status": "ok", "time_ms": 1.02,
                 "workspace": ENGINE_WS[1]}]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "opgraph-autotune/1", "entries": {
        key: {"algorithm": "engine", "options": {"e": 0}, "candidates": old_rows}}}))
    timer = StubTimer({})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = tune(path, timer)
    assert report.node("s0").how == "cache" and report.node("s0").options == {"e": 0} and not timer.calls
    assert tune(path, timer, workspace_tolerance=0.5).node("s0").options == {"e": 0}


@pytest.mark.parametrize("value, expected", [
    (0, 0.0), (0.05, 0.05), (1, 1.0), ("3%", 0.03), (" 2.5 % ", 0.025), ("0.1", 0.1), ("1e-2", 0.01),
])
def test_parse_fraction(value, expected):
    assert parse_fraction(value) == pytest.approx(expected)


#: the autotune tolerances and their defaults (3 %; peak_tolerance 20 %: AlexNet's
#: stem backward-filter in 4 pieces is 14-16 % slower on the H200)
TOLERANCES = [("workspace_tolerance", 0.03), ("peak_tolerance", 0.20)]


@pytest.mark.parametrize("key, default", TOLERANCES)
def test_tolerance_from_a_file(tmp_path, key, default):
    path = tmp_path / "policy.toml"
    path.write_text(f'{key} = "5%"\n')
    assert getattr(LoweringPolicy.from_toml(path), key) == 0.05
    path.write_text(f"{key} = 0\n")
    assert getattr(LoweringPolicy.from_toml(path), key) == 0


@pytest.mark.parametrize("key, default", TOLERANCES)
def test_the_default_tolerance_and_round_trips(key, default):
    assert getattr(LoweringPolicy(), key) == default
    p = LoweringPolicy(**{key: "5%"})
    assert p.to_dict()[key] == 0.05 and LoweringPolicy.from_mapping(p.to_dict()) == p
    assert getattr(LoweringPolicy.from_mapping(LoweringPolicy(**{key: 0}).to_dict()), key) == 0


@pytest.mark.parametrize("key", [k for k, _ in TOLERANCES])
@pytest.mark.parametrize("text, value", [
    ("{} = -0.1", "-0.1"), ("{} = 3", "3"),  # 3 meant as 3 %
    ('{} = "lots"', "lots"), ("{} = true", "True"), ("{} = nan", "nan"), ('{} = "150%"', "150%"),
])
def test_bad_tolerance_in_a_file_names_file_key_and_value(tmp_path, key, text, value):
    path = tmp_path / "policy.toml"
    path.write_text(text.format(key))
    with pytest.raises(PolicyError) as e:
        LoweringPolicy.from_toml(path)
    msg = str(e.value)
    assert str(path) in msg and key in msg and value in msg and "fraction" in msg


def test_tolerance_flag():
    assert LoweringPolicy.from_cli(workspace_tolerance="5%").workspace_tolerance == 0.05
    assert LoweringPolicy.from_cli().workspace_tolerance == 0.03
    with pytest.raises(PolicyError) as e:
        LoweringPolicy.from_cli(workspace_tolerance="-1")
    assert "--workspace-tolerance" in str(e.value) and "'-1'" in str(e.value)


def test_a_candidate_that_changes_the_dtype_is_wrong(monkeypatch, tmp_path):
    # CuPy's where() once returned float32 for bf16 operands: a candidate with
    # right values but another dtype would make every later value float32
    def promoted(ctx, op, x):
        return (2 * x).astype("float32")

    registry.rules_for(Scale)
    monkeypatch.setitem(registry._RULES, Scale, {"reference": SCALE_RULES["reference"],
                                                 "promoted": Rule(Scale, "promoted", promoted)})
    g = og.Graph()
    out = g.add_node(Scale(), [g.input("x", (4, 5), "bfloat16")], name="s0")
    ctx = PassContext(policy=LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json")),
                      timer=StubTimer({"reference": 2.0, "promoted": 1.0}),
                      versions=lambda: {"numpy": "2.4.0"}, device_name=lambda: "test-cpu")
    Pipeline("t", [LowerPass(), AutotunePass()]).run(g, [out], ctx)
    t = rows(ctx.report)
    assert ctx.report.node("s0").algorithm == "reference"
    assert t["promoted"].status == "wrong" and t["promoted"].reason == \
        "returns float32, the node's type is bfloat16"


def test_a_numpy_float_is_a_fraction():
    import numpy as np
    assert LoweringPolicy(peak_tolerance=np.float32(0.5)).peak_tolerance == 0.5
    with pytest.raises(PolicyError):
        LoweringPolicy(peak_tolerance=np.float64(1.5))
