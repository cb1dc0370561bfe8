"""The ``pool-scan`` fusion rule (``passes/fuse_pool_scan.py``): a pooling's
argmax and take become a slot (its step allocates) and one scan that writes
the pooled value and fills the slot; the training step equals the unfused one
and the float64 reference, also when the slot's step leaves garbage (the scan
fills it); the rule is a default and turns off by name (and with ``fused``);
the graph invariants of ``Op.fills``
(``passes/verify.py``); autotune and the per-node check read the filled input
as a second result, so a kernel that does not fill it is wrong."""

from __future__ import annotations

import collections

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.backends.registry import rules_for
from opgraph.errors import LoweringError
from opgraph.op import Lowered
from opgraph.passes.policy import LoweringPolicy

from fused_training_steps import rule_on_and_off, step_errors, training_step
from passes_stubs import StubTimer, install_rule
from test_fuse_pool_argmax import pooled_convnet

WINDOW = dict(kernel_size=(3, 3), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False)


def _kinds(exe):
    return collections.Counter(v.op.op.name for v in exe.graph.nodes_in_order(exe.outputs)
                               if isinstance(v.op, Lowered))


def _garbage_slots(exe):
    """``exe`` with every slot step returning a buffer of 77s (as uninitialized
    memory may hold) instead of its reference kernel's argmax."""
    def garbage(ctx, op, x):
        return np.full(ctx.out_shape(op, x), 77, dtype=np.uint8)
    exe.steps = [attrs.evolve(st, kernel=garbage) if st.op.op.filled_by_reader else st for st in exe.steps]
    return exe


def test_the_training_step_through_one_scan_equals_the_unfused_one():
    on, off, errors = rule_on_and_off(pooled_convnet, "pool-scan")
    kinds = _kinds(on)
    assert kinds["MaxPool2dScan"] == kinds["MaxPool2dArgmaxSlot"] == kinds["MaxPool2dBackwardIndices"] == 2
    assert not (kinds["MaxPool2dTake"] or kinds["MaxPool2dArgmax"] or kinds["MaxPool2d"])
    off_kinds = _kinds(off)
    assert off_kinds["MaxPool2dTake"] == off_kinds["MaxPool2dArgmax"] == 2 and not off_kinds["MaxPool2dScan"]
    assert on.report.fusion["pool-scan"] == {"applied": 2, "declined": 0}
    assert off.report.fusion["pool-scan"] == {"excluded": True}
    for fused, unfused, between in errors:
        assert fused < 1e-6 and unfused < 1e-6 and between < 1e-6
    # the ReLU form's slot carries the mark its masked gather reads
    relu = [v for v in on.graph.nodes_in_order(on.outputs)
            if isinstance(v.op, Lowered) and v.op.op.name == "MaxPool2dArgmaxSlot" and v.op.op.relu]
    assert len(relu) == 1


def test_the_gathers_read_what_the_scan_wrote_not_what_the_slot_step_left():
    outs, feeds, _ = training_step(pooled_convnet, np.random.default_rng(1))
    ref = og.compile(outs, pipeline="reference", dtype="float64")(**feeds)
    policy = {"include": ["fused-reference"]}
    on = _garbage_slots(og.compile(outs, device="cpu", policy=policy))
    off = og.compile(outs, device="cpu", policy={"include": ["fused-reference"], "exclude": ["pool-scan"]})
    assert _kinds(on)["MaxPool2dArgmaxSlot"] == 2
    for fused, unfused, between in step_errors(on(**feeds), off(**feeds), ref):
        assert fused < 1e-6 and between < 1e-6
    # and the same garbage without the scan filling it is caught: a gather then reads 77s
    broken = _garbage_slots(og.compile(outs, device="cpu", policy=policy))
    broken.steps = [attrs.evolve(st, kernel=_take_only) if st.op.op.name == "MaxPool2dScan" else st
                    for st in broken.steps]
    errors = step_errors(broken(**feeds), off(**feeds), ref)
    assert max(e[0] for e in errors[1:]) > 1e-3


