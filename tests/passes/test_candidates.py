"""The candidates of a node (passes/candidates.py): one survey per node state per compile."""

import collections

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
