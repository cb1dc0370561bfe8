"""The ``pool-argmax`` fusion rule (``passes/fuse_pool_argmax.py``): a max pooling
and its gradient become the argmax, the take and the gather; the training
step equals the unfused one and the float64 reference; the rule and only it
turns off by name; on the CPU's oracle it waits for the opt-in; the new ops'
gradients (second derivatives) agree with ``MaxPool2d``'s."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import opgraph as og
from opgraph.op import Lowered
from opgraph.passes.policy import PolicyError

from fused_training_steps import rule_on_and_off


def pooled_convnet():
    """conv -> ReLU -> 3x3/2 max pool (ceil_mode: the ReLU form of the gradient),
    then conv -> 3x3/1 padded max pool without a ReLU before it (the plain form)."""
    g = og.Graph("pools")
    x = g.input("x", (2, 3, 11, 11))
    w1, b1 = g.param("w1", (8, 3, 3, 3)), g.param("b1", (8,))
    w2 = g.param("w2", (8, 8, 1, 1))
    h = og.max_pool2d(og.relu(og.conv2d(x, w1, b1, padding=1)), 3, stride=2, ceil_mode=True)
    y = og.max_pool2d(og.conv2d(h, w2), 3, stride=1, padding=1)
    return y, [x, w1, b1, w2], []


def _kinds(exe):
    return collections.Counter(v.op.op.name for v in exe.graph.nodes_in_order(exe.outputs)
                               if isinstance(v.op, Lowered))


def test_the_training_step_through_saved_winners_equals_the_unfused_one():
    on, off, errors = rule_on_and_off(pooled_convnet, "pool-argmax", without=("pool-scan",))
    kinds = _kinds(on)
    assert kinds["MaxPool2dArgmax"] == kinds["MaxPool2dTake"] == kinds["MaxPool2dBackwardIndices"] == 2
    assert not (kinds["MaxPool2d"] or kinds["MaxPool2dBackward"] or kinds["MaxPool2dBackwardRelu"])
    off_kinds = _kinds(off)
    assert off_kinds["MaxPool2d"] == 2 and off_kinds["MaxPool2dBackwardRelu"] == 1 and not off_kinds["MaxPool2dTake"]
    assert off.report.fusion["pool-argmax"] == {"excluded": True}
    assert off.report.fusion["pool-relu-backward"]["applied"] == 1
    assert on.report.fusion["pool-argmax"] == {"applied": 2, "declined": 0}
    for fused, unfused, between in errors:
        assert fused < 1e-6 and unfused < 1e-6 and between < 1e-6


def test_the_gradient_no_longer_reads_the_pooled_input():
    on, _, _ = rule_on_and_off(pooled_convnet, "pool-argmax", without=("pool-scan",))
    graph = on.graph
    for v in graph.nodes_in_order(on.outputs):
        if isinstance(v.op, Lowered) and v.op.op.name == "MaxPool2dBackwardIndices":
            idx, _ = v.inputs
            assert idx.op.op.name == "MaxPool2dArgmax"
            take = [u for u in graph.users(idx.node) if graph.node(u).op.op.name == "MaxPool2dTake"]
            assert len(take) == 1
            assert v.op.op.masked == idx.op.op.relu  # the ReLU form masks by the argmax's mark
    said = on.report.format()
    assert "/argmax" in said


def test_on_the_oracle_the_rule_waits_for_the_opt_in():
    y, params, _ = pooled_convnet()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    exe = og.compile(outs, device="cpu")
    assert not _kinds(exe)["MaxPool2dTake"]
    assert any("pool-argmax: not applied" in n and "fused-reference" in n for n in exe.report.notes)
    # no match at all, so a CPU run's fusion line counts no declined rewrite per pooling
    assert exe.report.fusion["pool-argmax"] == {"applied": 0, "declined": 0, "opt_in": True}  # it says why


def test_excluding_fused_turns_it_off():
    """``exclude=['fused']`` turns it off; beside ``include=['fused-reference']``,
    which it would make do nothing, it is refused (passes/policy_names.py)."""
    y, params, _ = pooled_convnet()
    outs = [y, *og.grad(y, params, grad_outputs=[y])]
    exe = og.compile(outs, device="cpu", policy={"exclude": ["fused"]})
    assert not _kinds(exe)["MaxPool2dTake"] and _kinds(exe)["MaxPool2dBackward"] == 2
    assert exe.report.fusion["pool-argmax"] == {"excluded": True}
    with pytest.raises(PolicyError, match=r"exclude=\['fused'\]: covers include=\['fused-reference'\]"):
        og.compile(outs, device="cpu", policy={"include": ["fused-reference"], "exclude": ["fused"]})


@pytest.mark.parametrize("masked", [False, True])
def test_take_and_gather_are_each_others_adjoints(masked):
    """Second derivatives through the new ops: the gradient of the take is the
    gather, and the gather's gradient in gy is the take (the float64 oracle),
    and <take(x), gy> == <x, gather(gy)>."""
    g = og.Graph("adjoint")
    x = g.input("x", (1, 2, 7, 7), dtype="float64")
    gy = g.input("gy", (1, 2, 3, 3), dtype="float64")
    window = dict(kernel_size=(3, 3), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False)
    idx = g.apply(og.ops.MaxPool2dArgmax, dict(window, relu=masked), [x])
    y = g.apply(og.ops.MaxPool2dTake, dict(window, masked=masked), [x, idx])
    gx = g.apply(og.ops.MaxPool2dBackwardIndices, dict(window, masked=masked, input_shape=x.shape), [idx, gy])
    dx, = og.grad(y, [x], grad_outputs=[gy])
    dgy, = og.grad(gx, [gy], grad_outputs=[x])
    exe = og.compile([y, dx, gx, dgy], pipeline="reference", dtype="float64")
    rng = np.random.default_rng(0)
    xv, gyv = rng.standard_normal(x.shape) - 1.5, rng.standard_normal(gy.shape)  # some maxima <= 0
    yv, dxv, gxv, dgyv = exe(x=xv, gy=gyv)
    np.testing.assert_array_equal(dxv, gxv)  # take's gradient is the gather of the same indices
    np.testing.assert_array_equal(dgyv, yv)  # the gather's, read at x itself, is the take of x
    if masked:
        assert (yv == 0).any() and (yv > 0).any()  # some windows marked, some not
    # <take(x), gy> == <x, gather(gy)>: the adjoint identity
    np.testing.assert_allclose(np.sum(yv * gyv), np.sum(xv * gxv), rtol=1e-12)


def test_two_gradients_of_one_pooling_share_its_saved_winners():
    g = og.Graph("two")
    x = g.input("x", (2, 3, 9, 9))
    w = g.param("w", (4, 3, 3, 3))
    y = og.max_pool2d(og.relu(og.conv2d(x, w, padding=1)), 3, stride=2)
    first = og.grad(y, [w], grad_outputs=[y])
    second = og.grad(y, [w, x], grad_outputs=[og.relu(y)])  # another gradient graph of the same pooling
    outs = [y, *first, *second]
    # pool-scan would make the argmax and the take one scan (tests/passes/test_fuse_pool_scan.py)
    on = og.compile(outs, device="cpu", policy={"include": ["fused-reference"], "exclude": ["pool-scan"]})
    off = og.compile(outs, device="cpu", policy={"include": ["fused-reference"], "exclude": ["pool-argmax", "pool-scan"]})
    kinds = _kinds(on)
    assert kinds["MaxPool2dArgmax"] == kinds["MaxPool2dTake"] == 1 and kinds["MaxPool2dBackwardIndices"] == 2
    assert on.report.fusion["pool-argmax"] == {"applied": 2, "declined": 0}
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal(x.shape), "w": rng.standard_normal(w.shape)}
    for a, b in zip(on(**feeds), off(**feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_window_of_over_128_cells_keeps_the_gradient_scan():
    g = og.Graph("wide")
    x = g.input("x", (1, 2, 13, 13))
    y = og.max_pool2d(x, 12, stride=1)
    exe = og.compile([y, *og.grad(y, [x])], device="cpu", policy={"include": ["fused-reference"]})
    assert _kinds(exe)["MaxPool2dBackward"] == 1 and not _kinds(exe)["MaxPool2dTake"]
    assert any("pool-argmax" in n and "128 cells" in n for n in exe.report.notes)