def _take_only(ctx, op, x, slot):
    """A scan that computes the pooled value right but never fills the slot."""
    return rules_for(og.ops.MaxPool2d)["reference"].kernel(ctx, og.ops.MaxPool2d(**{
        k: getattr(op, k) for k in ("kernel_size", "stride", "padding", "ceil_mode")}), x)


def test_the_rule_is_a_default_and_turns_off_by_name():
    """A default since its kernels ran on the H200 (2026-12-05; the module docstring): it
    rewrites without being named in ``include``; ``exclude=['pool-scan']`` turns it off alone,
    ``exclude=['fused']`` with every other rule; naming it in ``include`` has no effect (noted)."""
    y, params, _ = pooled_convnet()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    exe = og.compile(outs, device="cpu", policy={"include": ["fused-reference"]})
    assert exe.report.fusion["pool-scan"] == {"applied": 2, "declined": 0}
    assert _kinds(exe)["MaxPool2dScan"] == 2 and not _kinds(exe)["MaxPool2dTake"]
    assert not [n for n in exe.report.notes if "pool-scan" in n]
    exe = og.compile(outs, device="cpu", policy={"include": ["fused-reference"], "exclude": ["pool-scan"]})
    assert exe.report.fusion["pool-scan"] == {"excluded": True}
    assert exe.report.fusion["pool-argmax"] == {"applied": 2, "declined": 0}  # alone: the others still run
    assert not _kinds(exe)["MaxPool2dScan"] and _kinds(exe)["MaxPool2dTake"] == 2
    assert "fuse: pool-scan: not applied: excluded by policy (exclude=['pool-scan'])" in exe.report.notes
    # (exclude=['fused'] beside include=['fused-reference'] is refused: tests/passes/test_policy_names.py;
    # on cuda: tests/passes/test_fuse_models_cuda.py)
    exe = og.compile(outs, device="cpu", policy={"exclude": ["fused"]})
    assert exe.report.fusion["pool-scan"] == exe.report.fusion["pool-argmax"] == {"excluded": True}
    assert not (_kinds(exe)["MaxPool2dScan"] or _kinds(exe)["MaxPool2dArgmaxSlot"] or _kinds(exe)["MaxPool2dTake"])
    # beside the rule's name in include (opt-in until 2026-12-05: it does nothing now), exclude still
    # wins, and the note says so (it was refused as a contradiction)
    exe = og.compile(outs, device="cpu", policy={"include": ["pool-scan"], "exclude": ["fused"]})
    assert exe.report.fusion["pool-scan"] == {"excluded": True} and not _kinds(exe)["MaxPool2dScan"]
    (note,) = [n for n in exe.report.notes if n.startswith("policy include ['pool-scan']: no effect")]
    assert note.endswith("; exclude=['fused'] turns pool-scan off")
    exe = og.compile(outs, device="cpu", policy={"include": ["fused-reference", "pool-scan"]})
    assert exe.report.fusion["pool-scan"] == {"applied": 2, "declined": 0}
    assert any(n.startswith("policy include ['pool-scan']: no effect") for n in exe.report.notes)


def test_on_the_oracle_without_its_opt_in_nothing_is_rewritten_and_the_notes_say_why():
    """On the CPU's oracle the rule, like ``pool-argmax`` whose pairs it rewrites, waits for
    ``include=['fused-reference']`` (the oracle's opt-in, not the rule's): without it nothing
    changes, and the notes say how to opt in; an inference graph (no gradient, no saved
    winners) gets no pool-scan note."""
    y, params, _ = pooled_convnet()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    exe = og.compile(outs, device="cpu")
    assert exe.report.fusion["pool-scan"] == {"applied": 0, "declined": 0}  # nothing to match: no argmax
    assert exe.report.fusion["pool-argmax"] == {"applied": 0, "declined": 0, "opt_in": True}
    assert not (_kinds(exe)["MaxPool2dScan"] or _kinds(exe)["MaxPool2dArgmaxSlot"])
    assert any(n.startswith("fuse: pool-argmax: not applied:") and "include=['fused-reference']" in n
               for n in exe.report.notes), exe.report.notes
    exe = og.compile([y], device="cpu", policy={"include": ["fused-reference"]})
    assert exe.report.fusion["pool-scan"] == {"applied": 0, "declined": 0}
    assert not [n for n in exe.report.notes if "pool-scan" in n]


