"""The fuse table's memory-bound rules (``passes/fuse_elementwise.py``) on the CPU:
``gradient-sum`` and ``elementwise``, opted in on the oracle algorithm
(``include=['fused-reference']``): where each applies, where it must not (another
reader, an output, a forced member, an excluded or declined algorithm), what
the report shows, and that the fused graph computes what the reference
pipeline does in float64, with and without fusion."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends.registry import Rule, rules_for
from opgraph.op import Lowered

from modern_blocks import bottleneck, mbconv
from passes_stubs import StubTimer, install_rule

ON = ["fused-reference"]


def fused_nodes(exe):
    return [st for st in exe.steps if st.op.op.name == "FusedElementwise"]


def fan_out(n: int = 4):
    """``x`` read by ``n`` branches ``relu(x * s_k)``: the gradient of ``x`` is a
    sum of ``n`` terms (``n - 1`` Add nodes), which a ReLU gradient then masks."""
    g = og.Graph()
    x0 = g.input("x0", (2, 3, 4, 4))
    x = og.relu(x0, name="x")
    scales = [g.param(f"s{k}", (2, 3, 4, 4)) for k in range(n)]
    branches = [og.flatten(og.relu(og.mul(x, s, name=f"mul{k}"), name=f"r{k}")) for k, s in enumerate(scales)]
    y = og.concat(branches, dim=1, name="y")
    return g, y, [y, *og.grad(y, [x0, *scales])]


def feeds_of(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal(s.type.shape) for s in graph.sources() if s.op.role != "grad"}


def run_three_ways(outs, policy=None, seed=0):
    """The outputs with fusion on (opted in), off, and by the float64 reference pipeline."""
    gy = {outs[0]: np.random.default_rng(seed + 1).standard_normal(outs[0].shape)}
    feeds = feeds_of(outs[0].graph, seed)
    on = og.compile(outs, policy={"include": ON, **(policy or {})}, dtype="float64")
    off = og.compile(outs, policy={"exclude": ["fused"], **(policy or {})}, dtype="float64")
    ref = og.compile(outs, pipeline="reference", dtype="float64")
    return on, [e(grad_outputs=gy, **feeds) for e in (on, off, ref)]


def test_the_fan_out_gradient_sum_becomes_one_n_ary_sum():
    g, y, outs = fan_out(4)
    exe, (got, unfused, want) = run_three_ways(outs)
    sums = [st for st in fused_nodes(exe) if set(st.op.op.members) == {"Add"}]
    assert len(sums) == 0  # the sum's ReluBackward reads it alone: one chain took both
    # x's whole gradient is one chain: each branch's ReLU gradient and product, the sum, x's ReLU gradient
    (node,) = [st for st in fused_nodes(exe) if "Add" in st.op.op.members]
    members = node.op.op.members
    assert members.count("Add") == 3 and members.count("Mul") == 4 and members[-1] == "ReluBackward"
    assert node.name == "x0.grad" or exe.graph.node(node.node).type.shape == (2, 3, 4, 4)
    assert not any(st.op.op.name == "Add" for st in exe.steps)
    for a, b, w in zip(got, unfused, want):
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(b, w, rtol=1e-12, atol=1e-12)
    notes = "\n".join(exe.report.notes)
    assert "fuse: 1 n-ary sum(s) of Add nodes fused" in notes  # then spliced into the chain


def test_the_gradient_sum_rule_alone_makes_the_n_ary_sum():
    g, y, outs = fan_out(4)
    exe = og.compile(outs, policy={"include": ON, "exclude": ["elementwise"]})
    sums = [st.op.op.members for st in fused_nodes(exe)]
    assert sums == [("Add", "Add", "Add")]
    assert not any(st.op.op.name == "Add" for st in exe.steps)
    assert any("elementwise: not applied: excluded by policy (exclude=['elementwise'])" in n
               for n in exe.report.notes)
    exe = og.compile(outs, policy={"include": ON, "exclude": ["gradient-sum", "elementwise"]})
    assert not fused_nodes(exe) and sum(st.op.op.name == "Add" for st in exe.steps) == 3


def test_a_sum_read_elsewhere_or_wanted_keeps_its_add():
    g, y, outs = fan_out(3)
    add_nodes = [v for v in g.nodes_in_order(outs) if v.op.name == "Add"]
    inner, outer = add_nodes  # ((t0 + t1) + t2)
    assert g.input_ids(outer.id)[0] == inner.id
    exe = og.compile([*outs, inner.output], policy={"include": ON, "exclude": ["elementwise"]})
    assert not fused_nodes(exe)  # the inner sum is an output: not private
    extra = og.flatten(og.neg(inner.output), name="extra")  # another reader
    exe = og.compile([*outs, extra], policy={"include": ON, "exclude": ["elementwise"]})
    assert not fused_nodes(exe)


def test_vertical_chain_fuses_and_stops_at_other_readers_and_outputs():
    g = og.Graph()
    x, b, r = g.input("x", (2, 4, 3, 3)), g.param("b", (4,)), g.input("r", (2, 4, 3, 3))
    h = og.bias_add(x, b, name="bias")
    s = og.add(h, r, name="sum")
    a = og.sigmoid(og.relu(s, name="relu"), name="sig")
    y = og.flatten(a, name="y")
    exe = og.compile([y], policy={"include": ON})
    (node,) = fused_nodes(exe)
    assert node.op.op.members == ("BiasAdd", "Add", "Relu", "Sigmoid") and node.name == "sig"
    assert [v.name for v in exe.graph.node(node.node).inputs] == ["x", "b", "r"]
    assert all(n not in exe.graph for n in ("bias", "sum", "relu"))
    rec = exe.report.node("sig")
    assert rec.absorbed == {"bias": "BiasAdd", "sum": "Add", "relu": "Relu"}
    assert "absorbed: bias (BiasAdd), sum (Add), relu (Relu)" in exe.report.format()
    # the sum wanted as an output: the chain starts after it
    exe = og.compile([y, s], policy={"include": ON})
    assert sorted(st.op.op.members for st in fused_nodes(exe)) == [("BiasAdd", "Add"), ("Relu", "Sigmoid")]
    # the ReLU read elsewhere: sum's chain ends at the ReLU, the sigmoid stays alone
    other = og.flatten(og.neg(g["relu"]), name="other")
    exe = og.compile([y, other], policy={"include": ON})
    assert [st.op.op.members for st in fused_nodes(exe)] == [("BiasAdd", "Add", "Relu")]
    assert "sig" in exe.graph and exe.graph["sig"].op.op.name == "Sigmoid"


def test_not_on_the_oracle_by_default_nor_when_excluded_or_forced():
    g = og.Graph()
    x = g.input("x", (2, 4, 3, 3))
    y = og.flatten(og.sigmoid(og.relu(x, name="relu"), name="sig"))
    exe = og.compile([y])  # the CPU default: no fusion on reference (slower, module docstring)
    assert not fused_nodes(exe)
    assert any("opt in with include=['fused-reference']" in n for n in exe.report.notes)
    exe = og.compile([y], policy={"exclude": ["fused"]})  # beside include=ON it is refused: ON would do nothing
    assert not fused_nodes(exe)
    assert any("elementwise: not applied: excluded by policy (exclude=['fused'])" in n for n in exe.report.notes)
    exe = og.compile([y], policy={"include": ON, "exclude": ["elementwise"]})
    assert not fused_nodes(exe)
    exe = og.compile([y], policy={"include": ON})
    assert [st.op.op.members for st in fused_nodes(exe)] == [("Relu", "Sigmoid")]


def test_a_member_forced_elsewhere_stays_out(monkeypatch):
    g = og.Graph()
    x = g.input("x", (2, 4, 3, 3))
    y = og.flatten(og.sigmoid(og.relu(og.neg(x, name="neg"), name="relu"), name="sig"))
    relu_ref = rules_for(ops.Relu)["reference"]
    install_rule(monkeypatch, ops.Relu, Rule(ops.Relu, "other", relu_ref.kernel))
    exe = og.compile([y], policy={"include": ON, "force": {"relu": "other"}})
    assert [st.op.op.members for st in fused_nodes(exe)] == []  # neg and sig are split by the forced ReLU
    assert exe.graph["relu"].op.algorithm == "other"
    exe = og.compile([y], policy={"include": ON})
    assert [st.op.op.members for st in fused_nodes(exe)] == [("Neg", "Relu", "Sigmoid")]


def test_a_declining_fused_rule_leaves_the_chain(monkeypatch):
    """The algorithm's FusedElementwise rule decides how far a chain grows."""
    import attrs

    ref = rules_for(ops.FusedElementwise)["reference"]
    no_sigmoid = attrs.evolve(ref, check=lambda op, types, device: (
        "no sigmoid" if "Sigmoid" in op.members else None))
    install_rule(monkeypatch, ops.FusedElementwise, no_sigmoid)
    g = og.Graph()
    x = g.input("x", (2, 4, 3, 3))
    y = og.flatten(og.relu(og.sigmoid(og.neg(x, name="neg"), name="sig"), name="relu"))
    exe = og.compile([y], policy={"include": ON})
    assert fused_nodes(exe) == []  # relu's producer is the sigmoid, refused; nothing else to join
    y2 = og.flatten(og.sigmoid(og.relu(og.neg(g["x"], name="neg2"), name="relu2"), name="sig2"))
    exe = og.compile([y2], policy={"include": ON})
    assert [st.op.op.members for st in fused_nodes(exe)] == [("Neg", "Relu")]


