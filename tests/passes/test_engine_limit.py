"""``policy.engine_limit``: autotune times the first N cuDNN engines in cuDNN's
heuristic order (PyTorch's ``cudnn.benchmark_limit``), builds no more plans than
that, keys its cache by the limit, and checks a cached engine by building that
one plan alone."""

from __future__ import annotations

import json

import pytest

from opgraph.backends.cuda import cudnn_graph as cg
from opgraph.backends.registry import Rule
from opgraph.passes.autotune import candidate_set
from opgraph.passes.candidates import ENGINE_LIMIT_TAG
from opgraph.passes.policy import LoweringPolicy, PolicyError

from passes_stubs import Scale, StubTimer, _twice, install_rule, install_scale_rules
from test_autotune import scale_graph, table, tune


# ---- the policy key ------------------------------------------------------

def test_the_default_is_pytorchs_benchmark_limit_and_all_means_every_engine():
    assert LoweringPolicy().engine_limit == 10
    assert LoweringPolicy(engine_limit="all").engine_limit is None
    assert LoweringPolicy(engine_limit=" 3 ").engine_limit == 3
    assert LoweringPolicy.from_mapping({"engine_limit": 4}).engine_limit == 4
    assert LoweringPolicy.from_mapping(LoweringPolicy(engine_limit="all").to_dict()).engine_limit is None


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "ten", ""])
def test_a_bad_engine_limit_names_the_key_and_the_value(bad):
    with pytest.raises(PolicyError, match="engine_limit"):
        LoweringPolicy(engine_limit=bad)


def test_the_flag_is_named_in_its_error():
    with pytest.raises(PolicyError, match="--engine-limit"):
        LoweringPolicy.from_cli(lowering="auto", engine_limit="0")
    assert LoweringPolicy.from_cli(lowering="auto", engine_limit="all").engine_limit is None


# ---- ConvPlan.engines(limit): builds only as far down the ranking as needed ----

class RankedGraph:
    """A frontend graph whose plans ``bad`` do not build; records the builds."""

    def __init__(self, count, bad):
        self.count, self.bad, self.built = count, set(bad), []

    def get_execution_plan_count(self):
        return self.count

    def build_plan_at_index(self, i):
        self.built.append(i)
        if i in self.bad:
            raise RuntimeError(f"plan {i} not supported")

    def get_workspace_size_plan_at_index(self, i):
        return 100 * i


SIG = cg.ConvSignature("fprop", "none", ((2, 3, 4, 4),) * 3, ((48, 16, 4, 1),) * 3, "float32", "fp32",
                       (0, 0), (0, 0), (1, 1), (1, 1))


def test_the_first_n_engines_that_build_in_heuristic_order():
    graph = RankedGraph(12, bad={1, 2, 5})
    plan = cg.ConvPlan(SIG, graph, (), None)
    assert plan.engines(3) == [0, 3, 4]
    assert graph.built == [0, 1, 2, 3, 4]  # nothing past the third engine that builds
    assert plan.engines(3) == [0, 3, 4] and graph.built == [0, 1, 2, 3, 4]  # built once
    assert plan.engines(None) == [0, 3, 4, 6, 7, 8, 9, 10, 11]
    assert plan.engines(50) == plan.engines()


# ---- autotune with a limited rule ----------------------------------------

def _engine_rule(calls: list, bad=()):
    """A Scale rule enumerating six 'engines' the way the cuDNN rules do."""

    def variants(op, types, device, limit=None):
        calls.append(limit)
        engines = [i for i in range(6) if i not in bad]
        return [{"engine": i} for i in engines[:limit]]

    def workspace(op, types, options):
        if options.get("engine") in bad:
            raise RuntimeError(f"engine {options['engine']} does not build")
        return 0

    return Rule(Scale, "eng", _twice, variants=variants, workspace=workspace, tags={ENGINE_LIMIT_TAG})


