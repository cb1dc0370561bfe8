"""Where the autotune pass's wall time goes (passes/autotune_clock.py): each
node's seconds per part on its report record, their sums on the report, cache
hits counted with their cost, and a slow step showing under its own part."""

from __future__ import annotations

import re
import time

import pytest

from opgraph.backends.registry import Rule
from opgraph.passes.autotune_clock import PARTS, NodeClock, TuneClock, describe
from opgraph.passes.candidates import ENGINE_LIMIT_TAG

from passes_stubs import Scale, StubTimer, _twice, install_rule, install_scale_rules
from test_autotune import scale_graph, tune

SLEEP_S = 0.05


def _sleepy_kernel(ctx, op, x):
    time.sleep(SLEEP_S)
    return 2 * x


def _sleepy_variants(op, types, device):
    time.sleep(SLEEP_S)
    return [{"t": 1}, {"t": 2}]


def _sleepy_single_variant(op, types, device):
    time.sleep(SLEEP_S)
    return [{}]


class SyncCountingTimer(StubTimer):
    """A :class:`StubTimer` with the optional ``synchronize`` of a device timer."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.syncs = 0

    def synchronize(self):
        self.syncs += 1


def test_each_tuned_node_records_its_parts_and_the_report_sums_them(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow", "boom"])
    timer = StubTimer({"fast": 1.0, "slow": 5.0, "reference": 3.0})
    _, outs = scale_graph(2)  # s1 is the same node as s0: a cache hit within the compile
    _, report = tune(outs, tmp_path / "c.json", timer)
    tuned, hit = report.node("s0"), report.node("s1")
    assert tuned.how == "autotune" and hit.how == "cache"
    for rec in (tuned, hit):
        assert set(rec.tune_seconds) == set(PARTS) and all(s >= 0 for s in rec.tune_seconds.values())
    summary = report.autotune
    for part in PARTS:
        assert summary["seconds"][part] == pytest.approx(tuned.tune_seconds[part] + hit.tune_seconds[part])
    assert summary["nodes_tuned"] == 1 and summary["cache_hits"] == 1 and summary["nodes_untimed"] == 0
    # all four ran once for the check; 'boom' raised, so three were timed ('slow' pruned after one run)
    assert summary["candidates_checked"] == 4 and summary["candidates_timed"] == 3
    assert summary["total_s"] >= sum(summary["seconds"].values())
    assert summary["outside_nodes_s"] == pytest.approx(summary["total_s"] - sum(summary["seconds"].values()))
    assert tuned.to_dict()["tune_seconds"] == tuned.tune_seconds
    assert report.to_dict()["autotune"] == summary
    assert "autotune " in report.format() and "1 nodes tuned" in report.format()


def test_only_hits_on_decisions_read_from_the_file_are_file_hits(monkeypatch, tmp_path):
    """``file_hits`` (what ``--profile``'s cache note counts) leaves out a hit on
    a decision this compile made (s1 repeats s0), and counts every hit of a
    second compile, which reads both from the file that ``cache_path`` names."""
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    timer = StubTimer({"fast": 1.0, "slow": 5.0, "reference": 3.0})
    path, outs = tmp_path / "c.json", scale_graph(2)[1]
    _, first = tune(outs, path, timer)
    assert (first.autotune["nodes_tuned"], first.autotune["cache_hits"], first.autotune["file_hits"]) == (1, 1, 0)
    _, second = tune(outs, path, timer)
    assert (second.autotune["nodes_tuned"], second.autotune["cache_hits"], second.autotune["file_hits"]) == (0, 2, 2)
    assert first.autotune["cache_path"] == second.autotune["cache_path"] == str(path)
    _, off = tune(outs, "off", timer)
    assert (off.autotune["cache_path"], off.autotune["file_hits"]) == (None, 0)


def test_a_cache_hit_counts_as_a_hit_with_its_small_cost(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast"])
    install_rule(monkeypatch, Scale, Rule(Scale, "sleepy", _sleepy_kernel))
    path, outs = tmp_path / "c.json", scale_graph()[1]
    _, first = tune(outs, path, StubTimer({"sleepy": 0.5}))
    _, second = tune(outs, path, StubTimer({}))
    rec = second.node("s0")
    assert rec.how == "cache"
    summary = second.autotune
    assert summary["cache_hits"] == 1 and summary["nodes_tuned"] == 0
    assert summary["candidates_checked"] == 0 and summary["candidates_timed"] == 0
    # nothing ran: no inputs, reference, check or timing; the reuse costs its check and lookup
    assert all(rec.tune_seconds[p] == 0.0 for p in ("inputs", "reference", "check", "timing"))
    assert summary["cache_hit_s"] == pytest.approx(sum(rec.tune_seconds.values())) and summary["cache_hit_s"] > 0
    tuned_s = sum(first.node("s0").tune_seconds.values())  # ran the 50 ms kernel three times
    assert tuned_s >= 3 * SLEEP_S and summary["cache_hit_s"] < tuned_s


def test_a_cache_hit_that_builds_its_cudnn_plan_shows_it_under_variants(monkeypatch, tmp_path):
    """The engine check of a hit (``refused_options`` builds the cached engine's
    plan, here ``workspace``) is the hit's cost, counted as ``variants``."""
    install_scale_rules(monkeypatch, ["reference"])

    def workspace(op, types, options):
        time.sleep(SLEEP_S)  # a plan build
        return 0

    def variants(op, types, device, limit=None):
        return [{"engine": 0}, {"engine": 1}]

    engines = Rule(Scale, "eng", _twice, variants=variants, workspace=workspace, tags={ENGINE_LIMIT_TAG})
    install_rule(monkeypatch, Scale, engines)
    path, outs = tmp_path / "c.json", scale_graph()[1]
    tune(outs, path, StubTimer({"eng[engine=1]": 1.0}))
    _, report = tune(outs, path, StubTimer({}))
    rec = report.node("s0")
    assert rec.how == "cache" and rec.options == {"engine": 1}
    assert rec.tune_seconds["variants"] >= SLEEP_S
    assert report.autotune["cache_hit_s"] >= rec.tune_seconds["variants"]


def test_slow_variant_listing_shows_under_variants(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference"])
    install_rule(monkeypatch, Scale, Rule(Scale, "tiles", _twice, variants=_sleepy_variants))
    _, report = tune(scale_graph()[1], tmp_path / "c.json", StubTimer({}))
    seconds = report.node("s0").tune_seconds
    assert seconds["variants"] >= SLEEP_S
    assert sum(s for p, s in seconds.items() if p != "variants") < SLEEP_S  # nowhere else
    assert report.autotune["seconds"]["variants"] == pytest.approx(seconds["variants"])


def test_a_slow_kernel_shows_under_check_and_timing(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast"])
    install_rule(monkeypatch, Scale, Rule(Scale, "sleepy", _sleepy_kernel))
    timer = StubTimer({"sleepy": 1.0, "fast": 1.0, "reference": 1.0})  # none pruned
    _, report = tune(scale_graph()[1], tmp_path / "c.json", timer)
    seconds = report.node("s0").tune_seconds
    runs = timer.calls.count("sleepy")  # StubTimer runs the kernel once per measure call
    assert runs == 2  # one timed run, then the full protocol
    assert SLEEP_S <= seconds["check"] and runs * SLEEP_S <= seconds["timing"]
    assert seconds["variants"] + seconds["inputs"] + seconds["reference"] < SLEEP_S


def test_parts_that_queue_device_work_wait_for_it_through_the_timer(monkeypatch, tmp_path):
    """inputs, reference and each check settle (the timer's synchronize);
    timing and variants do not: the timer waits for its own runs, and plans
    are built on the host."""
    install_scale_rules(monkeypatch, ["reference", "fast", "boom"])
    timer = SyncCountingTimer({"fast": 1.0, "reference": 2.0})
    _, report = tune(scale_graph()[1], tmp_path / "c.json", timer)
    assert report.autotune["candidates_checked"] == 3
    assert timer.syncs == 2 + 3


def test_a_node_with_one_candidate_counts_its_listing_as_untimed(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, [])
    install_rule(monkeypatch, Scale, Rule(Scale, "only", _twice, variants=_sleepy_single_variant))
    _, report = tune(scale_graph()[1], tmp_path / "c.json", StubTimer({}))
    rec = report.node("s0")
    assert rec.how == "policy" and rec.tune_seconds["variants"] >= SLEEP_S
    summary = report.autotune
    assert summary["nodes_untimed"] == 1 and summary["nodes_tuned"] == 0 and summary["candidates_checked"] == 0


def test_without_autotune_nothing_is_recorded(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast"])
    import opgraph as og

    exe = og.compile(scale_graph()[1], policy={"autotune": False})
    assert exe.report.autotune == {} and exe.report.node("s0").tune_seconds == {}
    assert "autotune " not in exe.report.format()


# ---- the clock alone ---------------------------------------------------------

def test_other_is_the_unclaimed_time_and_never_negative():
    clock = NodeClock(settle=lambda: None)
    with clock.part("timing"):
        time.sleep(0.02)
    time.sleep(0.02)
    seconds = clock.stop()
    assert seconds["timing"] >= 0.02 and seconds["other"] >= 0.02
    assert set(seconds) == set(PARTS)


def test_a_failing_part_keeps_its_seconds_and_its_error():
    settled = []
    clock = NodeClock(settle=lambda: settled.append(1))
    with pytest.raises(RuntimeError, match="kernel exploded"):
        with clock.part("check", settle=True):
            time.sleep(0.01)
            raise RuntimeError("kernel exploded")
    assert clock.seconds["check"] >= 0.01 and settled == []  # the wait would hide the error
    with pytest.raises(ValueError, match="unknown part 'plans'.*inputs"):
        with clock.part("plans"):
            pass


def test_describe_names_every_part_and_the_counts():
    pass_clock = TuneClock(device="cuda")  # the variants part builds cuDNN plans there
    node = pass_clock.node()
    node.checked, node.timed = 3, 2
    with node.part("reference"):
        time.sleep(0.12)
    pass_clock.done(node, "tuned")
    line = describe(pass_clock.summary())
    # seconds from 0.1 s up, milliseconds below
    assert re.match(r"autotune 0\.[1-9] s: inputs 0\.0 ms, reference 0\.[1-9] s, variants \(cuDNN plans\) 0\.0 ms",
                    line), line
    for part in PARTS:
        assert part in line
    assert "1 nodes tuned (3 candidates checked, 2 timed), 0 cache hits" in line
    cpu = describe({**pass_clock.summary(), "device": "cpu"})
    assert ", variants 0.0 ms," in cpu and "cuDNN" not in cpu
