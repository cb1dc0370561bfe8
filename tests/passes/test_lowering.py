"""The lower pass: which algorithm a policy picks, declines, errors, golden graphs."""

import re

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.errors import LoweringError
from opgraph.passes.policy import PolicyError
from opgraph.ops import Conv2d
from opgraph.passes.base import PassContext
from opgraph.passes.candidates import survey
from opgraph.passes.lower import LowerPass
from opgraph.passes.policy import LoweringPolicy
from opgraph.passes.verify import VerifyPass
from opgraph.types import TensorType

from opgraph.backends.registry import rules_for

from passes_stubs import Scale, install_rule, install_scale_rules


def conv_pool_graph():
    g = og.Graph("small")
    x = g.input("x", (1, 2, 6, 6))
    w = g.param("w", (3, 2, 3, 3))
    y = og.conv2d(x, w, padding=((0, 1), (1, 0)), name="conv1")
    p = og.max_pool2d(og.relu(y, name="relu1"), 2, name="pool1")
    return g, p


GOLDEN_BEFORE = """\
%0 x = Input(float32[1, 2, 6, 6])() -> float32[1, 2, 6, 6]
%1 w = Param(float32[3, 2, 3, 3])() -> float32[3, 2, 3, 3]
%2 conv1 = Conv2d(stride=1, padding=((0, 1), (1, 0)), dilation=1, groups=1)(%0, %1) -> float32[1, 3, 5, 5]
%3 relu1 = Relu()(%2) -> float32[1, 3, 5, 5]
%4 pool1 = MaxPool2d(kernel_size=2, stride=2, padding=0, ceil_mode=False)(%3) -> float32[1, 3, 2, 2]"""

GOLDEN_LOWERED = """\
%0 x = Input(float32[1, 2, 6, 6])() -> float32[1, 2, 6, 6]
%1 w = Param(float32[3, 2, 3, 3])() -> float32[3, 2, 3, 3]
%2 conv1 = gemm[cpu]:Conv2d(stride=1, padding=((0, 1), (1, 0)), dilation=1, groups=1)(%0, %1) -> float32[1, 3, 5, 5]
%3 relu1 = reference[cpu]:Relu()(%2) -> float32[1, 3, 5, 5]
%4 pool1 = reference[cpu]:MaxPool2d(kernel_size=2, stride=2, padding=0, ceil_mode=False)(%3) -> float32[1, 3, 2, 2]"""


def lower(g, outs, policy=None, device="cpu"):
    ctx = PassContext(device=device, policy=policy or LoweringPolicy())
    return LowerPass()(g, outs, ctx), ctx


def test_golden_lowering_and_input_graph_untouched():
    g, p = conv_pool_graph()
    assert g.dump() == GOLDEN_BEFORE
    lowered, ctx = lower(g, [p])
    assert lowered.dump() == GOLDEN_LOWERED
    assert g.dump() == GOLDEN_BEFORE  # the pass worked on a copy
    VerifyPass()(lowered, [p], ctx)
    with pytest.raises(LoweringError, match="conv1 .*abstract"):
        VerifyPass()(g, [p], ctx)


def conv_grads(k=3, padding=1, stride=1, name="conv2"):
    g = og.Graph()
    x = g.input("x", (2, 4, 9, 9))
    w = g.param("w", (5, 4, k, k))
    y = og.conv2d(x, w, padding=padding, stride=stride, name=name)
    gx, gw = og.grad(y, [x, w])
    return g, [y, gx, gw]


def algorithms(g, outs, policy=None):
    lowered, ctx = lower(g, outs, policy)
    return {type(v.op.op).__name__: v.op.algorithm for v in lowered.nodes_in_order(outs)
            if hasattr(v.op, "algorithm")}, ctx


def test_default_cpu_policy_picks_gemm_for_all_directions():
    g, outs = conv_grads()
    algos, _ = algorithms(g, outs)
    assert algos == {"Conv2d": "gemm", "Conv2dBackwardData": "gemm", "Conv2dBackwardFilter": "gemm"}


def test_prefer_family_and_direction():
    g, outs = conv_grads()
    algos, _ = algorithms(g, outs, LoweringPolicy(prefer={"conv": ["fft"], "conv_wgrad": ["winograd"]}))
    assert algos == {"Conv2d": "fft", "Conv2dBackwardData": "fft", "Conv2dBackwardFilter": "winograd"}


