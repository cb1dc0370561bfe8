"""The autotune pass: fastest correct candidate, cache behaviour, reports."""

import json
import os
import re
import stat

import numpy as np
import pytest

import opgraph as og
from opgraph.errors import LoweringError
from opgraph.passes.autotune import AutotunePass, relative_error, tolerance
from opgraph.passes.autotune_cache import AutotuneCache, default_path
from opgraph.passes.base import PassContext, Pipeline
from opgraph.passes.lower import LowerPass
from opgraph.passes.policy import LoweringPolicy

from passes_stubs import Scale, StubTimer, install_scale_rules

VERSIONS_A = {"numpy": "2.4.0", "lib": "1"}


def scale_graph(n=1):
    g = og.Graph()
    x = g.input("x", (4, 5))
    outs = [g.add_node(Scale(), [x], name=f"s{i}") for i in range(n)]
    return g, outs


def tune(outs, cache, timer, versions=VERSIONS_A, **policy):
    policy = LoweringPolicy(autotune=True, cache=str(cache), **policy)
    ctx = PassContext(policy=policy, timer=timer, versions=lambda: dict(versions),
                      device_name=lambda: "test-cpu")
    g, _ = Pipeline("t", [LowerPass(), AutotunePass()]).run(outs[0].graph, outs, ctx)
    return g, ctx.report


def table(report, name="s0"):
    return {c.label: c for c in report.node(name).candidates}


def test_picks_the_fastest_correct_candidate(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow", "wrong", "nan", "boom"])
    timer = StubTimer({"fast": 1.0, "slow": 5.0, "reference": 3.0, "wrong": 0.1, "nan": 0.1, "boom": 0.1})
    g, report = tune(scale_graph()[1], tmp_path / "c.json", timer)
    rec = report.node("s0")
    assert rec.algorithm == "fast" and rec.how == "autotune"
    t = table(report)
    assert t["fast"].status == "chosen" and t["fast"].time_ms == pytest.approx(1.0)
    assert t["slow"].status == "ok" and t["reference"].status == "ok"
    assert t["wrong"].status == "wrong" and t["wrong"].rel_error > 0.1
    assert t["nan"].status == "wrong"  # NaN never passes
    assert t["boom"].status == "failed" and "kernel exploded" in t["boom"].reason
    # wrong ones are never timed; 'slow' (5 ms > 3 x 1 ms) is pruned after one timed run
    assert timer.calls == ["reference", "reference", "fast", "fast", "slow"]
    assert "pruned" in t["slow"].reason and "pruned" not in t["reference"].reason
    assert g.node(rec.node).op.algorithm == "fast"


def test_over_budget_candidate_is_skipped(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "big", "slow"])
    timer = StubTimer({"big": 0.5, "slow": 2.0, "reference": 3.0})
    _, report = tune(scale_graph()[1], tmp_path / "c.json", timer, workspace_limit=1000)
    t = table(report)
    assert t["big"].status == "over budget" and t["big"].workspace == 10**9
    assert report.node("s0").algorithm == "slow"
    assert "big" not in timer.calls


def test_variants_are_separate_candidates(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "tiles"])
    timer = StubTimer({"tiles[t=1]": 4.0, "tiles[t=2]": 2.0, "reference": 3.0})
    _, report = tune(scale_graph()[1], tmp_path / "c.json", timer)
    assert report.node("s0").options == {"t": 2}
    assert report.node("s0").chosen.startswith("tiles[cpu, t=2]")


