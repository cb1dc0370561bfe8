"""The ``ln-backward-sums`` fusion rule (``passes/fuse_ln_backward_sums.py``): a layer norm's weight
gradient becomes a slot that its data gradient fills. On the CPU's oracle (opted in) the
training step of a ConvNeXt block equals the unfused one and the float64 reference, also when
the slot's step leaves garbage; for cuda (no GPU: the passes only ask the rules) the rule
rewrites the block's pair onto the ``codegen`` kernels; it turns off by name and with
``fused``; on the oracle it waits for ``fused-reference``; a weight gradient read before the data
gradient could fill it, another eps, or rows the fused kernel cannot take leave the pair apart."""

from __future__ import annotations

import collections

import attrs
import numpy as np

import opgraph as og
from opgraph.backends.cuda.codegen import plan
from opgraph.op import Lowered
from opgraph.passes.policy import LoweringPolicy

from fused_training_steps import rule_on_and_off, step_errors, training_step
from passes_stubs import compile_for_cuda
import modern_blocks

NAME = "ln-backward-sums"


def block():
    return modern_blocks.convnext_block("scale", (2, 8, 3, 5))


def _kinds(graph, outputs):
    return collections.Counter(v.op.op.name for v in graph.nodes_in_order(outputs) if isinstance(v.op, Lowered))


def _exe_kinds(exe):
    return _kinds(exe.graph, exe.outputs)


def test_on_the_oracle_the_fused_step_equals_the_unfused_one_and_the_reference():
    on, off, errors = rule_on_and_off(block, NAME)
    assert on.report.fusion[NAME] == {"applied": 1, "declined": 0}
    assert off.report.fusion[NAME] == {"excluded": True}
    kinds, off_kinds = _exe_kinds(on), _exe_kinds(off)
    assert kinds["LayerNormBackwardDataSums"] == kinds["LayerNormBackwardScaleSlot"] == 1
    assert not kinds["LayerNormBackwardScale"] and not kinds["LayerNormBackwardData"]
    assert off_kinds["LayerNormBackwardScale"] == 1 and not off_kinds["LayerNormBackwardDataSums"]
    for fused_err, unfused_err, between in errors:
        assert fused_err < 1e-6 and unfused_err < 1e-6 and between < 1e-6


def test_the_weight_gradient_is_what_the_data_gradient_wrote_not_what_the_slot_step_left():
    outs, feeds, _ = training_step(block, np.random.default_rng(1))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    on = og.compile(outs, device="cpu", policy={"include": ["fused-reference", NAME]})

    def garbage(ctx, op, gy, x):
        return np.full(ctx.out_shape(op, gy, x), 77.0, dtype=np.dtype(ctx.out_type.dtype))
    on.steps = [attrs.evolve(st, kernel=garbage) if st.op.op.filled_by_reader else st for st in on.steps]
    off = og.compile(outs, device="cpu", policy={"include": ["fused-reference"], "exclude": [NAME]})
    for fused, _, between in step_errors(on(**feeds), off(**feeds), ref):
        assert fused < 1e-6 and between < 1e-6


def test_on_the_oracle_without_its_opt_in_the_rule_says_what_to_do():
    y, params, _ = block()
    exe = og.compile([y, *og.grad(y, params, grad_outputs=[y])], device="cpu", policy={"include": [NAME]})
    assert exe.report.fusion[NAME] == {"applied": 0, "declined": 0, "opt_in": True}
    assert any(n.startswith(f"fuse: {NAME}: not applied:") and "include=['fused-reference']" in n
               for n in exe.report.notes)
    assert not any("no effect" in n for n in exe.report.notes)  # the include acts: the rule matched


def test_until_its_kernel_has_run_on_a_gpu_the_rule_waits_for_its_name():
    """``fuse.OPT_IN_RULES``: without ``include=['ln-backward-sums']`` the pair stays apart on cuda and
    the report says why and what to include; the include is not reported as idle."""
    from opgraph.passes.fuse import OPT_IN_RULES
    from opgraph.passes.policy_names import idle_includes
    assert NAME in OPT_IN_RULES
    kinds, report, _, _ = _cuda(include=False)
    assert report.fusion[NAME] == {"applied": 0, "declined": 0, "opt_in": True}
    assert kinds["LayerNormBackwardScale"] == kinds["LayerNormBackwardData"] == 1
    assert any(n.startswith(f"fuse: {NAME}: not applied:") and f"include=[{NAME!r}]" in n
               and "GPU" in n for n in report.notes)
    assert idle_includes(LoweringPolicy(include=[NAME])) == []


def _cuda(policy=None, dtype="bfloat16", include=True):
    """The block's step compiled for cuda (no GPU); ``include``: the rule opted in (``fuse.OPT_IN_RULES``)
    unless the policy excludes it."""
    y, params, _ = block()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    policy = dict(policy or {})
    if include and not policy.get("exclude"):
        policy["include"] = [NAME]
    graph, outputs, report = compile_for_cuda(outs, LoweringPolicy(layout="NHWC", **policy), dtype)
    return _kinds(graph, outputs), report, graph, outputs


