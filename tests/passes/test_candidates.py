"""The candidates of a node (passes/candidates.py): one survey per node state per compile."""

import collections
import inspect
import warnings

import attrs
import pytest

import opgraph as og
from opgraph.backends.registry import rules_for
from opgraph.ops import Conv2d
from opgraph.passes import candidates
from opgraph.passes.base import PassContext
from opgraph.passes.policy import LoweringPolicy
from opgraph.types import TensorType

from passes_stubs import StubTimer, install_rule


def small_net():
    g = og.Graph()
    x = g.input("x", (1, 2, 6, 6))
    w = g.param("w", (3, 2, 3, 3))
    b = g.param("b", (3,))
    y = og.conv2d(x, w, b, padding=((0, 1), (1, 0)), name="conv1")
    p = og.max_pool2d(og.relu(y, name="relu1"), 2, name="pool1")
    return g, [p, *og.grad(p, [w])]


@pytest.fixture
def counted(monkeypatch):
    """Every survey computed, as ``(node name, op)`` -> count."""
    seen = collections.Counter()
    real = candidates.survey

    def counting(name, op, *args, **kwargs):
        seen[(name, op)] += 1
        return real(name, op, *args, **kwargs)

    monkeypatch.setattr(candidates, "survey", counting)
    return seen


def test_each_node_is_surveyed_once_per_compile(counted, tmp_path):
    """legalize, lower and autotune read one survey per node state; the conv
    node legalize rewrote (its padding moved into a Pad node) is surveyed
    again with its new op, and the fused node with its own."""
    g, outs = small_net()
    policy = LoweringPolicy(autotune=True, explicit_padding=["gemm"], cache=str(tmp_path / "c.json"))
    exe = og.compile(outs, policy=policy, timer=StubTimer({}))
    assert counted and max(counted.values()) == 1
    conv_ops = {op for name, op in counted if name == "conv1"}
    assert {o.padding for o in conv_ops if isinstance(o, Conv2d)} == {((0, 1), (1, 0)), ((0, 0), (0, 0))}
    assert any(type(o).__name__ == "Conv2dBiasRelu" for o in conv_ops)  # fused: a new op, a new survey
    assert exe.report.node("conv1").how == "autotune"


def test_a_survey_is_kept_per_node_state_and_policy():
    g, outs = small_net()
    ctx = PassContext()
    view = g.node(g["relu1"].node)
    s = candidates.survey_node(view, ctx)
    assert candidates.survey_node(view, ctx) is s
    other = LoweringPolicy(prefer={"relu": ["reference"]})
    assert candidates.survey_node(view, ctx, other) is not s
    # a 4-D input given its layout by the layout pass: the same storage, the same survey
    g.set_layout(g["conv1"].node, "NCHW")
    assert candidates.survey_node(g.node(view.id), ctx) is s
    g.set_layout(g["conv1"].node, "NHWC")
    assert candidates.survey_node(g.node(view.id), ctx) is not s


def test_the_workspace_limit_and_missing_padding_are_queries_of_one_survey(monkeypatch):
    install_rule(monkeypatch, Conv2d, attrs.evolve(rules_for(Conv2d)["gemm"], algorithm="big",
                                                   workspace=lambda op, types, opts: 10**9,
                                                   tags={"symmetric_padding_only"}))
    op = Conv2d(padding=((0, 1), (1, 1)))
    types = (TensorType((1, 2, 6, 6)), TensorType((3, 2, 3, 3)))
    s = candidates.survey("c", op, types, "cpu", LoweringPolicy(prefer={"conv": ["big"]}, workspace_limit=10))
    assert "exceeds the limit" in s.declined(padded_ok=True)["big"]
    assert "needs explicit padding" in s.declined()["big"]
    assert s.applicable(padded_ok=True, limited=False)[0].rule.algorithm == "big"
    assert s.entries[0].padding == ((0, 1), (0, 0))


def test_every_rules_variants_take_the_keywords_its_tags_promise():
    """A rule tagged ``option:precision`` (or ``variants:engine_limit``) is
    listed with ``precision=`` (``limit=``): a variants function that did not
    take it raised inside autotune, which then timed the default alone (the
    ``unfold`` rule's ``chunks`` variants, 2026-12-03)."""
    from opgraph.backends import registry

    registry.algorithms()  # loads every backend
    checked = 0
    for rules in registry._RULES.values():
        for rule in rules.values():
            extra = {}
            if candidates.OPTION_TAGS["precision"] in rule.tags:
                extra["precision"] = "fp32"
            if candidates.ENGINE_LIMIT_TAG in rule.tags:
                extra["limit"] = None
            inspect.signature(rule.variants).bind(None, (), "cuda", **extra)  # raises TypeError
            checked += bool(extra)
    assert checked > 10


def test_rule_variants_refuses_a_function_that_breaks_its_tags():
    op = Conv2d(stride=1, padding=0)
    rule = attrs.evolve(rules_for(Conv2d)["unfold"], variants=lambda op, in_types, device: [{"chunks": 2}])
    with pytest.raises(TypeError, match=r"Conv2d/unfold.*variants\(op, in_types, device, precision=\)"):
        candidates.rule_variants(rule, op, (), "cuda", {"precision": "bf16"})
    listed = candidates.rule_variants(rules_for(Conv2d)["unfold"], op, (), "cuda", {"precision": "bf16"})
    assert {"chunks": 16} in listed