def test_declined_and_excluded_candidates_are_listed(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    _, report = tune(scale_graph()[1], tmp_path / "c.json", StubTimer({}), exclude=["slow"])
    assert table(report)["slow"].status == "excluded"


def test_second_run_reads_the_cache_without_timing(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    path = tmp_path / "c.json"
    first = StubTimer({"fast": 1.0, "slow": 5.0, "reference": 3.0})
    g, outs = scale_graph(2)  # two identical nodes: the second reuses the first's decision
    _, report = tune(outs, path, first)
    assert set(first.calls) == {"fast", "slow", "reference"}
    assert report.node("s1").how == "cache"
    second = StubTimer({"slow": 0.1})  # would now pick 'slow' if it timed anything
    _, report = tune(outs, path, second)
    assert second.calls == []
    assert report.node("s0").how == "cache" and report.node("s0").algorithm == "fast"
    assert table(report)["fast"].status == "chosen"  # the table comes back from the cache
    data = json.loads(path.read_text())
    (key,) = data["entries"]
    assert "Scale()" in key and "float32[4x5]" in key and "numpy=2.4.0" in key and "test-cpu" in key


def test_keys_from_other_versions_are_never_reused(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    path = tmp_path / "c.json"
    outs = scale_graph()[1]
    tune(outs, path, StubTimer({"fast": 1.0}))
    timer = StubTimer({"slow": 1.0})
    _, report = tune(outs, path, timer, versions={**VERSIONS_A, "lib": "2"})
    assert set(timer.calls) == {"fast", "slow", "reference"} and report.node("s0").algorithm == "slow"
    assert len(json.loads(path.read_text())["entries"]) == 2


def test_a_new_candidate_invalidates_cached_decisions(monkeypatch, tmp_path):
    """Decisions taken before a rule existed (or enumerated other variants) are
    not reused: the key names the competing rules and their variant functions."""
    install_scale_rules(monkeypatch, ["reference", "fast"])
    path, outs = tmp_path / "c.json", scale_graph()[1]
    tune(outs, path, StubTimer({"fast": 1.0}))
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])  # a new competitor
    timer = StubTimer({"fast": 1.0, "slow": 0.2})
    _, report = tune(outs, path, timer)
    assert report.node("s0").how == "autotune" and report.node("s0").algorithm == "slow"
    keys = list(json.loads(path.read_text())["entries"])
    assert len(keys) == 2 and any("candidates=fast:" in k and "slow:" not in k for k in keys)


def test_cached_choice_that_no_longer_applies_is_retuned(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    path, outs = tmp_path / "c.json", scale_graph()[1]
    tune(outs, path, StubTimer({"fast": 1.0}))
    timer = StubTimer({"slow": 1.0})
    _, report = tune(outs, path, timer, exclude=["fast"])
    assert report.node("s0").algorithm == "slow" and timer.calls


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": "other", "entries": {}}',
                                     '{"format": "opgraph-autotune/1", "entries": {"k": 3}}',
                                     b"\x00\xffgarbage",  # not even UTF-8
                                     "[" * 100000 + "]" * 100000,  # the parser's recursion limit
                                     # rows the tuner would choose from again (rechoose): wrong shapes
                                     *('{"format": "opgraph-autotune/1", "entries": {"k": {"algorithm": '
                                       '"fast", "options": {}, "candidates": %s}}}' % rows
                                       for rows in ('"oops"', "[1, 2]", '[{"algorithm": "fast", '
                                                    '"time_ms": "quick"}]', '[{"algorithm": "fast", '
                                                    '"reason": null}]', "[{}]"))])
def test_corrupt_cache_warns_and_is_rebuilt(monkeypatch, tmp_path, content):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    path = tmp_path / "c.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.warns(RuntimeWarning, match=str(path)):
        _, report = tune(scale_graph()[1], path, StubTimer({"fast": 1.0}))
    assert report.node("s0").algorithm == "fast"
    assert any("corrupt" in n or "wrong format" in n for n in report.notes)
    assert len(json.loads(path.read_text())["entries"]) == 1
    assert not list(tmp_path.glob(".autotune-*"))  # no temporary left behind


@pytest.mark.parametrize("content, found", [
    ("[]", "an array"), ("3", "a number"), ('"cache"', "a string"), ("null", "null"),
    ('{"format": "opgraph-autotune/1", "entries": []}', '"entries" is an array'),
    ('{"format": "opgraph-autotune/1", "entries": "x"}', '"entries" is a string'),
    ('{"format": "opgraph-autotune/1"}', 'no "entries"'),
    ('{"format": 1, "entries": {}}', '"format" is 1'),
    ('{"entries": {}}', 'no "format"')])