def _hand_built(readers_first: bool):
    """A slot read by a gather: with ``readers_first`` the gather reads it and
    nothing fills it; else the scan fills it, and a gather that reads its
    gradient runs after."""
    g = og.Graph("slots")
    x = g.input("x", (1, 2, 7, 7))
    gy = g.input("gy", (1, 2, 3, 3))
    slot = g.apply(og.ops.MaxPool2dArgmaxSlot, dict(WINDOW, relu=False), [x])
    gather = g.apply(og.ops.MaxPool2dBackwardIndices, dict(WINDOW, masked=False, input_shape=x.shape), [slot, gy])
    if readers_first:
        return [gather], g
    y = g.apply(og.ops.MaxPool2dScan, dict(WINDOW, relu=False), [x, slot])
    return [y, gather], g


def test_a_slot_nothing_fills_or_read_before_its_filler_is_refused():
    outs, _ = _hand_built(readers_first=True)
    with pytest.raises(LoweringError, match="slot with 0 readers filling it"):
        og.compile(outs, device="cpu")
    outs, _ = _hand_built(readers_first=False)  # the gather reads gy, not y: it may run before the scan
    with pytest.raises(LoweringError, match="before .* fills it"):
        og.compile(outs, device="cpu")


def test_fills_must_name_a_slot():
    g = og.Graph("not a slot")
    x = g.input("x", (1, 2, 7, 7))
    idx = g.apply(og.ops.MaxPool2dArgmax, dict(WINDOW, relu=False), [x])
    y = g.apply(og.ops.MaxPool2dScan, dict(WINDOW, relu=False), [x, idx])
    with pytest.raises(LoweringError, match="which is not a slot"):
        og.compile([y], device="cpu")


def test_the_scan_gradient_is_the_max_pool_gradient():
    """Second derivatives see MaxPool2dScan as MaxPool2d: its vjp is the gather
    of the winners it wrote (unmasked, also when the slot carries the ReLU mark)."""
    for relu in (False, True):
        g = og.Graph("scan grad")
        x = g.input("x", (1, 2, 7, 7), dtype="float64")
        gy = g.input("gy", (1, 2, 3, 3), dtype="float64")
        slot = g.apply(og.ops.MaxPool2dArgmaxSlot, dict(WINDOW, relu=relu), [x])
        y = g.apply(og.ops.MaxPool2dScan, dict(WINDOW, relu=relu), [x, slot])
        dx, = og.grad(y, [x], grad_outputs=[gy])
        plain = og.max_pool2d(x, 3, stride=2)
        dplain, = og.grad(plain, [x], grad_outputs=[gy])
        exe = og.compile([y, dx, plain, dplain], pipeline="reference", dtype="float64")
        rng = np.random.default_rng(2)
        yv, dxv, pv, dpv = exe(x=rng.standard_normal(x.shape) - 1.0, gy=rng.standard_normal(gy.shape))
        np.testing.assert_array_equal(yv, pv)
        np.testing.assert_array_equal(dxv, dpv)


