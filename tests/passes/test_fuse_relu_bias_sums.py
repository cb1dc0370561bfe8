"""The ``relu-bias-sums`` fusion rule (``passes/fuse_relu_bias_sums.py``): a bias gradient of a
ReLU gradient becomes a slot that the ReLU gradient fills with its per-channel sums; the
training step equals the unfused one and the float64 reference, also when the slot's step
leaves garbage; the rule is a default and turns off by name (and with ``fused``), on the CPU's
oracle it waits for ``fused-reference``; a bias gradient read before
the ReLU gradient could fill it is left alone; autotune and the per-node check read the sums
as a second result, so a kernel that does not write them is wrong."""

from __future__ import annotations

import collections

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends.registry import rules_for
from opgraph.op import Lowered
from opgraph.passes.policy import LoweringPolicy

from fused_training_steps import pooled, rule_on_and_off, step_errors, training_step
from passes_stubs import StubTimer, compile_for_cuda, cudnn_accepts, install_rule
from test_inplace import out_of_place

def branches():
    """Two conv + bias + ReLU branches concatenated, then a conv + bias + ReLU: the branches'
    ReLU gradients read slices of the concat's gradient (no backward-data before them for
    ``dgrad-relu``), and the last one reads the output gradient."""
    g = og.Graph("branches")
    x = g.input("x", (2, 3, 9, 9))
    wa, ba = g.param("wa", (8, 3, 3, 3)), g.param("ba", (8,))  # channels: whole 16-byte bfloat16 loads
    wb, bb = g.param("wb", (16, 3, 1, 1)), g.param("bb", (16,))
    wc, bc = g.param("wc", (8, 24, 3, 3)), g.param("bc", (8,))
    a = og.relu(og.conv2d(x, wa, ba, padding=1))
    b = og.relu(og.conv2d(x, wb, bb))
    y = og.relu(og.conv2d(og.concat([a, b], dim=1), wc, bc, stride=2))
    return y, [x, wa, ba, wb, bb, wc, bc], []


def _kinds(exe):
    return collections.Counter(v.op.op.name for v in exe.graph.nodes_in_order(exe.outputs)
                               if isinstance(v.op, Lowered))


def _sums_only_dropped(ctx, op, y, gy, sums):
    """A ReLU gradient that is right but never writes its sums."""
    return rules_for(og.ops.ReluBackward)["reference"].kernel(ctx, og.ops.ReluBackward(), y, gy)


def test_the_training_step_with_the_sums_written_by_the_relu_gradient_equals_the_unfused_one():
    on, off, errors = rule_on_and_off(branches, "relu-bias-sums")
    kinds, off_kinds = _kinds(on), _kinds(off)
    fused = on.report.fusion["relu-bias-sums"]["applied"]
    assert fused >= 2 and kinds["ReluBackwardSums"] == kinds["ReluBackwardSumsSlot"] == fused
    assert kinds["BiasAddBackward"] == off_kinds["BiasAddBackward"] - fused
    assert off.report.fusion["relu-bias-sums"] == {"excluded": True} and not off_kinds["ReluBackwardSums"]
    for fused_err, unfused_err, between in errors:
        assert fused_err < 1e-6 and unfused_err < 1e-6 and between < 1e-6


def _garbage_slots(exe):
    def garbage(ctx, op, y, gy):
        return np.full(ctx.out_shape(op, y, gy), 77.0, dtype=np.dtype(ctx.out_type.dtype))
    exe.steps = [attrs.evolve(st, kernel=garbage) if st.op.op.filled_by_reader else st for st in exe.steps]
    return exe


def test_the_bias_gradients_are_what_the_relu_gradient_wrote_not_what_the_slot_step_left():
    outs, feeds, _ = training_step(branches, np.random.default_rng(1))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    policy = {"include": ["fused-reference"]}
    on = _garbage_slots(og.compile(outs, device="cpu", policy=policy))
    off = og.compile(outs, device="cpu", policy={"include": ["fused-reference"], "exclude": ["relu-bias-sums"]})
    assert _kinds(on)["ReluBackwardSumsSlot"] >= 2
    for fused, _, between in step_errors(on(**feeds), off(**feeds), ref):
        assert fused < 1e-6 and between < 1e-6
    broken = _garbage_slots(og.compile(outs, device="cpu", policy=policy))
    broken.steps = [attrs.evolve(st, kernel=_sums_only_dropped) if st.op.op.name == "ReluBackwardSums" else st
                    for st in broken.steps]
    errors = step_errors(broken(**feeds), off(**feeds), ref)
    assert max(e[0] for e in errors[1:]) > 1e-3  # a bias gradient of 77s