def test_declining_preference_falls_back_to_gemm_with_reason():
    g, outs = conv_grads(k=5, padding=2)
    algos, ctx = algorithms(g, outs, LoweringPolicy(prefer={"conv": ["winograd"]}))
    assert set(algos.values()) == {"gemm"}
    rec = ctx.report.node("conv2")
    assert "3x3" in rec.declined["winograd"] and rec.how == "policy"
    assert rec.order[:2] == ["winograd", "gemm"]
    assert "3x3" in ctx.report.fallbacks()["conv2"]["winograd"]


def test_force_by_node_name_and_pattern():
    g, outs = conv_grads()
    # conv2:forward narrows the layer key to its forward node (conv2 alone would force all three)
    algos, ctx = algorithms(g, outs, LoweringPolicy(force={"conv2:forward": "fft",
                                                           "conv2.grad/*filter": "direct"},
                                                     exclude=["fft"]))
    assert algos["Conv2d"] == "fft"  # forcing bypasses exclude
    assert algos["Conv2dBackwardFilter"] == "direct"
    assert algos["Conv2dBackwardData"] == "gemm"
    assert ctx.report.node("conv2").how == "forced"


@pytest.mark.parametrize("force, want", [
    ({"conv2": "fft"}, {"Conv2d": "fft", "Conv2dBackwardData": "fft", "Conv2dBackwardFilter": "fft"}),
    ({"conv*": "fft"}, {"Conv2d": "fft", "Conv2dBackwardData": "fft", "Conv2dBackwardFilter": "fft"}),
    # the narrower key wins whatever the table's order
    ({"conv2:backward_filter": "direct", "conv2": "fft"},
     {"Conv2d": "fft", "Conv2dBackwardData": "fft", "Conv2dBackwardFilter": "direct"}),
    ({"conv2:backward_data": "fft"}, {"Conv2d": "gemm", "Conv2dBackwardData": "fft",
                                      "Conv2dBackwardFilter": "gemm"}),
    # a key of the backward node's full name beats the layer key
    ({"conv2": "fft", "conv2.grad/conv2d_backward_data": "direct"},
     {"Conv2d": "fft", "Conv2dBackwardData": "direct", "Conv2dBackwardFilter": "fft"}),
    # a pattern that also names the layer is a layer key: the narrowed layer key beats it
    # (review: as a pattern of the full names, conv* outranked conv2:backward_filter)
    ({"conv*": "fft", "conv2:backward_filter": "direct", "conv2:forward": "gemm"},
     {"Conv2d": "gemm", "Conv2dBackwardData": "fft", "Conv2dBackwardFilter": "direct"}),
    # and an exact layer key beats it whatever the table's order
    ({"conv*": "fft", "conv2": "direct"},
     {"Conv2d": "direct", "Conv2dBackwardData": "direct", "Conv2dBackwardFilter": "direct"}),
    # an exact key beats every pattern, a pattern of the full names too (review)
    ({"*backward_filter": "direct", "conv2:backward_filter": "fft"},
     {"Conv2d": "gemm", "Conv2dBackwardData": "gemm", "Conv2dBackwardFilter": "fft"}),
    ({"*filter": "direct", "conv2": "fft"},
     {"Conv2d": "fft", "Conv2dBackwardData": "fft", "Conv2dBackwardFilter": "fft"}),
    # among patterns, the narrowed layer pattern beats the layer pattern
    ({"conv*:backward_filter": "direct", "conv*": "fft"},
     {"Conv2d": "fft", "Conv2dBackwardData": "fft", "Conv2dBackwardFilter": "direct"}),
    # and a pattern of the full names only beats a layer pattern
    ({"conv*": "fft", "*filter": "direct"},
     {"Conv2d": "fft", "Conv2dBackwardData": "fft", "Conv2dBackwardFilter": "direct"}),
])
def test_a_layer_name_forces_every_direction_unless_narrowed(force, want):
    g, outs = conv_grads()
    algos, ctx = algorithms(g, outs, LoweringPolicy(force=force))
    assert {k: algos[k] for k in want} == want
    assert all(r.how == "forced" for r in ctx.report.nodes.values() if r.algorithm == "fft")