def test_for_cuda_the_pair_becomes_the_codegen_data_gradient_filling_the_slot():
    kinds, report, graph, outputs = _cuda()
    assert report.fusion[NAME] == {"applied": 1, "declined": 0}
    assert kinds["LayerNormBackwardDataSums"] == kinds["LayerNormBackwardScaleSlot"] == 1
    assert {v.op.algorithm for v in graph.nodes_in_order(outputs)
            if isinstance(v.op, Lowered) and v.op.op.name.startswith("LayerNormBackward")} == {"codegen"}
    for exclude in ([NAME], ["fused"]):
        kinds, report, _, _ = _cuda({"exclude": exclude})
        assert report.fusion[NAME] == {"excluded": True}
        assert kinds["LayerNormBackwardScale"] == 1 and not kinds["LayerNormBackwardDataSums"]


def test_for_cuda_rows_the_fused_kernel_cannot_take_keep_the_pair(monkeypatch):
    """Rows past ``plan.ROW_SWEEP_VECTORS`` vectors a thread: the codegen rule declines the fused
    node, the rule counts a declined rewrite, and the pair keeps its own kernels."""
    monkeypatch.setattr(plan, "ROW_SWEEP", False)
    kinds, report, _, _ = _cuda()
    assert report.fusion[NAME] == {"applied": 0, "declined": 1}
    assert kinds["LayerNormBackwardScale"] == kinds["LayerNormBackwardData"] == 1


def _pair_graph(eps_scale=1e-5, early=False):
    """gy and x of a layer norm over 6 with the data and weight gradients (the weight gradient's eps
    ``eps_scale``); ``early``: another output reads the weight gradient without depending on dx."""
    g = og.Graph("pair")
    x, gy, w = g.input("x", (4, 5, 6)), g.input("gy", (4, 5, 6)), g.input("w", (6,))
    dx = g.apply(og.ops.LayerNormBackwardData, {"normalized_shape": (6,), "eps": 1e-5}, [gy, x, w])
    dw = g.apply(og.ops.LayerNormBackwardScale, {"normalized_shape": (6,), "eps": eps_scale}, [x, gy])
    outs = [dx, dw]
    if early:
        outs.append(og.mul(w, dw))  # reads dw, not dx
    return outs


def test_a_weight_gradient_read_before_the_data_gradient_or_of_another_eps_is_left_alone():
    policy = {"include": ["fused-reference", NAME]}
    exe = og.compile(_pair_graph(), device="cpu", policy=policy)
    assert _exe_kinds(exe)["LayerNormBackwardDataSums"] == 1
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((4, 5, 6)), "gy": rng.standard_normal((4, 5, 6)), "w": rng.standard_normal(6)}
    ref = og.compile(_pair_graph(), pipeline="reference", dtype="float64")(**feeds)
    for got, want in zip(exe(**feeds), ref):  # float32 against float64
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-6
    exe = og.compile(_pair_graph(early=True), device="cpu", policy=policy)
    assert not _exe_kinds(exe)["LayerNormBackwardDataSums"]
    assert any("does not run after the data gradient" in n for n in exe.report.notes)
    exe = og.compile(_pair_graph(eps_scale=1e-6), device="cpu", policy=policy)
    assert not _exe_kinds(exe)["LayerNormBackwardDataSums"]
    assert exe.report.fusion[NAME] == {"applied": 0, "declined": 0}


def test_a_data_gradient_without_a_weight_or_over_other_axes_is_left_alone():
    """Review: the pair fuses only when the data gradient has a weight and both ops normalise the same
    axes with the same eps; a weightless data gradient, or a weight gradient over (5, 6) beside a data
    gradient over (6,), keep their own kernels (and their values)."""
    policy = {"include": ["fused-reference", NAME]}
    for weighted, scale_shape in ((False, (6,)), (True, (5, 6))):
        g = og.Graph("pair")
        x, gy, w = g.input("x", (4, 5, 6)), g.input("gy", (4, 5, 6)), g.input("w", (6,))
        dx = g.apply(og.ops.LayerNormBackwardData, {"normalized_shape": (6,), "eps": 1e-5},
                     [gy, x, w] if weighted else [gy, x])
        dw = g.apply(og.ops.LayerNormBackwardScale, {"normalized_shape": scale_shape, "eps": 1e-5}, [x, gy])
        exe = og.compile([dx, dw], device="cpu", policy=policy)
        assert not _exe_kinds(exe)["LayerNormBackwardDataSums"], (weighted, scale_shape)
        assert exe.report.fusion[NAME] == {"applied": 0, "declined": 0}