def test_a_cache_of_the_wrong_shape_is_reported_as_the_wrong_format_naming_the_file(
        monkeypatch, tmp_path, content, found):
    """Fresh-user report: a cache file holding ``[]`` (valid JSON, the wrong
    shape) was reported with Python's words (``TypeError: list indices must be
    integers``). The report names the file and what is wrong in JSON's terms;
    the file is rebuilt."""
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.warns(RuntimeWarning) as caught:
        _, report = tune(scale_graph()[1], path, StubTimer({"fast": 1.0}))
    (message,) = [str(w.message) for w in caught if "autotune cache" in str(w.message)]
    assert message == (f"autotune cache {path} is of the wrong format: {found}, where an opgraph-autotune/1 "
                       'file is an object with "format": "opgraph-autotune/1" and an object "entries"; it will '
                       "be rebuilt")
    assert report.node("s0").algorithm == "fast" and message in report.notes
    assert json.loads(path.read_text())["format"] == "opgraph-autotune/1"


@pytest.mark.parametrize("content, said", [("{not json", "is corrupt: not JSON (Expecting property name"),
                                           (b"\x00\xff", "is corrupt: not UTF-8 text (invalid start byte"),
                                           ("[" * 100000 + "]" * 100000, "is corrupt: JSON nested too deep")])
def test_a_corrupt_cache_is_reported_without_pythons_exception_names(monkeypatch, tmp_path, content, said):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    path = tmp_path / "c.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.warns(RuntimeWarning) as caught:
        tune(scale_graph()[1], path, StubTimer({"fast": 1.0}))
    (message,) = [str(w.message) for w in caught if "autotune cache" in str(w.message)]
    assert message.startswith(f"autotune cache {path} {said}") and message.endswith("; it will be rebuilt")
    assert "Error" not in message, message  # ValueError, JSONDecodeError, TypeError: Python's words


def test_a_corrupt_entry_is_dropped_alone_and_the_others_are_kept(monkeypatch, tmp_path):
    """One malformed entry (a hand edit) is reported by its key and tuned again;
    the valid entries beside it are still used, not re-timed."""
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    path = tmp_path / "c.json"
    outs = scale_graph()[1]
    tune(outs, path, StubTimer({"fast": 1.0}))
    data = json.loads(path.read_text())
    good = dict(data["entries"])
    data["entries"]["someone else's node"] = {"algorithm": "fast", "options": {}, "candidates": [{"time_ms": "quick"}]}
    path.write_text(json.dumps(data))
    timer = StubTimer({"fast": 1.0})
    # the message says what is wrong with the entry, not only its key (fresh-user report)
    with pytest.warns(RuntimeWarning, match="1 corrupt entry dropped .*someone else's node.: its candidate row 0's "
                                            "\"algorithm\" is null, not a string\\); the other 1 kept"):
        _, report = tune(outs, path, timer)
    assert report.node("s0").algorithm == "fast" and not timer.calls  # the good entry was a hit
    assert json.loads(path.read_text())["entries"].keys() >= good.keys()


@pytest.mark.parametrize("entry, why", [
    ([], "the entry is an array, not an object"),
    ({"algorithm": 3}, '"algorithm" is a number, not a string'),
    ({"algorithm": "gemm", "options": []}, '"options" is an array, not an object'),
    ({"algorithm": "gemm", "candidates": {}}, '"candidates" is an object, not an array'),
    ({"algorithm": "gemm", "candidates": [{"algorithm": "gemm", "time_ms": "quick"}]},
     'candidate row 0\'s "time_ms" is a string, not a number or null'),
    ({"algorithm": "gemm", "candidates": [{"algorithm": "gemm", "time_ms": 1.5, "status": "ok"}]}, None),
])
def test_entry_defect_says_what_is_wrong_in_json_words(entry, why):
    from opgraph.passes.autotune_cache import entry_defect

    got = entry_defect(entry)
    assert (got is None) if why is None else (why in got)


