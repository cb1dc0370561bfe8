"""Hand edits of an autotune cache entry's top-level ``algorithm``/``options``
(``passes.autotune.hand_edit``): an edit to another candidate whose row is
correct is used and the report says so; any other edit is not used and a
``RuntimeWarning`` names the node, the edited choice, the one used instead
and why. The tuner records its own choice in the entry's ``tuned``, so a
changed ``workspace_tolerance`` (the rows chosen from again) is no edit."""

import json
import warnings

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends import registry
from opgraph.backends.registry import Rule
from opgraph.passes.autotune import AutotunePass
from opgraph.passes.base import PassContext, Pipeline
from opgraph.passes.lower import LowerPass
from opgraph.passes.policy import LoweringPolicy

from passes_stubs import SCALE_RULES, Scale, StubTimer

MIB = 2**20
WHY = "its transforms run on a handle that refuses stream capture"
#: e=0 the fastest (300 MiB of workspace), e=1 2 % slower with 10 MiB: the
#: default 3 % tolerance chooses e=1; ``wrong`` is fastest and wrong.
TIMES = {"reference": 2.5, "engine[e=0]": 1.0, "engine[e=1]": 1.02, "wrong": 0.5}


def install(monkeypatch, *extra):
    """Scale rules: the reference, ``engine`` (variants e=0 and e=1, workspace
    300 and 10 MiB) and ``extra`` ones of ``SCALE_RULES`` or given as rules."""
    engine = Rule(Scale, "engine", SCALE_RULES["fast"].kernel,
                  variants=lambda op, types, device: [{"e": 0}, {"e": 1}],
                  workspace=lambda op, types, options: (300 if options["e"] == 0 else 10) * MIB)
    registry.rules_for(Scale)  # load the backends first
    table = {"reference": SCALE_RULES["reference"], "engine": engine}
    for r in extra:
        r = SCALE_RULES[r] if isinstance(r, str) else r
        table[r.algorithm] = r
    monkeypatch.setitem(registry._RULES, Scale, table)


def tune(cache, timer, device="cpu", **policy):
    g = og.Graph()
    out = g.add_node(Scale(), [g.input("x", (4, 5))], name="s0")
    ctx = PassContext(device=device, xp=np, policy=LoweringPolicy(autotune=True, cache=str(cache), **policy),
                      timer=timer, versions=lambda: {"numpy": "2.4.0"}, device_name=lambda: "test")
    Pipeline("t", [LowerPass(), AutotunePass()]).run(g, [out], ctx)
    return ctx.report


def edit(path, algorithm, options, drop_tuned=False):
    """Set the (single) entry's top-level choice, as a user would in an editor."""
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    entry.update(algorithm=algorithm, options=options)
    if drop_tuned:
        entry.pop("tuned")
    path.write_text(json.dumps(data))


def statuses(report):
    return {c.label: c.status for c in report.node("s0").candidates}