def _in_place(exe) -> dict[str, str]:
    """Step name -> the name of the input whose buffer it overwrites (``Step.writes_into``)."""
    names = {st.node: st.name for st in exe.steps}
    return {st.name: names[st.writes_into] for st in exe.steps if st.writes_into is not None}


def test_the_relu_gradient_that_writes_the_sums_overwrites_gy_in_place_as_relu_backward_does():
    """The memory pass lets ``ReluBackwardSums`` write its gradient into gy where gy dies there
    (the pooling's gradient; ``pool-relu-backward`` excluded, else the mask goes through the
    gather): the same in-place steps and bytes as the unfused graph, never the slot (input 2);
    the results equal the same executable run out of place exactly, and the float64 reference."""
    outs, feeds, _ = training_step(pooled, np.random.default_rng(2))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    include, exclude = ["fused-reference"], ["pool-relu-backward"]
    on = og.compile(outs, device="cpu", policy={"include": include, "exclude": exclude})
    off = og.compile(outs, device="cpu", policy={"include": include, "exclude": [*exclude, "relu-bias-sums"]})
    assert _kinds(on)["ReluBackwardSums"] == 2 and not _kinds(off)["ReluBackwardSums"]
    assert _in_place(on)["relu1.grad/relu_backward"] == "pool1.grad/max_pool2d_backward"
    assert _in_place(on) == _in_place(off)  # ReluBackward wrote into the same gy
    assert {k: on.report.memory[k] for k in ("inplace", "inplace_bytes")} == \
        {k: off.report.memory[k] for k in ("inplace", "inplace_bytes")}
    assert all(st.inplace == 1 for st in on.steps if st.op.op.name == "ReluBackwardSums" and st.inplace is not None)
    got = on(**feeds)
    apart = out_of_place(on)(**feeds)
    for a, b in zip(got, apart):
        np.testing.assert_array_equal(a, b)
    for fused, unfused, between in step_errors(got, off(**feeds), ref):
        assert fused < 1e-6 and unfused < 1e-6 and between < 1e-6


def test_the_rule_is_a_default_and_turns_off_by_name():
    """A default since its kernel ran on the H200 (2026-12-05; the module docstring): it
    rewrites without being named in ``include``; ``exclude=['relu-bias-sums']`` turns it off
    alone; naming it in ``include`` has no effect (noted)."""
    y, params, _ = branches()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    exe = og.compile(outs, device="cpu", policy={"include": ["fused-reference"]})
    fused = exe.report.fusion["relu-bias-sums"]["applied"]
    assert fused >= 2 and _kinds(exe)["ReluBackwardSums"] == fused
    assert not [n for n in exe.report.notes if "relu-bias-sums" in n]
    exe = og.compile(outs, device="cpu", policy={"include": ["fused-reference"], "exclude": ["relu-bias-sums"]})
    assert exe.report.fusion["relu-bias-sums"] == {"excluded": True} and not _kinds(exe)["ReluBackwardSums"]
    assert exe.report.fusion["conv-epilogue"]["applied"] == 2  # alone: the others still run
    assert "fuse: relu-bias-sums: not applied: excluded by policy (exclude=['relu-bias-sums'])" in exe.report.notes
    exe = og.compile(outs, device="cpu", policy={"exclude": ["fused"]})
    assert exe.report.fusion["relu-bias-sums"] == {"excluded": True} and not _kinds(exe)["ReluBackwardSums"]
    exe = og.compile(outs, device="cpu", policy={"include": ["fused-reference", "relu-bias-sums"]})
    assert exe.report.fusion["relu-bias-sums"]["applied"] == fused
    assert any(n.startswith("policy include ['relu-bias-sums']: no effect") for n in exe.report.notes)


