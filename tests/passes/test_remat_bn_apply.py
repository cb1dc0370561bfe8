"""The ``bn-apply-remat`` fusion rule (``passes/remat_bn_apply.py``): where it
fires (cuda compiled without a GPU, cuDNN's checks stubbed; the CPU's oracle
with the fused chains opted in), what it makes possible (the batch norm fused
with its SiLU in the forward, its copy with the SiLU's gradient in the
backward), where it must not fire (excluded, no fusion to follow, a ReLU
whose gradient reads its output), and the values of whole training steps
against the float64 reference and the same compile without the rule."""

from __future__ import annotations

import collections

import pytest

import opgraph as og
from opgraph.op import Lowered

from fused_training_steps import rule_on_and_off
from modern_blocks import mbconv
from passes_stubs import compile_for_cuda, cudnn_accepts


def conv_bn_act(act):
    """conv -> training batch norm -> ``act`` -> global pool: ``(y, params, extra)``."""
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8)), g.param("w", (8, 3, 3, 3))
    gamma, beta = g.param("gamma", (8,)), g.param("beta", (8,))
    h = og.batch_norm(og.conv2d(x, w, padding=1), None, None, gamma, beta, training=True, name="bn")
    return og.flatten(og.adaptive_avg_pool2d(act(h), 1)), [w, gamma, beta], []


def step(act):
    y, params, _ = conv_bn_act(act)
    return [y, *og.grad(y, params, grad_outputs=[y])]


#: the rule alone: ``bn-gradient-remat`` (tests/passes/test_remat_bn_gradient.py) would copy the
#: gradient's chain into both passes of the batch norm's backward too
ALONE = ["bn-gradient-remat"]


def remats(notes) -> int:
    """How many copies the rule made, from the fuse pass's note."""
    found = [n for n in notes if "recomputed for an activation gradient fused" in n]
    return int(found[0].split()[1]) if found else 0


def lowered(graph, outs):
    return [v for v in graph.nodes_in_order(outs) if isinstance(v.op, Lowered)]


def members(graph, outs) -> collections.Counter:
    """Op names of the steps, a fused chain's members counted by name too."""
    c = collections.Counter()
    for v in lowered(graph, outs):
        c[v.op.op.name] += 1
        for m in getattr(v.op.op, "members", ()):
            c["member:" + m] += 1
    return c


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_bn_silu_step_fuses_forward_and_backward_on_cuda(monkeypatch, layout, dtype):
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(og.silu), og.LoweringPolicy(layout=layout, exclude=ALONE), dtype=dtype)
    count = members(graph, outs)
    assert not count["BatchNormTraining"] and not count["Silu"] and not count["SiluBackward"], count
    assert count["member:BatchNormTraining"] == 2  # the forward's and the backward's copy
    assert count["member:Silu"] == 1 and count["member:SiluBackward"] == 1
    assert remats(report.notes) == 1


def test_excluded_by_name_it_leaves_the_batch_norm_output_stored(monkeypatch):
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(og.silu), og.LoweringPolicy(exclude=["bn-apply-remat", *ALONE]))
    count = members(graph, outs)
    assert count["member:BatchNormTraining"] + count["BatchNormTraining"] == 1
    assert count["Silu"] + count["member:Silu"] == 1 and remats(report.notes) == 0


def test_no_copy_where_no_fused_chain_would_take_it():
    """On the CPU's oracle without the opt-in the element-wise rule fuses
    nothing, so a copy would be one pass more: the rule declines, saying why."""
    exe = og.compile(step(og.silu), device="cpu")
    assert remats(exe.report.notes) == 0
    assert any("recomputed for an activation gradient" in n and "no fused chain would take it" in n
               for n in exe.report.notes), exe.report.notes


def test_a_relu_needs_no_copy(monkeypatch):
    """ReLU's gradient reads its output: the batch norm output has one reader."""
    cudnn_accepts(monkeypatch)
    graph, outs, report = compile_for_cuda(step(og.relu))
    assert remats(report.notes) == 0
    assert not any("recomputed for an activation gradient" in n for n in report.notes), report.notes


@pytest.mark.parametrize("make", [lambda: conv_bn_act(og.silu), lambda: conv_bn_act(og.hardswish), mbconv],
                         ids=["silu", "hardswish", "mbconv"])
def test_training_steps_on_the_oracle_match_the_reference(make):
    """Opted in on the CPU (``include=['fused-reference']``) the rule fires and
    the step's outputs equal the float64 reference and the compile without it."""
    on, off, errors = rule_on_and_off(make, "bn-apply-remat")
    assert remats(on.report.notes) >= 1 and remats(off.report.notes) == 0
    for fe, ue, fu in errors:
        assert fe < 1e-4 and fu < 1e-5, (fe, ue, fu)