def test_no_correct_candidate_is_an_error(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "wrong", "boom"])
    with pytest.raises(LoweringError, match="no correct candidate"):
        tune(scale_graph()[1], tmp_path / "c.json", StubTimer({}), exclude=["reference"])


def test_forced_nodes_are_not_tuned(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    timer = StubTimer({"fast": 1.0})
    _, report = tune(scale_graph()[1], tmp_path / "c.json", timer, force={"s0": "slow"})
    assert report.node("s0").algorithm == "slow" and timer.calls == []


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("OPGRAPH_CACHE", str(tmp_path / "dir"))
    assert default_path() == str(tmp_path / "dir" / "autotune.json")
    monkeypatch.setenv("OPGRAPH_CACHE", str(tmp_path / "x.json"))
    assert default_path() == str(tmp_path / "x.json")
    monkeypatch.delenv("OPGRAPH_CACHE")
    assert default_path().endswith(".cache/opgraph/autotune.json")
    assert AutotuneCache.for_policy(LoweringPolicy(cache="off")).path is None


@pytest.mark.filterwarnings("ignore:autotune cache .* cannot be read")
def test_unwritable_cache_warns(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        _, report = tune(scale_graph()[1], blocker / "c.json", StubTimer({}))
    assert report.node("s0").algorithm in ("fast", "reference")


def test_fft_chunked_variants_compete_where_they_apply(tmp_path, monkeypatch):
    """With the threshold lowered so that a small layer qualifies, autotune checks and times
    ``fft-chunked`` at each chunk count up to the chunked channels, beside ``fft``, and the
    compiled graph computes the float64 reference's numbers whatever it chose."""
    from opgraph.backends.algorithms import fft
    monkeypatch.setattr(fft, "CHUNKED_FROM", 0)
    g = og.Graph()
    x, w = g.input("x", (2, 4, 8, 8)), g.param("w", (6, 4, 3, 3))
    y = og.conv2d(x, w, padding=1, name="conv")
    outs = [y, *og.grad(y, [x, w])]
    exe = og.compile(outs, policy=LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json")))
    tuned = [r for r in exe.report.nodes.values() if r.how == "autotune"]
    assert len(tuned) == 3
    for r in tuned:
        labels = {c.label: c for c in r.candidates}
        chunked = 4 if r.op.startswith("Conv2dBackwardData") else 6
        want = {f"fft-chunked[chunks={k}]" for k in fft.CHUNKS if k <= chunked}
        assert want <= set(labels) and "fft" in labels
        assert all(labels[k].status in ("ok", "chosen") and labels[k].rel_error < labels[k].tolerance for k in want)
    rng = np.random.default_rng(1)
    feeds = dict(x=rng.standard_normal((2, 4, 8, 8)), w=rng.standard_normal((6, 4, 3, 3)))
    gy = rng.standard_normal(y.shape)
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs={y: gy}, **feeds)
    forced = og.compile(outs, policy={"prefer": {"conv": ["fft-chunked"]}, "cache": "off"})
    assert {r.algorithm for r in forced.report.nodes.values() if r.op.startswith("Conv2d")} == {"fft-chunked"}
    for got in (exe(grad_outputs={y: gy}, **feeds), forced(grad_outputs={y: gy}, **feeds)):
        for a, b in zip(got, ref):
            assert np.linalg.norm(a - b) <= 1e-4 * np.linalg.norm(b)  # float32 transforms: ~1e-6


def test_tolerances_and_relative_error():
    assert tolerance("gemm") == 1e-4 and tolerance("fft") == 1e-3 and tolerance("winograd") == 1e-3
    assert tolerance("cudnn", "tf32") == 5e-3 and tolerance("gemm", "bf16") == 1e-2
    assert tolerance("gemm", dtype="float16") == 1e-2
    ref = np.array([3.0, 4.0])
    assert relative_error(np, ref + [0.0, 0.5], ref) == pytest.approx(0.1)
    assert np.isnan(relative_error(np, np.array([np.nan, 4.0]), ref))
    assert np.isnan(relative_error(np, np.zeros(3), ref))


def test_real_conv_autotune_checks_and_caches(tmp_path):
    """End to end on the registered conv rules (real timer): each direction
    is tuned on its own, every candidate is checked, the second compile reads
    the cache."""
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8)), g.param("w", (4, 3, 3, 3))
    y = og.conv2d(x, w, padding=1, name="conv")
    outs = [y, *og.grad(y, [x, w])]
    policy = LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json"))
    exe = og.compile(outs, policy=policy)
    tuned = [r for r in exe.report.nodes.values() if r.how == "autotune"]
    assert len(tuned) == 3
    for r in tuned:
        labels = {c.label: c for c in r.candidates}
        assert {"gemm", "fft", "winograd[tile=2]", "winograd[tile=4]"} <= set(labels)
        assert all(c.rel_error < c.tolerance for c in r.candidates if c.status in ("ok", "chosen"))
    counter = StubTimer({})
    exe2 = og.compile(outs, policy=policy, timer=counter)
    assert counter.calls == [] and exe2.report.choices == exe.report.choices
    rng = np.random.default_rng(0)
    feeds = dict(x=rng.standard_normal((2, 3, 8, 8)), w=rng.standard_normal((4, 3, 3, 3)))
    gy = rng.standard_normal(y.shape)
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs={y: gy}, **feeds)
    for a, b in zip(exe2(grad_outputs={y: gy}, **feeds), ref):
        assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)