def test_on_the_oracle_without_its_opt_in_the_rule_says_what_to_do():
    """On the CPU's oracle the sums save no pass: the rule waits for ``include=['fused-reference']``
    (the oracle's opt-in, not the rule's) and its note says so; a graph without a bias gradient
    gets no relu-bias-sums note."""
    y, params, _ = branches()
    exe = og.compile([y, *og.grad(y, params, grad_outputs=[y])], device="cpu")
    assert exe.report.fusion["relu-bias-sums"] == {"applied": 0, "declined": 0, "opt_in": True}
    assert not _kinds(exe)["ReluBackwardSums"]
    assert any(n.startswith("fuse: relu-bias-sums: not applied:") and "include=['fused-reference']" in n
               for n in exe.report.notes)
    g = og.Graph("no bias")
    x, w = g.input("x", (1, 3, 6, 6)), g.param("w", (4, 3, 3, 3))
    y = og.relu(og.conv2d(x, w))  # no bias: no bias gradient to fill
    exe = og.compile([y, *og.grad(y, [w], grad_outputs=[y])], device="cpu", policy={"include": ["fused-reference"]})
    assert exe.report.fusion["relu-bias-sums"] == {"applied": 0, "declined": 0}
    assert not [n for n in exe.report.notes if "relu-bias-sums" in n]


def test_a_bias_gradient_read_before_the_relu_gradient_could_fill_it_is_left_alone():
    """A reader of the bias gradient that does not descend from the ReLU gradient by another
    path would read the slot before it is filled: the rule declines (verify would refuse)."""
    g = og.Graph("early reader")
    y = g.input("y", (2, 3, 5, 5))
    gy = g.input("gy", (2, 3, 5, 5))
    relu_grad = g.apply(og.ops.ReluBackward, {}, [y, gy])
    bias_grad = g.apply(og.ops.BiasAddBackward, {}, [relu_grad])
    scaled = g.apply(og.ops.BiasAdd, {}, [gy, bias_grad])  # reads the sums, not the ReLU gradient
    policy = {"include": ["fused-reference"]}
    exe = og.compile([relu_grad, scaled, bias_grad], device="cpu", policy=policy)
    assert not _kinds(exe)["ReluBackwardSums"]
    assert any("does not run after the ReLU gradient" in n for n in exe.report.notes)
    exe = og.compile([relu_grad, bias_grad], device="cpu", policy=policy)  # no such reader: fused
    assert _kinds(exe)["ReluBackwardSums"] == 1
    rng = np.random.default_rng(3)
    yv, gyv = rng.standard_normal(y.shape), rng.standard_normal(gy.shape)
    got, sums = exe(y=yv, gy=gyv)
    np.testing.assert_allclose(got, gyv * (yv > 0), rtol=1e-6)
    np.testing.assert_allclose(sums, (gyv * (yv > 0)).sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)


def test_autotune_checks_the_sums_as_a_second_result(monkeypatch, tmp_path):
    rule = rules_for(og.ops.ReluBackwardSums)["reference"]

    def sums(ctx, op, y, gy, slot):
        return rule.kernel(ctx, op, y, gy, slot) if ctx.options.get("fill", True) else _sums_only_dropped(ctx, op, y, gy, slot)

    install_rule(monkeypatch, og.ops.ReluBackwardSums,
                 attrs.evolve(rule, kernel=sums, variants=lambda op, types, dev: [{"fill": False}, {"fill": True}]))
    y, params, _ = branches()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    policy = LoweringPolicy(autotune=True, include=["fused-reference"], cache=str(tmp_path / "c.json"))
    exe = og.compile(outs, policy=policy, timer=StubTimer({"reference[fill=False]": 0.1}))
    recs = [r for r in exe.report.nodes.values() if r.op_type == "ReluBackwardSums"]
    assert len(recs) >= 2
    for rec in recs:
        status = {c.label: c.status for c in rec.candidates}
        assert status["reference[fill=False]"] == "wrong" and status["reference[fill=True]"] == "chosen"


def test_a_relu_gradient_read_by_its_bias_gradient_alone_is_left_alone():
    """Fine-tuning the bias only: the ReLU gradient feeds nothing but its bias gradient. Fused,
    nothing would read the node that writes the sums (not an ancestor of the outputs, so the
    slot would have no filler): the rule declines, the compile does not fail."""
    g = og.Graph("bias only")
    y = g.input("y", (2, 3, 5, 5))
    gy = g.input("gy", (2, 3, 5, 5))
    bias_grad = g.apply(og.ops.BiasAddBackward, {}, [g.apply(og.ops.ReluBackward, {}, [y, gy])])
    exe = og.compile([bias_grad], device="cpu",
                     policy={"include": ["fused-reference"], "exclude": ["elementwise"]})
    assert not _kinds(exe)["ReluBackwardSums"]
    assert any("read by its bias gradient alone" in n for n in exe.report.notes)