@pytest.mark.parametrize("make", [bottleneck, mbconv], ids=["bottleneck", "mbconv"])
def test_modern_blocks_fused_compute_the_reference_values(make):
    """Training batch norm, SiLU, squeeze-and-excitation, dropout, residuals:
    every output and gradient equal to the float64 reference with fusion on
    and off."""
    output, params, extra = make()
    outs = [output, *og.grad(output, params), *extra]
    exe, (got, unfused, want) = run_three_ways(outs, {"prefer": {"conv": ["gemm"]}})
    assert fused_nodes(exe)
    floor = 1e-4 * max(np.linalg.norm(w) for w in want)  # a gradient that is 0 but for rounding (check.py)
    for a, b, w in zip(got, unfused, want):
        scale = max(np.linalg.norm(w), floor)
        assert np.linalg.norm(a - w) / scale < 1e-10
        assert np.linalg.norm(b - w) / scale < 1e-10
    assert all(isinstance(v.op, Lowered) for v in exe.graph.nodes_in_order(exe.outputs)
               if v.op.name not in ("Input", "Param", "Buffer", "Grad"))


def _off_by_one(ctx, op, *arrays):
    return rules_for(ops.FusedElementwise)["reference"].kernel(ctx, op, *arrays) + 1.0


def test_the_autotuner_rejects_a_broken_fused_candidate(monkeypatch, tmp_path):
    """A fused node is autotuned like any lowering: each candidate checked
    against the float64 reference; a wrong one loses however fast it is."""
    install_rule(monkeypatch, ops.FusedElementwise, Rule(ops.FusedElementwise, "broken", _off_by_one))
    g = og.Graph()
    x = g.input("x", (2, 4, 3, 3))
    y = og.flatten(og.sigmoid(og.relu(x, name="relu"), name="sig"))
    timer = StubTimer({"broken": 0.001, "reference": 1.0})
    exe = og.compile([y], policy={"include": ON, "autotune": True, "cache": str(tmp_path / "c.json")},
                     timer=timer)
    (st,) = fused_nodes(exe)
    rows = {c.algorithm: c for c in exe.report.node(st.name).candidates}
    assert rows["broken"].status == "wrong" and rows["reference"].status == "chosen"
    assert st.op.algorithm == "reference" and rows["broken"].rel_error > 0.1