def test_cache_writes_are_atomic_and_merged(monkeypatch, tmp_path):
    path = tmp_path / "c.json"
    cache = AutotuneCache(path)
    other = AutotuneCache(path)  # another process, writing meanwhile
    other.put("theirs", {"algorithm": "fft", "options": {}})
    other.save()
    cache.put("ours", {"algorithm": "gemm", "options": {"t": 1}})
    before = path.read_text()
    import opgraph.passes.autotune_cache as mod

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(mod.os, "replace", broken_replace)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        cache.save()
    assert path.read_text() == before and not list(tmp_path.glob(".autotune-*"))
    monkeypatch.undo()
    cache.save()
    entries = json.loads(path.read_text())["entries"]
    assert set(entries) == {"theirs", "ours"} and entries["ours"]["options"] == {"t": 1}


def test_cache_keys_name_no_object_address():
    # a key with "<function ... at 0x...>" differs in every process: the cache would never hit
    import opgraph.backends.algorithms.rules  # noqa: F401  (registers the convolution rules)
    from opgraph import ops
    from opgraph.backends.registry import rules_for
    from opgraph.passes.autotune import candidate_set

    for op_type in (ops.Conv2d, ops.Conv2dBackwardData, ops.Conv2dBackwardFilter, ops.MaxPool2d):
        key = candidate_set([(rule, {}) for rule in rules_for(op_type).values()])
        assert " at 0x" not in key and "functools.partial" not in key, key
    key = candidate_set([(rules_for(ops.Conv2dBackwardData)["winograd"], {})])
    assert key == "winograd:variants('backward_data')"


def test_candidates_and_their_reference_get_the_node_type(monkeypatch, tmp_path):
    """Every kernel autotune runs is told its node's output type in the dtype
    it runs in: float64 for the reference check, float32 for the candidates."""
    from opgraph.backends import registry
    from opgraph.backends.registry import Rule

    seen = []

    def recording(ctx, op, x):
        seen.append((ctx.out_type.shape, ctx.out_type.dtype, x.dtype.name))
        return 2 * x

    registry.rules_for(Scale)  # load the backends first
    monkeypatch.setitem(registry._RULES, Scale, {
        "reference": Rule(Scale, "reference", recording, tags={"reference"}),
        "fast": Rule(Scale, "fast", recording), "slow": Rule(Scale, "slow", recording)})
    tune(scale_graph()[1], tmp_path / "c.json", StubTimer({"fast": 1.0, "slow": 2.0}))
    assert set(seen) == {((4, 5), "float64", "float64"), ((4, 5), "float32", "float32")}