def quiet_tune(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return tune(*args, **kw)


def test_the_tuner_records_its_own_choice(monkeypatch, tmp_path):
    install(monkeypatch)
    path = tmp_path / "c.json"
    assert tune(path, StubTimer(TIMES)).node("s0").options == {"e": 1}
    (entry,) = json.loads(path.read_text())["entries"].values()
    assert entry["tuned"] == {"algorithm": "engine", "options": {"e": 1}}
    assert (entry["algorithm"], entry["options"]) == ("engine", {"e": 1})


@pytest.mark.parametrize("algorithm, options, label", [("engine", {"e": 0}, "engine[e=0]"),
                                                       ("reference", {}, "reference")])
def test_an_edit_to_a_correct_row_is_used_and_reported(monkeypatch, tmp_path, algorithm, options, label):
    install(monkeypatch)
    path = tmp_path / "c.json"
    tune(path, StubTimer(TIMES))
    edit(path, algorithm, options)
    timer = StubTimer({})
    report = quiet_tune(path, timer)  # a note, not a warning: the edit is what the user asked for
    rec = report.node("s0")
    assert rec.how == "cache" and (rec.algorithm, rec.options) == (algorithm, options) and timer.calls == []
    assert statuses(report)[label] == "chosen" and statuses(report)["engine[e=1]"] == "ok"
    rows = {c.label: c for c in rec.candidates}
    assert "hand-edited in the autotune cache (the measurements choose engine[e=1])" in rows[label].reason
    assert f"hand-edited {label} is used instead" in rows["engine[e=1]"].reason
    (note,) = [n for n in report.notes if "hand-edited" in n]
    assert f"node s0: hand-edited choice {label} used" in note and "measurements alone choose engine[e=1]" in note
    # honoured again on the next compile, and under another tolerance: the file keeps the edit
    assert tune(path, timer, workspace_tolerance=0).node("s0").options == options
    (entry,) = json.loads(path.read_text())["entries"].values()
    assert (entry["algorithm"], entry["options"]) == (algorithm, options)


def test_an_edit_to_a_wrong_row_is_not_used_and_says_why(monkeypatch, tmp_path):
    install(monkeypatch, "wrong")
    path = tmp_path / "c.json"
    assert tune(path, StubTimer(TIMES)).node("s0").options == {"e": 1}
    edit(path, "wrong", {})
    with pytest.warns(RuntimeWarning, match=r"node s0: hand-edited choice wrong is not used: its measured row "
                                            r"is wrong \(relative error .*\); engine\[e=1\] chosen from the "
                                            r"entry's measured candidates instead"):
        report = tune(path, StubTimer({}))
    assert report.node("s0").how == "cache" and report.node("s0").options == {"e": 1}
    assert statuses(report)["engine[e=1]"] == "chosen" and statuses(report)["wrong"] == "wrong"
    assert any("hand-edited choice wrong is not used" in n for n in report.notes)


def test_an_edit_to_no_measured_candidate_is_not_used(monkeypatch, tmp_path):
    install(monkeypatch)
    path = tmp_path / "c.json"
    tune(path, StubTimer(TIMES))
    edit(path, "engnie", {"e": 0})  # a typo: no such rule
    with pytest.warns(RuntimeWarning, match=r"node s0: hand-edited choice engnie\[e=0\] is not used: it is not "
                                            r"among the entry's measured candidates \(reference, engine\[e=0\], "
                                            r"engine\[e=1\]\); engine\[e=1\] chosen"):
        assert tune(path, StubTimer({})).node("s0").options == {"e": 1}


def test_an_edit_to_options_the_kernel_refuses_is_reported_and_retuned(monkeypatch, tmp_path):
    # the documented Winograd tile = 7 case: options that are none of the rule's variants
    install(monkeypatch)
    path = tmp_path / "c.json"
    tune(path, StubTimer(TIMES))
    edit(path, "engine", {"e": 7})
    timer = StubTimer(TIMES)
    with pytest.warns(RuntimeWarning, match=r"node s0: cached options \{'e': 7\} of engine are not among its "
                                            r"variants.*re-tuned"):
        report = tune(path, timer)
    assert report.node("s0").how == "autotune" and report.node("s0").options == {"e": 1} and timer.calls
    (entry,) = json.loads(path.read_text())["entries"].values()
    assert entry["options"] == {"e": 1} == entry["tuned"]["options"]


def test_an_uncapturable_edit_is_not_used_when_the_step_is_replayed_as_cuda_graphs(monkeypatch, tmp_path):
    install(monkeypatch, Rule(Scale, "split", SCALE_RULES["fast"].kernel, capturable=WHY))
    path = tmp_path / "c.json"
    times = {**TIMES, "split": 0.99}  # faster, by less than a split of the replay costs (EAGER_STEP_MS)
    assert tune(path, StubTimer(times), device="cuda", cuda_graph=True).node("s0").options == {"e": 1}
    edit(path, "split", {})
    with pytest.warns(RuntimeWarning, match=r"hand-edited choice split is not used: it cannot be captured into "
                                            rf"a CUDA graph \({WHY}\).*\(cuda_graph\); engine\[e=1\] chosen"):
        assert tune(path, StubTimer({}), device="cuda", cuda_graph=True).node("s0").options == {"e": 1}
    # eager, the same edit is the rows' own choice (the fastest): nothing to report
    assert quiet_tune(path, StubTimer({}), device="cuda").node("s0").algorithm == "split"


def test_an_edit_to_an_uncapturable_variant_is_not_used_when_the_step_is_replayed(monkeypatch, tmp_path):
    install(monkeypatch)
    table = registry._RULES[Scale]  # engine e=0 (the fastest) declares it does not capture; e=1 does
    table["engine"] = attrs.evolve(table["engine"], capturable=True,
                                   variant_capture_blocker=lambda options: WHY if options.get("e") == 0 else None)
    path = tmp_path / "c.json"
    assert tune(path, StubTimer(TIMES), device="cuda", cuda_graph=True,
                workspace_tolerance=0).node("s0").options == {"e": 1}
    edit(path, "engine", {"e": 0})
    with pytest.warns(RuntimeWarning, match=r"hand-edited choice engine\[e=0\] is not used: it cannot be captured "
                                            rf"into a CUDA graph \({WHY}\).*\(cuda_graph\); engine\[e=1\] chosen"):
        assert tune(path, StubTimer({}), device="cuda", cuda_graph=True,
                    workspace_tolerance=0).node("s0").options == {"e": 1}
    # eager, the same edit is the rows' own choice (the fastest): nothing to report
    assert quiet_tune(path, StubTimer({}), device="cuda", workspace_tolerance=0).node("s0").options == {"e": 0}


def test_an_entry_without_the_tuners_record_says_it_cannot_tell(monkeypatch, tmp_path):
    install(monkeypatch)
    path = tmp_path / "c.json"
    tune(path, StubTimer(TIMES))
    edit(path, "engine", {"e": 0}, drop_tuned=True)
    with pytest.warns(RuntimeWarning, match=r"node s0: the entry's choice engine\[e=0\] is not used: "
                                            r"engine\[e=1\] chosen .*workspace_tolerance 0.03.*no \"tuned\""):
        assert tune(path, StubTimer({})).node("s0").options == {"e": 1}


def test_a_changed_tolerance_is_no_edit(monkeypatch, tmp_path):
    install(monkeypatch)
    path = tmp_path / "c.json"
    tune(path, StubTimer(TIMES))
    # peak_tolerance 0: this graph's activations are 80 bytes, so the memory-aware
    # re-choice would take e=1 back for its smaller workspace (test_autotune_peak.py)
    report = quiet_tune(path, StubTimer({}), workspace_tolerance=0, peak_tolerance=0)
    assert report.node("s0").options == {"e": 0} and not any("hand-edited" in n for n in report.notes)


def test_a_real_convolution_runs_the_hand_edited_algorithm(tmp_path):
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8)), g.param("w", (4, 3, 3, 3))
    y = og.conv2d(x, w, padding=1, name="conv")
    rng = np.random.default_rng(0)
    feeds = dict(x=rng.standard_normal((2, 3, 8, 8)), w=rng.standard_normal((4, 3, 3, 3)))
    path = tmp_path / "c.json"
    policy = LoweringPolicy(autotune=True, cache=str(path), exclude=["fused"])
    first = og.compile([y], policy=policy).report.nodes["conv"]
    (entry,) = json.loads(path.read_text())["entries"].values()
    # neither the node's choice nor the tuner's own (the memory-aware re-choice may
    # have moved the node off it): editing the entry to the latter is no edit
    other = next(c for c in first.candidates if c.status == "ok" and c.algorithm != first.algorithm
                 and c.algorithm != entry["tuned"]["algorithm"])
    edit(path, other.algorithm, other.options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        exe = og.compile([y], policy=policy)
    rec = exe.report.nodes["conv"]
    assert rec.how == "cache" and (rec.algorithm, rec.options) == (other.algorithm, other.options)
    assert exe.report.choices["conv"].startswith(other.algorithm)
    (got,) = exe(**feeds)
    (want,) = og.compile([y], pipeline="reference", dtype="float64")(**feeds)
    assert np.linalg.norm(got - want) <= 1e-3 * np.linalg.norm(want)


def edit_rows(path, change):
    """Apply ``change(row)`` to every candidate row of the (single) entry."""
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    for row in entry["candidates"]:
        change(row)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("bad", [-1e9, float("nan"), float("inf")])
def test_a_row_time_that_is_no_time_is_reported_and_retuned(monkeypatch, tmp_path, bad):
    """A fresh user set one row's time_ms to -1e9 and its algorithm won."""
    install(monkeypatch)
    path = tmp_path / "c.json"
    tune(path, StubTimer(TIMES))
    edit_rows(path, lambda row: row.update(time_ms=bad) if row["algorithm"] == "reference" else None)
    timer = StubTimer(TIMES)
    with pytest.warns(RuntimeWarning, match=r"node s0: row 'reference' has time_ms .* not a finite time >= 0; "
                                            r"re-tuned"):
        report = tune(path, timer)
    assert report.node("s0").how == "autotune" and report.node("s0").options == {"e": 1} and timer.calls


def test_an_entry_with_no_correct_row_is_reported_and_retuned(monkeypatch, tmp_path):
    """Every row edited to ``wrong``: the cached choice was used as a hit, silently."""
    install(monkeypatch)
    path = tmp_path / "c.json"
    tune(path, StubTimer(TIMES))
    edit_rows(path, lambda row: row.update(status="wrong"))
    timer = StubTimer(TIMES)
    with pytest.warns(RuntimeWarning, match=r"node s0: no row is correct \(every row's status is wrong\); re-tuned"):
        report = tune(path, timer)
    assert report.node("s0").how == "autotune" and timer.calls


def test_a_correct_row_without_a_time_is_reported_and_retuned(monkeypatch, tmp_path):
    """A hand edit set a correct row's time_ms to null: choosing from the rows compared
    None with a float (TypeError) instead of re-tuning the node."""
    install(monkeypatch)
    path = tmp_path / "c.json"
    tune(path, StubTimer(TIMES))
    edit_rows(path, lambda row: row.update(time_ms=None) if row["algorithm"] == "reference" else None)
    timer = StubTimer(TIMES)
    with pytest.warns(RuntimeWarning, match=r"node s0: row 'reference' is \w+ without a time_ms .*; re-tuned"):
        report = tune(path, timer)
    assert report.node("s0").how == "autotune" and timer.calls


def set_wrong_row(**fields):
    """``edit_rows``'s change: the ``wrong`` row (fastest, never timed) gets ``fields``."""
    return lambda row: row.update(fields) if row["algorithm"] == "wrong" else None


def set_reference_row(**fields):
    return lambda row: row.update(fields) if row["algorithm"] == "reference" else None


@pytest.mark.parametrize("change, said", [
    # fresh-user report: an fft row edited so; it was chosen from the cache with no warning
    (set_wrong_row(status="ok", rel_error=5.0, tolerance=1e-3, time_ms=0),
     r"row 'wrong' is ok but its rel_error 5 is above its tolerance 0\.001 \(the tuner marks such a row wrong\)"),
    (set_wrong_row(status="ok", time_ms=0.1),
     r"row 'wrong' is ok but its rel_error [0-9.e+-]+ is above its tolerance 0\.001"),
    (set_wrong_row(status="unverified", rel_error=float("nan"), time_ms=0.1),
     r"row 'wrong' is unverified but its rel_error is NaN"),
    # a row without a status read as ok; one of an unknown status was skipped silently
    (lambda row: row.pop("status") if row["algorithm"] == "reference" else None,
     r"row 'reference' has no status \(every row the tuner writes has one: chosen, ok, wrong, failed, "
     r"over budget, declined, excluded, unverified\)"),
    (set_reference_row(status="weird"), r"row 'reference' has status 'weird', not one of chosen, ok, wrong"),
    (lambda row: row.update(status="Ok") if row["options"] == {"e": 1} else None,
     r"row 'engine\[e=1\]' has status 'Ok', not one of"),
], ids=["ok-wrong-and-zero-time", "ok-above-tolerance", "nan-error", "no-status", "weird", "case"])
def test_a_row_that_contradicts_itself_is_reported_and_retuned(monkeypatch, tmp_path, change, said):
    install(monkeypatch, "wrong")
    path = tmp_path / "c.json"
    assert tune(path, StubTimer(TIMES)).node("s0").options == {"e": 1}
    edit_rows(path, change)
    timer = StubTimer(TIMES)
    with pytest.warns(RuntimeWarning, match=rf"autotune cache {path}: node s0: {said}.*; re-tuned$"):
        report = tune(path, timer)
    rec = report.node("s0")
    assert rec.how == "autotune" and (rec.algorithm, rec.options) == ("engine", {"e": 1}) and timer.calls
    assert statuses(report)["wrong"] == "wrong"
    # the re-tuned entry replaced the edited one: the next compile reuses it quietly
    again = StubTimer({})
    assert quiet_tune(path, again).node("s0").how == "cache" and again.calls == []


def test_a_correct_row_timed_at_zero_is_reused_quietly(monkeypatch, tmp_path):
    """A step that does no work (a zero-copy view) or runs below the clock's resolution measures
    0 ms: the tuner writes that time, and the next compile reuses the decision, timing nothing
    and warning nothing (a check refusing ``time_ms`` 0 re-tuned such a node at every compile)."""
    install(monkeypatch)
    path = tmp_path / "c.json"
    times = {**TIMES, "engine[e=1]": 0.0, "engine[e=0]": 0.0}
    assert quiet_tune(path, StubTimer(times)).node("s0").how == "autotune"
    (entry,) = json.loads(path.read_text())["entries"].values()
    assert entry["time_ms"] == 0.0 and {r["time_ms"] for r in entry["candidates"] if r["status"] == "ok"} >= {0.0}
    again = StubTimer(times)
    report = quiet_tune(path, again)
    assert report.node("s0").how == "cache" and again.calls == []
    assert report.node("s0").options == {"e": 1}  # both 0 ms: the smaller workspace (workspace_tolerance)
    edit_rows(path, set_reference_row(time_ms=0.0, min_ms=0.0))  # a row edited to 0: a time, reused
    assert quiet_tune(path, StubTimer({})).node("s0").how == "cache"


def rows_of(path) -> list[dict]:
    return [row for entry in json.loads(path.read_text())["entries"].values() for row in entry["candidates"]]


def test_rows_as_the_tuner_writes_them_are_reused_without_a_report(monkeypatch, tmp_path):
    """Every status the tuner writes (chosen rows excepted: it writes the rows
    before choosing), pruned and untimed rows, unverified ones of an op
    without a reference: saved, reloaded and reused, quietly, timing nothing."""
    from opgraph.passes.autotune_reuse import entry_problem

    picky = Rule(Scale, "picky", SCALE_RULES["fast"].kernel, check=lambda op, types, device: "needs a GPU")
    install(monkeypatch, "wrong", "nan", "boom", "big", "slow", "extra", picky)
    path = tmp_path / "c.json"
    times = {**TIMES, "slow": 50.0}  # pruned after one run
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tune(path, StubTimer(times), workspace_limit=100 * MIB, exclude=["extra"])
    written = {row["status"] for row in rows_of(path)}
    assert written == {"ok", "wrong", "failed", "over budget", "excluded", "declined"}, written
    assert any("pruned" in row["reason"] for row in rows_of(path))

    def reused_quietly(p):
        assert all(entry_problem(e) is None for e in json.loads(p.read_text())["entries"].values())
        timer = StubTimer({})
        report = quiet_tune(p, timer, workspace_limit=100 * MIB, exclude=["extra"])
        return report.node("s0").how == "cache" and timer.calls == []

    assert reused_quietly(path)
    # an op without a reference rule: its rows are unverified
    monkeypatch.setitem(registry._RULES, Scale, {k: v for k, v in registry._RULES[Scale].items() if k != "reference"})
    bare = tmp_path / "bare.json"
    quiet_tune(bare, StubTimer(times), workspace_limit=100 * MIB, exclude=["extra"])
    assert "unverified" in {row["status"] for row in rows_of(bare)}
    assert reused_quietly(bare)


def test_a_real_convolutions_rows_are_reused_without_a_report(tmp_path):
    """The rows the tuner writes with the real timer and reference (relative
    errors and tolerances of gemm, fft, winograd): reused quietly."""
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8)), g.param("w", (4, 3, 3, 3))
    y = og.conv2d(x, w, padding=1, name="conv")
    outs = [y, *og.grad(y, [x, w])]
    policy = LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        og.compile(outs, policy=policy)
        counter = StubTimer({})
        again = og.compile(outs, policy=policy, timer=counter)
    assert counter.calls == [] and {r.how for r in again.report.nodes.values() if r.candidates} == {"cache"}
    assert any(row.get("rel_error") for row in rows_of(tmp_path / "c.json"))