def test_a_layer_key_leaves_the_layers_non_convolution_backward_nodes_alone():
    g = og.Graph()
    x, w, b = g.input("x", (1, 2, 6, 6)), g.param("w", (3, 2, 3, 3)), g.param("b", (3,))
    y = og.conv2d(x, w, b, padding=1, name="conv2")
    outs = [y, *og.grad(y, [x, w, b])]
    exe = og.compile(outs, policy=LoweringPolicy(force={"conv2": "fft"}, exclude=["fused"]))
    bias = next(r for n, r in exe.report.nodes.items() if r.op_type == "BiasAddBackward")
    assert bias.how == "policy" and bias.algorithm == "reference"  # no fft rule: never forced
    assert {r.algorithm for r in exe.report.nodes.values() if r.op_type.startswith("Conv2d")} == {"fft"}


@pytest.mark.parametrize("key", ["conv*", "conv?", "*"])
def test_a_pattern_leaves_the_nodes_its_algorithm_cannot_lower_alone(key):
    """fresh-user report: ``conv*`` = ``fft`` matched ``conv2.grad/bias_add_backward`` by its full
    name and failed the compile (fft has no rule for a bias gradient); a pattern now forces only
    the nodes whose op the algorithm lowers, and their numbers are the reference's."""
    g = og.Graph()
    x, w, b = g.input("x", (1, 2, 6, 6)), g.param("w", (3, 2, 3, 3)), g.param("b", (3,))
    y = og.conv2d(x, w, b, padding=1, name="conv2")
    outs = [y, *og.grad(y, [x, w, b])]
    exe = og.compile(outs, policy=LoweringPolicy(force={key: "fft"}, exclude=["fused"]))
    conv = {r.algorithm for r in exe.report.nodes.values() if r.op_type.startswith("Conv2d")}
    assert conv == {"fft"}
    bias = next(r for r in exe.report.nodes.values() if r.op_type == "BiasAddBackward")
    assert bias.how != "forced" and bias.algorithm == "reference"
    rng = np.random.default_rng(0)
    feeds = dict(x=rng.standard_normal((1, 2, 6, 6)), w=rng.standard_normal((3, 2, 3, 3)), b=rng.standard_normal(3))
    gy = {y: rng.standard_normal((1, 3, 6, 6))}
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs=gy, **feeds)
    for got, want in zip(exe(grad_outputs=gy, **feeds), ref):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_an_exact_name_still_forces_an_algorithm_without_a_rule():
    g = og.Graph()
    x, w, b = g.input("x", (1, 2, 6, 6)), g.param("w", (3, 2, 3, 3)), g.param("b", (3,))
    y = og.conv2d(x, w, b, padding=1, name="conv2")
    outs = [y, *og.grad(y, [x, w, b])]
    with pytest.raises(LoweringError, match=r"conv2.grad/bias_add_backward.*'fft' has no rule for BiasAddBackward"):
        og.compile(outs, policy=LoweringPolicy(force={"conv2.grad/bias_add_backward": "fft"}, exclude=["fused"]))


@pytest.mark.parametrize("key", ["conv2.grad/bias*", "*bias_add_backward"])
def test_a_pattern_whose_nodes_its_algorithm_cannot_lower_warns(key):
    """Review: once patterns skipped the nodes their algorithm has no rule for, a pattern matching
    only such nodes forced nothing and said nothing (before, the compile failed)."""
    g = og.Graph("one conv")
    x, w, b = g.input("x", (1, 2, 6, 6)), g.param("w", (3, 2, 3, 3)), g.param("b", (3,))
    y = og.conv2d(x, w, b, padding=1, name="conv2")
    outs = [y, *og.grad(y, [x, w, b])]
    with pytest.warns(UserWarning, match=rf"force key {re.escape(repr(key))} = 'fft' matches 1 node\(s\) of graph "
                                         r"'one conv', none of whose ops 'fft' has a rule for \(e.g. "
                                         r"conv2.grad/bias_add_backward, BiasAddBackward\): it forces nothing"):
        exe = og.compile(outs, policy=LoweringPolicy(force={key: "fft"}, exclude=["fused"]))
    assert not [r for r in exe.report.nodes.values() if r.how == "forced"]


def test_a_narrowed_key_that_names_no_layer_warns():
    g, outs = conv_grads()
    with pytest.warns(UserWarning, match="'conv9:backward_data' matches no node"):
        lower(g, outs, LoweringPolicy(force={"conv9:backward_data": "fft"}))