def test_autotune_times_only_the_first_engines_and_keys_the_cache_by_the_limit(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference"])
    calls = []
    install_rule(monkeypatch, Scale, _engine_rule(calls))
    timer = StubTimer({"eng[engine=0]": 3.0, "eng[engine=1]": 2.0, "eng[engine=5]": 0.5})
    cache = tmp_path / "c.json"
    _, report = tune(scale_graph()[1], cache, timer, engine_limit=2)
    assert calls == [2]
    assert {k for k in table(report) if k.startswith("eng")} == {"eng[engine=0]", "eng[engine=1]"}
    assert report.node("s0").options == {"engine": 1}
    (key,) = json.loads(cache.read_text())["entries"]
    assert "eng:" in key and "[engines<=2]" in key

    # a policy asking for every engine does not reuse the decision made among two
    _, report = tune(scale_graph()[1], cache, timer, engine_limit="all")
    assert report.node("s0").how == "autotune" and report.node("s0").options == {"engine": 5}
    assert calls == [2, None]


def _tuned_once(monkeypatch, tmp_path, calls):
    """The engine rule installed and engine 1 (of the first 3) tuned into a fresh cache."""
    install_scale_rules(monkeypatch, ["reference"])
    install_rule(monkeypatch, Scale, _engine_rule(calls))
    cache = tmp_path / "c.json"
    tune(scale_graph()[1], cache, StubTimer({"eng[engine=1]": 1.0}), engine_limit=3)
    return cache


def test_a_cache_hit_builds_the_chosen_engine_alone(monkeypatch, tmp_path):
    calls = []
    cache = _tuned_once(monkeypatch, tmp_path, calls)
    _, report = tune(scale_graph()[1], cache, StubTimer({}), engine_limit=3)
    assert report.node("s0").how == "cache" and report.node("s0").options == {"engine": 1}
    assert calls == [3]  # the hit listed no variants


def test_a_cached_engine_that_no_longer_builds_is_reported_and_retuned(monkeypatch, tmp_path):
    calls = []
    cache = _tuned_once(monkeypatch, tmp_path, calls)
    install_rule(monkeypatch, Scale, _engine_rule(calls, bad={1}))  # e.g. another cuDNN version
    with pytest.warns(RuntimeWarning, match="engine 1 does not build; re-tuned"):  # said, not only noted
        _, report = tune(scale_graph()[1], cache, StubTimer({"eng[engine=2]": 1.0}), engine_limit=3)
    assert report.node("s0").how == "autotune" and report.node("s0").options == {"engine": 2}
    assert any("engine 1 does not build" in n and "re-tuned" in n for n in report.notes)


def test_the_real_cudnn_rules_take_the_limit():
    import opgraph.backends.cuda.cudnn_rules as conv_rules
    import opgraph.backends.cuda.cudnn_norm_rules as norm_rules

    assert ENGINE_LIMIT_TAG in conv_rules.TAGS and ENGINE_LIMIT_TAG in norm_rules.TAGS
    rule = Rule(Scale, "cudnn", _twice, variants=conv_rules.variants, tags=conv_rules.TAGS)
    assert candidate_set([(rule, {})], 10) == "cudnn:variants[engines<=10]"
    assert candidate_set([(rule, {})], None) == "cudnn:variants"


# ---- engine_limits: one node's limit ----------------------------------------

def test_engine_limits_take_forces_keys_and_precedence():
    """passes/force.py's matching: a layer narrowed to one direction, a pattern of full names."""
    policy = LoweringPolicy(engine_limits={"conv1:backward_filter": "all", "fc*": 3, "conv2.grad/*data": 5})
    assert policy.engine_limit_for("conv1.grad/conv2d_backward_filter", "wgrad") is None
    assert policy.engine_limit_for("conv1", "fwd") == 10  # the key names conv1's backward-filter only
    assert policy.engine_limit_for("fc6", "fwd") == 3
    assert policy.engine_limit_for("conv2.grad/conv2d_backward_data", "dgrad") == 5
    assert policy.engine_limit_for("conv3", "fwd") == 10  # no key: the policy's engine_limit
    assert LoweringPolicy(engine_limit=2).engine_limit_for("conv3") == 2
    # the docs' use: every engine on one node, a pattern for the rest (review: the pattern won)
    mixed = LoweringPolicy(engine_limits={"conv*": 3, "conv1:backward_filter": "all"})
    assert mixed.engine_limit_for("conv1.grad/conv2d_backward_filter", "wgrad") is None
    assert mixed.engine_limit_for("conv1", "fwd") == mixed.engine_limit_for("conv2.grad/x", "dgrad") == 3
    again = LoweringPolicy.from_mapping(policy.to_dict())
    assert dict(again.engine_limits) == dict(policy.engine_limits)


@pytest.mark.parametrize("limits, match", [({"conv1": 0}, r"engine_limits\.conv1"),
                                           ({"conv1:forwards": 2}, "unknown direction 'forwards'"),
                                           (["conv1"], "mapping of node name"), ({"": 2}, "non-empty")])
def test_a_bad_engine_limits_entry_names_the_key_and_the_value(limits, match):
    with pytest.raises(PolicyError, match=match):
        LoweringPolicy(engine_limits=limits)


def test_engine_limits_are_read_from_toml(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('autotune = true\n[engine_limits]\n"conv1:backward_filter" = "all"\n"conv2" = 4\n')
    policy = LoweringPolicy.from_toml(path)
    assert dict(policy.engine_limits) == {"conv1:backward_filter": None, "conv2": 4}


def test_idle_engine_limits_are_noted_without_autotune():
    assert LoweringPolicy(engine_limits={"conv1": 2}).idle_autotune_keys() == ["engine_limits={'conv1': 2}"]
    assert LoweringPolicy(autotune=True, engine_limits={"conv1": 2}).idle_autotune_keys() == []


def test_one_nodes_limit_changes_that_nodes_key_alone(monkeypatch, tmp_path):
    """s1 gets every engine, s0 keeps the policy's 2: s0's cached decision is reused, s1 is
    tuned afresh among all six and keyed by its own limit."""
    install_scale_rules(monkeypatch, ["reference"])
    calls = []
    install_rule(monkeypatch, Scale, _engine_rule(calls))
    timer = StubTimer({"eng[engine=0]": 3.0, "eng[engine=1]": 2.0, "eng[engine=5]": 0.5})
    cache = tmp_path / "c.json"
    tune(scale_graph(2)[1], cache, timer, engine_limit=2)
    assert calls == [2]  # s1's key is s0's: one decision
    _, report = tune(scale_graph(2)[1], cache, timer, engine_limit=2, engine_limits={"s1": "all"})
    assert calls == [2, None]
    assert report.node("s0").how == "cache" and report.node("s0").options == {"engine": 1}
    assert report.node("s1").how == "autotune" and report.node("s1").options == {"engine": 5}
    keys = json.loads(cache.read_text())["entries"]
    assert sum("[engines<=2]" in k for k in keys) == 1 and sum("[engines<=" not in k for k in keys) == 1


def test_an_engine_limits_key_naming_no_node_is_noted_and_warned(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference"])
    install_rule(monkeypatch, Scale, _engine_rule([]))
    with pytest.warns(UserWarning, match="engine_limits key 'conv9' matches no node"):
        _, report = tune(scale_graph()[1], tmp_path / "c.json", StubTimer({}), engine_limits={"conv9": 3})
    assert any("engine_limits key 'conv9'" in n for n in report.notes)


def test_engine_limits_on_the_cpu_are_noted_as_having_no_effect():
    import opgraph as og
    g = og.Graph()
    y = og.relu(g.input("x", (2, 3)))
    exe = og.compile(y, device="cpu", policy=LoweringPolicy(autotune=True, engine_limits={"*": 2}))
    assert any("engine_limits={'*': 2}" in n and "no effect" in n for n in exe.report.notes)
    exe = og.compile(y, device="cpu", policy=LoweringPolicy(autotune=True, engine_limit=4,
                                                            engine_limits={"*": "all"}))
    assert any("engine_limit=4, engine_limits={'*': 'all'}" in n for n in exe.report.notes)
    exe = og.compile(y, device="cpu", policy=LoweringPolicy(autotune=True))  # the default: nothing to say
    assert not any("cuDNN engines" in n for n in exe.report.notes)


def test_a_record_repeats_the_engine_limits_notes(tmp_path):
    """Both compile notes on engine_limits reach a benchmark record (``requested_notes``): the
    key naming no node (a typo in a device call's policy file would else leave only a warning
    on stderr, and the record would read as if every engine had been timed) and no effect."""
    import opgraph as og
    from benchmarks.lowerings import requested_notes
    g = og.Graph("g")
    y = og.relu(g.input("x", (2, 3)))
    policy = LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json"), engine_limits={"conv9": "all"})
    with pytest.warns(UserWarning, match="matches no node"):
        exe = og.compile(y, device="cpu", policy=policy)
    notes = requested_notes(exe, "fp32", "NCHW", "float32")
    assert any("engine_limits key 'conv9' matches no node" in n for n in notes), notes
    assert any("no effect" in n and "engine_limits" in n for n in notes), notes


def test_a_node_no_force_key_names_keeps_the_policys_limit():
    """PassContext.aliases: a legalized node answers to its original's name; one aliased to None
    (a fusion's rematerialised copy) is named by no force key, nor by an engine_limits key."""
    from types import SimpleNamespace

    from opgraph.passes.autotune import _engine_limit
    from opgraph.passes.base import PassContext

    policy = LoweringPolicy(autotune=True, engine_limit=4, engine_limits={"bn1*": "all", "conv1": 2})
    ctx = PassContext(policy=policy, aliases={"bn1/remat": None, "conv1/unpadded": "conv1"})
    op = SimpleNamespace(direction=None)
    assert _engine_limit(policy, ctx, "bn1/remat", op) == 4
    assert _engine_limit(policy, ctx, "bn1", op) is None
    assert _engine_limit(policy, ctx, "conv1/unpadded", SimpleNamespace(direction="fwd")) == 2