def _winograd_conv():
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8)), g.param("w", (4, 3, 3, 3))
    y = og.conv2d(x, w, padding=1, name="conv")
    rng = np.random.default_rng(0)
    feeds = dict(x=rng.standard_normal((2, 3, 8, 8)), w=rng.standard_normal((4, 3, 3, 3)))
    return y, feeds


@pytest.mark.parametrize("tile", [7, 2.0], ids=["no-such-tile", "float-tile"])
@pytest.mark.parametrize("edit", ["entry", "rows"])
def test_cached_options_a_kernel_refuses_are_reported_and_retuned(tmp_path, edit, tile):
    """A hand-edited entry (Winograd with tile = 7, a tile the kernel has no
    transform for) must not reach the executable: it is checked against the
    rule's variants, reported, and the node is tuned again."""
    y, feeds = _winograd_conv()
    path = tmp_path / "c.json"
    policy = LoweringPolicy(autotune=True, cache=str(path), exclude=["fused"])
    og.compile([y], policy=policy)
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        if edit == "entry":  # an entry of the old format: its algorithm and options are used as written
            entry.pop("rechoose", None)
            entry.update(algorithm="winograd", options={"tile": tile})
        else:  # the rows rechoose() decides from: the fastest row now says tile 7
            row = next(r for r in entry["candidates"] if r["algorithm"] == "winograd")
            row.update(options={"tile": tile}, time_ms=1e-6, min_ms=1e-6)
    path.write_text(json.dumps(data))
    # a float 2.0 equals the variant 2 in Python (review: it passed, as fft's chunks = 2.0 would)
    with pytest.warns(RuntimeWarning, match=rf"node conv: cached options \{{'tile': {tile}\}} of winograd are "
                                            r"not among its variants.*re-tuned"):
        exe = og.compile([y], policy=policy)
    assert exe.report.nodes["conv"].how == "autotune"
    assert any(f"tile': {tile}" in n for n in exe.report.notes)
    (got,) = exe(**feeds)  # runs: no kernel refuses its options
    (want,) = og.compile([y], pipeline="reference", dtype="float64")(**feeds)
    assert np.linalg.norm(got - want) <= 1e-3 * np.linalg.norm(want)
    rewritten = json.loads(path.read_text())["entries"]
    assert all(repr(e["options"].get("tile")) != repr(tile) for e in rewritten.values())


def test_an_empty_opgraph_cache_is_the_default_location(monkeypatch):
    monkeypatch.setenv("OPGRAPH_CACHE", "")
    assert default_path().endswith(".cache/opgraph/autotune.json")
    monkeypatch.setenv("OPGRAPH_CACHE", "  ")
    assert default_path().endswith(".cache/opgraph/autotune.json")
    monkeypatch.setenv("OPGRAPH_CACHE", "off")
    assert default_path() is None