def test_a_direction_on_a_node_without_one_warns():
    """``bn/stats:forward`` names the batch statistics' node, which has no
    direction, so it forces nothing: warned as a typo is (it passed silently)."""
    g = og.Graph()
    x = g.input("x", (2, 3, 4, 4))
    y = og.batch_norm(x, None, None, None, None, training=True, name="bn")
    with pytest.warns(UserWarning, match="'bn/stats:forward' matches no node"):
        exe = og.compile([y], policy=LoweringPolicy(force={"bn/stats:forward": "reference"}))
    assert exe.report.nodes["bn/stats"].how != "forced"


def test_forced_algorithm_that_declines_is_an_error_naming_node_and_reason():
    g, outs = conv_grads(k=5, padding=2)
    with pytest.raises(LoweringError) as e:
        lower(g, outs, LoweringPolicy(force={"conv2": "winograd"}))
    msg = str(e.value)
    assert "conv2" in msg and "'winograd'" in msg and "3x3" in msg


def test_forcing_an_unregistered_algorithm_is_a_policy_error():
    # fresh-user report: a policy file's misspelt force passed every up-front check and
    # failed each column after its float64 reference, where --lowering @L4=ftt was refused at once
    with pytest.raises(PolicyError, match=r"force.conv2='magic': unknown algorithm 'magic'; registered: "):
        LoweringPolicy(force={"conv2": "magic"})


def test_forcing_a_misspelt_algorithm_suggests_the_registered_one():
    with pytest.raises(PolicyError, match=r"force.conv2='ffft': unknown algorithm 'ffft' \(did you mean 'fft'\?\)"):
        LoweringPolicy(force={"conv2": "ffft"})


def test_forcing_an_algorithm_without_a_rule_for_the_op_is_a_lowering_error():
    g, outs = conv_grads()
    with pytest.raises(LoweringError, match=r"conv2.*'cublas' has no rule for Conv2d"):
        lower(g, outs, LoweringPolicy(force={"conv2": "cublas"}))


def test_the_warning_about_a_force_key_matching_no_node_names_the_callers_line():
    """Fresh-user report: the warning named passes/lower.py (``stacklevel=2``
    inside the pass); it names the line that called ``og.compile``."""
    import inspect
    import warnings

    g, outs = conv_grads()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        og.compile(outs, policy=LoweringPolicy(force={"conv9": "fft"}))
    (w,) = [w for w in caught if "'conv9' matches no node" in str(w.message)]
    assert (w.filename, w.lineno) == (__file__, line)


def test_unknown_force_key_is_noted():
    g, outs = conv_grads()
    with pytest.warns(UserWarning, match="'conv9' matches no node"):
        _, ctx = lower(g, outs, LoweringPolicy(force={"conv9": "fft"}))
    assert any("conv9" in n for n in ctx.report.notes)


def test_exclude_by_name_and_by_tag():
    g, outs = conv_grads()
    algos, ctx = algorithms(g, outs, LoweringPolicy(exclude=["gemm"]))
    assert set(algos.values()) == {"direct"}
    assert "excluded" in ctx.report.node("conv2").declined["gemm"]
    algos, _ = algorithms(g, outs, LoweringPolicy(prefer={"conv": ["fft", "winograd"]}, exclude=["fast"]))
    assert set(algos.values()) == {"gemm"}  # fft and winograd carry the tag 'fast'


def test_workspace_limit_declines_a_candidate():
    g, outs = conv_grads()
    algos, ctx = algorithms(g, outs, LoweringPolicy(prefer={"conv": ["fft"]}, workspace_limit=1000))
    assert algos["Conv2d"] != "fft"
    assert "workspace" in ctx.report.node("conv2").declined["fft"]


def test_include_enables_an_optional_rule(monkeypatch):
    install_scale_rules(monkeypatch, ["reference", "extra"])
    g = og.Graph()
    s = g.add_node(Scale(), [g.input("x", (3,))], name="s")
    _, ctx = lower(g, [s], LoweringPolicy(prefer={"*": ["extra"]}))
    assert ctx.report.node("s").algorithm == "reference"
    assert "opt-in" in ctx.report.node("s").declined["extra"]
    _, ctx = lower(g, [s], LoweringPolicy(prefer={"*": ["extra"]}, include=["extra"]))
    assert ctx.report.node("s").algorithm == "extra"


def test_no_applicable_rule_lists_every_reason(monkeypatch):
    install_scale_rules(monkeypatch, ["reference", "big"])
    g = og.Graph()
    s = g.add_node(Scale(), [g.input("x", (3,))], name="s")
    with pytest.raises(LoweringError) as e:
        lower(g, [s], LoweringPolicy(exclude=["reference"], workspace_limit=10))
    msg = str(e.value)
    assert "node s" in msg and "reference: excluded" in msg and "big: workspace" in msg