@pytest.mark.parametrize("layout, dtype, why", [("NCHW", None, "channels-last 4-D rows"),
                                                ("NHWC", "float16", "no 16-byte lanes")])
def test_on_cuda_the_rule_leaves_values_the_fused_kernel_can_never_take(monkeypatch, layout, dtype, why):
    """NCHW values or float16 storage would always take the fallback (a ReLU gradient, a bias
    gradient and a copy: more than the two nodes unfused): the cuda rule declines by type, and
    the pair stays apart."""
    cudnn_accepts(monkeypatch)
    y, params, _ = branches()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    graph, louts, report = compile_for_cuda(outs, og.LoweringPolicy(layout=layout),
                                            dtype=dtype)
    kinds = collections.Counter(v.op.op.name for v in graph.nodes_in_order(louts) if isinstance(v.op, Lowered))
    assert not kinds["ReluBackwardSums"] and kinds["BiasAddBackward"] >= 2
    assert report.fusion["relu-bias-sums"]["applied"] == 0 and report.fusion["relu-bias-sums"]["declined"] >= 2
    assert any("bias gradient(s) written by the ReLU gradient" in n and why in n for n in report.notes)
    # and channels-last bfloat16 takes it
    graph, louts, report = compile_for_cuda(outs, og.LoweringPolicy(layout="NHWC"),
                                            dtype="bfloat16")
    assert report.fusion["relu-bias-sums"] == {"applied": 3, "declined": 0}


def classifier(threshold: float = 0.0):
    """The AlexNet-style head (``benchmarks/models/common.py``): linear, ``threshold(t, 1e-6)``,
    linear, ``threshold(t, 1e-6)``, linear; 2-D (N, features) values, 16 features a layer (whole
    16-byte lanes)."""
    g = og.Graph("classifier")
    x = g.input("x", (6, 24))
    params, y = [], x
    for i, (fan_in, fan_out) in enumerate([(24, 16), (16, 16)]):
        w, b = g.param(f"w{i}", (fan_out, fan_in)), g.param(f"b{i}", (fan_out,))
        y = og.threshold(og.linear(y, w, b), threshold, 1e-6, name=f"thresh{i}")
        params += [w, b]
    w, b = g.param("w2", (8, 16)), g.param("b2", (8,))
    return og.linear(y, w, b), [x, *params, w, b], []


@pytest.mark.parametrize("threshold", [0.0, -0.0])
def test_a_threshold_gradient_at_zero_writes_the_bias_sums_as_the_relu_gradient_does(threshold):
    """``ThresholdBackward`` at threshold 0 is the ReLU gradient of its input bit for bit: its bias
    gradient becomes the slot it fills (the two hidden layers; the last layer's has no threshold
    gradient), and the step equals the unfused one and the float64 reference."""
    on, off, errors = rule_on_and_off(lambda: classifier(threshold), "relu-bias-sums")
    kinds, off_kinds = _kinds(on), _kinds(off)
    assert on.report.fusion["relu-bias-sums"]["applied"] == 2
    assert kinds["ReluBackwardSums"] == kinds["ReluBackwardSumsSlot"] == 2 and not kinds["ThresholdBackward"]
    assert off_kinds["ThresholdBackward"] == 2 and kinds["BiasAddBackward"] == off_kinds["BiasAddBackward"] - 2
    for fused_err, unfused_err, between in errors:
        assert fused_err < 1e-6 and unfused_err < 1e-6 and between < 1e-6


def test_a_threshold_gradient_at_another_threshold_is_left_alone():
    """At threshold 0.1 the gradient masks ``x > 0.1``, not the ReLU's ``x > 0``: no rewrite."""
    on, _, errors = rule_on_and_off(lambda: classifier(0.1), "relu-bias-sums")
    assert not on.report.fusion["relu-bias-sums"].get("applied") and _kinds(on)["ThresholdBackward"] == 2
    for fused_err, unfused_err, _ in errors:
        assert fused_err < 1e-6 and unfused_err < 1e-6