def test_a_cache_behind_a_symbolic_link_keeps_its_link_and_mode(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    shared = tmp_path / "shared" / "autotune.json"
    shared.parent.mkdir()
    shared.write_text('{"format": "opgraph-autotune/1", "entries": {}}')
    os.chmod(shared, 0o664)
    link = tmp_path / "mine.json"
    link.symlink_to(shared)
    monkeypatch.setenv("OPGRAPH_CACHE", str(link))
    policy = LoweringPolicy(autotune=True)
    ctx = PassContext(policy=policy, timer=StubTimer({"fast": 1.0}), versions=lambda: dict(VERSIONS_A),
                      device_name=lambda: "test-cpu")
    outs = scale_graph()[1]
    Pipeline("t", [LowerPass(), AutotunePass()]).run(outs[0].graph, outs, ctx)
    assert link.is_symlink() and os.readlink(link) == str(shared)
    assert len(json.loads(shared.read_text())["entries"]) == 1
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o664


def test_the_oracle_is_timed_on_the_cpu_but_not_on_cuda_where_another_rule_applies():
    """On cuda the reference kernels never compete (no model step may run them on
    the GPU, and timing them on every node made large models' autotune take
    minutes); on the CPU one reference alias does; alone it stays a candidate."""
    from types import SimpleNamespace as NS

    from opgraph.passes.autotune_contenders import contenders

    def entries(*algos):
        return [NS(rule=NS(algorithm=a)) for a in algos]

    def names(found):
        return [e.rule.algorithm for e in found]

    both = entries("direct", "reference", "gemm", "cudnn")
    assert names(contenders(both, "cpu")) == ["direct", "gemm", "cudnn"]
    assert names(contenders(both, "cuda")) == ["gemm", "cudnn"]
    assert names(contenders(entries("reference"), "cuda")) == ["reference"]


def test_a_source_node_without_inputs_is_tuned_or_skipped_not_an_error(tmp_path):
    """EfficientNet-B0's stochastic-depth masks are ``Constant`` nodes: no
    inputs, so the layout of the cache key comes from the node's own type
    (it raised IndexError on every autotuned EfficientNet, on the H200 and here)."""
    from opgraph import ops
    from opgraph.builders_tensor import mul

    g = og.Graph()
    x = g.input("x", (2, 3, 4, 4))
    mask = g.apply(ops.Constant, {"value": np.full((2, 1, 1, 1), 1.25, np.float32)}, [], "mask")
    y = og.relu(mul(x, mask, name="scaled"))
    policy = LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json"))
    exe = og.compile([y], policy=policy)
    feed = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    (out,) = exe(x=feed)
    np.testing.assert_allclose(out, np.maximum(feed * 1.25, 0), rtol=1e-6)


class _StopAfter(StubTimer):
    """A timer that stops the compile (Ctrl-C, a time limit) at its ``limit``-th measurement."""

    def __init__(self, times_ms, limit):
        super().__init__(times_ms)
        self.limit = limit

    def measure(self, fn, *, label, warmup, repeats):
        if len(self.calls) >= self.limit:
            raise KeyboardInterrupt
        return super().measure(fn, label=label, warmup=warmup, repeats=repeats)


def test_a_stopped_autotune_keeps_the_nodes_it_finished(monkeypatch, tmp_path):
    """The cache is saved on the way (``AutotuneCache.checkpoint``), so a
    compile stopped in its third node leaves the first two decisions for the
    next run, which tunes only the rest."""
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    monkeypatch.setattr(AutotuneCache, "CHECKPOINT_SECONDS", 0.0)
    times = {"fast": 1.0, "slow": 2.0}
    one = StubTimer(times)
    tune(scale_graph(1)[1], tmp_path / "one.json", one)
    per_node = len(one.calls)
    path = tmp_path / "c.json"
    g = og.Graph()
    outs = [g.add_node(Scale(), [g.input(f"x{i}", (4, 5 + i))], name=f"s{i}") for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        tune(outs, path, _StopAfter(times, limit=2 * per_node))  # stopped in s2
    assert len(json.loads(path.read_text())["entries"]) == 2
    resumed = StubTimer(times)
    _, report = tune(outs, path, resumed)
    assert [report.node(f"s{i}").how for i in range(3)] == ["cache", "cache", "autotune"]
    assert len(resumed.calls) == per_node
    monkeypatch.setattr(AutotuneCache, "CHECKPOINT_SECONDS", 3600.0)
    path2 = tmp_path / "d.json"
    with pytest.raises(KeyboardInterrupt):
        tune(scale_graph(1)[1], path2, _StopAfter(times, limit=per_node - 1))
    assert not path2.exists()  # nothing finished, nothing written


def test_a_cache_path_under_a_file_names_that_file(tmp_path):
    """``OPGRAPH_CACHE=/tmp/fw/a.json/x.json.gz`` with a.json a file: the write warning said
    ``[Errno 17] File exists`` (mkdir's), the read before it ``Not a directory`` (fresh user)."""
    (tmp_path / "a.json").write_text("{}")
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        cache = AutotuneCache(tmp_path / "a.json" / "x.json.gz")
    cache.put("k", {"algorithm": "gemm", "options": {}})
    with pytest.warns(RuntimeWarning, match=rf"cannot be written \({re.escape(str(tmp_path / 'a.json'))} is a "
                                            r"file, not a folder\); decisions kept in memory"):
        cache.save()
    assert cache.dirty  # kept for a later save