def test_a_variants_function_that_fails_is_reported_not_swallowed():
    """A bug inside a variants function leaves the rule's default call as the
    only candidate, with a warning naming the rule and the error; a rule that
    cannot build a variant for the node (``LoweringError``, no cuDNN plan)
    falls back to its default silently."""
    from opgraph.errors import LoweringError
    op = Conv2d(stride=1, padding=0)

    def broken(op, in_types, device, precision=None):
        raise AttributeError("no such field")

    def unbuildable(op, in_types, device, precision=None):
        raise LoweringError("no cuDNN engine builds")

    rule = attrs.evolve(rules_for(Conv2d)["unfold"], variants=broken)
    with pytest.warns(RuntimeWarning, match=r"Conv2d/unfold: listing its variants .* AttributeError: no such field"):
        assert candidates.rule_variants(rule, op, (), "cuda", {"precision": "bf16"}) == [{}]
    rule = attrs.evolve(rule, variants=unbuildable)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert candidates.rule_variants(rule, op, (), "cuda", {"precision": "bf16"}) == [{}]


def _stem_wgrad():
    """AlexNet's ``conv1`` backward-filter at batch 8 (NHWC float32): the
    ``unfold`` rule's rows are 8*55*55 x 368 float32, 35.6 MB in one piece."""
    op = og.ops.Conv2dBackwardFilter(stride=4, padding=2, weight_shape=(64, 3, 11, 11))
    types = (TensorType((8, 3, 224, 224), "float32", "NHWC"), TensorType((8, 64, 55, 55), "float32", "NHWC"))
    return op, types


def test_under_a_workspace_limit_the_first_fitting_variant_is_offered():
    op, types = _stem_wgrad()
    rule = rules_for(type(op))["unfold"]
    whole = rule.workspace(op, types, {"precision": "fp32"})
    quarter = rule.workspace(op, types, {"precision": "fp32", "chunks": 4})
    assert quarter < whole
    for limit, chunks in ((whole, None), (quarter, 4), (quarter - 1, 16)):
        policy = LoweringPolicy(workspace_limit=limit, prefer={"conv": ["unfold"]})
        s = candidates.survey("conv1.grad", op, types, "cuda", policy)
        entry, = [e for e in s.applicable() if e.rule.algorithm == "unfold"]
        assert entry.lowered_options.get("chunks") == chunks and entry.workspace <= limit
        assert "chunks" not in entry.options  # autotune lays every variant over the policy's options
    policy = LoweringPolicy(workspace_limit=1024)  # below every variant: declined, saying why
    why = candidates.survey("conv1.grad", op, types, "cuda", policy).declined()["unfold"]
    assert "exceeds the limit 1,024 B" in why


def test_a_channels_last_only_rule_is_a_candidate_of_the_lower_pass():
    """The layout pass runs first (passes/pipelines.py), so under a workspace
    limit that every layout-free rule exceeds, the NHWC-only ``unfold`` rule
    still lowers the stem (``auto@ws=128MiB`` failed to compile AlexNet's
    ``conv1`` on the H200 before: no lowering applied)."""
    from opgraph.op import Lowered
    from opgraph.passes.pipelines import default

    g = og.Graph()
    x = g.input("x", (8, 3, 224, 224))
    w = g.param("w", (64, 3, 11, 11))
    y = og.conv2d(x, w, stride=4, padding=2, name="conv1")
    outs = [y, *og.grad(y, [w], grad_outputs=[y])]
    op, types = _stem_wgrad()
    limit = rules_for(type(op))["unfold"].workspace(op, types, {"precision": "fp32", "chunks": 4})
    gemm = rules_for(type(op))["gemm"].workspace(op, types, {})
    assert gemm > limit  # the catch-all is over the limit too
    policy = LoweringPolicy(layout="NHWC", workspace_limit=limit)
    ctx = PassContext(device="cuda", policy=policy, dtype="float32")
    graph, louts = default(policy).run(g, outs, ctx)
    chosen = {v.name: v.op for v in graph.nodes_in_order(louts) if isinstance(v.op, Lowered)}
    assert chosen["conv1"].algorithm == "unfold"
    wgrad = next(op for name, op in chosen.items() if op.op.name == "Conv2dBackwardFilter")
    assert wgrad.algorithm == "unfold" and wgrad.option_dict["chunks"] in (4, 16)
    for view in graph.nodes_in_order(louts):  # every 4-D value, the legalize pass's too, is NHWC
        assert view.type.ndim != 4 or view.type.layout == "NHWC", view.name


def test_under_a_workspace_limit_autotune_times_each_variant_once():
    """Autotune lays every variant over an entry's ``options`` (the policy's),
    not over the lower pass's fitting variant: the stem's backward-filter is
    timed as one piece (then reported over budget), in 4 and in 16 chunks,
    each once (over ``lowered_options`` it had been 4, 4 and 16)."""
    op, types = _stem_wgrad()
    limit = rules_for(type(op))["unfold"].workspace(op, types, {"precision": "fp32", "chunks": 4})
    policy = LoweringPolicy(workspace_limit=limit, prefer={"conv": ["unfold"]})
    entry, = [e for e in candidates.survey("wgrad", op, types, "cuda", policy).applicable(limited=False)
              if e.rule.algorithm == "unfold"]
    built = [{**entry.options, **v} for v in candidates.rule_variants(entry.rule, op, types, "cuda", entry.options)]
    assert [b.get("chunks") for b in built] == [None, 4, 16]
    assert entry.lowered_options["chunks"] == 4