def test_autotune_checks_the_filled_slot_as_a_second_result(monkeypatch, tmp_path):
    """Autotune gives each scan candidate a poisoned copy of the slot and checks it against
    the argmax exactly: a candidate that leaves it unwritten, or that sends one window's
    winner elsewhere, is wrong however fast, and the node gets the one that fills it right."""
    rule = rules_for(og.ops.MaxPool2dScan)["reference"]

    def scan(ctx, op, x, slot):
        mode = ctx.options.get("mode", "right")  # the float64 reference runs with no options
        if mode == "none":
            return _take_only(ctx, op, x, slot)
        y = rule.kernel(ctx, op, x, slot)
        if mode == "sloppy":  # one window of thousands misrouted: within any norm tolerance
            flat = slot.reshape(-1) if slot.flags.c_contiguous else None
            assert flat is not None
            flat[0] = (int(flat[0]) + 1) % 9
        return y

    modes = [{"mode": m} for m in ("none", "sloppy", "right")]
    install_rule(monkeypatch, og.ops.MaxPool2dScan, attrs.evolve(rule, kernel=scan, variants=lambda *a: modes))
    y, params, _ = pooled_convnet()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    policy = LoweringPolicy(autotune=True, include=["fused-reference"],
                            cache=str(tmp_path / "c.json"))
    exe = og.compile(outs, policy=policy, timer=StubTimer({"reference[mode=none]": 0.1,
                                                           "reference[mode=sloppy]": 0.2}))
    scans = [r for r in exe.report.nodes.values() if r.op_type == "MaxPool2dScan"]
    assert len(scans) == 2
    for rec in scans:
        status = {c.label: c.status for c in rec.candidates if c.label.startswith("reference")}
        assert status == {"reference[mode=none]": "wrong", "reference[mode=sloppy]": "wrong",
                          "reference[mode=right]": "chosen"}
    slots = [r for r in exe.report.nodes.values() if r.op_type == "MaxPool2dArgmaxSlot"]
    assert len(slots) == 2


def test_a_slot_of_another_window_or_mark_is_refused():
    """The slot must be the one its filler writes (``Op.filled_slot``): an unmarked slot filled
    with marked winners would hold what its declared value (the checks' oracle) is not."""
    g = og.Graph("mismatch")
    x = g.input("x", (1, 2, 7, 7))
    slot = g.apply(og.ops.MaxPool2dArgmaxSlot, dict(WINDOW, relu=False), [x])
    y = g.apply(og.ops.MaxPool2dScan, dict(WINDOW, relu=True), [x, slot])
    with pytest.raises(LoweringError, match="which must be MaxPool2dArgmaxSlot"):
        og.compile([y], device="cpu")
    other = g.input("other", (1, 2, 7, 7))
    slot = g.apply(og.ops.MaxPool2dArgmaxSlot, dict(WINDOW, relu=False), [other])
    y = g.apply(og.ops.MaxPool2dScan, dict(WINDOW, relu=False), [x, slot])
    with pytest.raises(LoweringError, match=r"reading its inputs \[0\]"):
        og.compile([y], device="cpu")


def test_a_pooling_whose_gradient_is_fed_says_why_it_keeps_its_pair():
    """A pooling that is the output, its gradient fed at run time: the gather reads the fed
    gradient, which nothing computes from the pooled value, so the pair stays (the scan could
    run after the gather), and the note says that in those words (fresh-user report)."""
    g = og.Graph("fed")
    x = g.input("x", (1, 2, 6, 6))
    w = g.param("w", (2, 2, 3, 3))
    y = og.max_pool2d(og.conv2d(x, w, padding=1), 3, stride=2)
    exe = og.compile([y, *og.grad(y, [w])], device="cpu", policy={"include": ["fused-reference"]})
    assert exe.report.fusion["pool-scan"] == {"applied": 0, "declined": 0}
    said = [n for n in exe.report.notes if "pool-scan" in n]
    assert len(said) == 1 and "does not read the pooled value" in said[0] and "gradient fed" in said[0]
    assert not _kinds(exe)["MaxPool2dScan"] and _kinds(exe)["MaxPool2dTake"] == 1