def test_rules_not_in_any_order_are_tried_last(monkeypatch):
    install_scale_rules(monkeypatch, ["reference", "slow", "fast"])
    s = survey("s", Scale(), (TensorType((3,)),), "cpu", LoweringPolicy())
    assert s.order == ("reference", "fast", "slow")


def test_cuda_order_puts_cudnn_first_and_declines_cpu_only_rules(monkeypatch):
    install_rule(monkeypatch, Conv2d, attrs.evolve(rules_for(Conv2d)["gemm"], algorithm="cpuonly",
                                                   devices={"cpu"}))
    op = Conv2d(padding=1)
    types = (TensorType((1, 4, 8, 8)), TensorType((4, 4, 3, 3)))
    s = survey("c", op, types, "cuda", LoweringPolicy(prefer={"conv": ["cpuonly"]}))
    assert s.declined()["cpuonly"] == "cpuonly has no cuda implementation"
    order = [a for a in s.order if a != "cpuonly"]
    expected = [a for a in ("cudnn", "cuda", "unfold", "gemm", "fft", "fft-chunked", "winograd", "direct") if a in order]
    assert order[:len(expected)] == expected
    cpu = survey("c", op, types, "cpu", LoweringPolicy(prefer={"conv": ["cpuonly"]}))
    assert cpu.applicable()[0].rule.algorithm == "cpuonly"


def test_lowered_nodes_compute_the_reference_result():
    g, outs = conv_grads(padding=((0, 2), (1, 0)), stride=2)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 4, 9, 9)), "w": rng.standard_normal((5, 4, 3, 3))}
    gy = rng.standard_normal(outs[0].shape)
    ref = og.compile(outs, pipeline="reference", dtype="float64")(grad_outputs={outs[0]: gy}, **feeds)
    for policy in (None, LoweringPolicy(prefer={"conv": ["fft"]}), LoweringPolicy(prefer={"conv": ["direct"]})):
        got = og.compile(outs, policy=policy)(grad_outputs={outs[0]: gy}, **feeds)
        for a, b in zip(got, ref):
            assert np.linalg.norm(a - b) <= 1e-4 * np.linalg.norm(b)


@pytest.mark.parametrize("storage, compile_dtype, asked, want", [
    ("float32", None, "fp32", "fp32"),        # given even when it is fp32: no "absent"
    ("bfloat16", None, "fp32", "bf16"),       # fp32 on half storage: the storage's own
    ("float32", "bfloat16", "fp32", "bf16"),  # the storage the node runs in counts
    ("bfloat16", None, "tf32", "tf32"),       # any other precision as asked
    ("float32", None, "bf16", "bf16"),
])
def test_the_resolved_precision_is_always_passed(monkeypatch, storage, compile_dtype, asked, want):
    """A rule tagged ``option:precision`` always gets the precision resolved for
    the node's storage (opgraph/precision.py), so that no kernel decides what
    an absent precision means."""
    from opgraph.backends.registry import Rule

    install_scale_rules(monkeypatch, ["reference"])
    install_rule(monkeypatch, Scale, Rule(Scale, "exact", lambda ctx, op, x: 2 * x,
                                          tags={"option:precision"}))
    g = og.Graph()
    y = g.add_node(Scale(), [g.input("x", (2, 3), storage)], name="s")
    ctx = PassContext(policy=LoweringPolicy(prefer={"*": ["exact"]}, precision=asked), dtype=compile_dtype)
    LowerPass()(g, [y], ctx)
    rec = ctx.report.node("s")
    assert rec.algorithm == "exact" and rec.options == {"precision": want}


def test_the_report_counts_steps_per_algorithm_and_cuda_steps_are_generated():
    g, p = conv_pool_graph()
    _, ctx = lower(g, [p])
    assert ctx.report.by_algorithm() == {"reference": 2, "gemm": 1}
    assert ctx.report.format().splitlines()[-1] == "steps per algorithm: reference 2, gemm 1"
    _, ctx = lower(g, [p], device="cuda")  # no GPU needed: the pass only asks the rules
    rec = ctx.report.node("relu1")
    assert rec.algorithm == "codegen" and rec.chosen == "codegen[cuda]:Relu()"
    assert ctx.report.node("pool1").algorithm == "cuda"