def test_the_h200_cache_in_the_results_passes_every_check():
    """48,251 correct rows the tuner wrote on the H200 (docs/results): not one
    is taken for a contradiction, so no GPU run re-tunes a node for it."""
    import gzip
    from pathlib import Path

    from opgraph.passes.autotune_cache import entry_defect
    from opgraph.passes.autotune_reuse import entry_problem

    path = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200-2026-12-04f" / "autotune-cache.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} is not in this checkout")
    entries = json.loads(gzip.decompress(path.read_bytes()))["entries"]
    assert len(entries) > 5000
    bad = {k: why for k, e in entries.items() if (why := entry_defect(e) or entry_problem(e))}
    assert not bad, next(iter(bad.items()))


def _edit_to_wrong(path):
    edit(path, "wrong", {})


def _edit_to_refused_options(path):
    edit(path, "engine", {"e": 7})


def _blocked(path):
    """A cache whose folder is a file: it cannot be read, and the pass's save at its end fails."""
    path.write_text("")
    return path / "c.json"


@pytest.mark.parametrize("spoil, said", [
    (_edit_to_wrong, "hand-edited choice wrong is not used"),  # the pass's, after the re-choice
    (_edit_to_refused_options, "are not among its variants"),  # the pass's, while reading entries
    (_blocked, "cannot be written"),  # the save at the pass's end
])
def test_every_cache_warning_obeys_a_filter_scoped_to_the_cache_module(monkeypatch, tmp_path, spoil, said):
    """The pass's warnings were issued two frames up from ``AutotuneCache.warn``,
    so attributed to ``passes/base.py`` (a failed save's to ``passes/autotune.py``):
    ``filterwarnings('ignore', module='opgraph.passes.autotune_cache')`` hid the
    corrupt-file warning but not these. The report keeps them all the same."""
    from opgraph.passes import autotune_cache

    install(monkeypatch, "wrong")
    for scoped in (False, True):
        path = tmp_path / f"c{int(scoped)}.json"
        tune(path, StubTimer(TIMES))
        path = spoil(path) or path  # spoiled again for each compile: a re-tune mends it
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if scoped:
                warnings.filterwarnings("ignore", module=r"opgraph\.passes\.autotune_cache")
            report = tune(path, StubTimer(TIMES))
        assert any(said in n for n in report.notes)
        if scoped:
            assert [str(w.message) for w in caught] == []
        else:
            assert any(said in str(w.message) for w in caught)
            assert {w.filename for w in caught} == {autotune_cache.__file__}
