"""The benchmark protocol and check on a model with training-form batch norm:
the running-statistics updates are outputs of the training graph computed in
the forward phase, batch-norm scales start at one, and a gradient that is 0
in exact arithmetic (a batch-norm bias read only through a 1x1 convolution
and another training-form batch norm) neither fails the per-node check nor
dominates the end-to-end errors, while a wrong value there is still caught."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph.benchmarks import check
from opgraph.benchmarks.models import ModelBuilder
from opgraph.benchmarks.protocol import classify, random_feeds, schedule, training_graph
from opgraph.op import abstract_of


def bn_net():
    """conv a -> bn a -> 1x1 conv b -> bn b -> relu -> flatten -> fc: the gradient of
    ``a.bn.bias`` is 0 (bn b removes any per-channel shift) and so is the batch
    mean of conv b (a 1x1 convolution without bias of bn a's zero-mean output)."""
    m = ModelBuilder("bn_net", "bn_net", "bn net", input_chw=(3, 6, 6), batch=4, seed_batch=4)
    x = m.batch_norm(m.conv(m.input, "a", 8, 3, pad=1, bias=False), "a.bn")
    x = og.relu(m.batch_norm(m.conv(x, "b", 8, 1, bias=False), "b.bn"), name="relu")
    return m.finish(m.linear(og.flatten(x, 1, name="flatten"), "fc", 5))


@pytest.fixture(scope="module")
def setup():
    model = bn_net()
    tg = training_graph(model)
    feeds = random_feeds(model, seed=2)
    return model, tg, feeds, check.Reference(tg, feeds, "cpu")


def test_running_statistics_are_forward_outputs_of_the_training_graph(setup):
    model, tg, feeds, ref = setup
    names = ["a.bn.running_mean", "a.bn.running_var", "b.bn.running_mean", "b.bn.running_var"]
    assert list(model.state_updates) == names and len(tg.state) == 4
    assert tg.outputs[-4:] == list(model.state_updates.values()) and tg.output_names[-4:] == names
    assert ref.n_state == 4 and len(ref.outputs) == 1 + len(model.params) + 4
    exe = og.compile(tg.outputs)
    phase = classify(exe, len(tg.grads), len(tg.state))
    updates = {st.node for st in exe.steps if abstract_of(st.op).name == "BatchNormRunningUpdate"}
    assert len(updates) == 4 and {phase[n] for n in updates} == {"forward"}
    assert updates <= {st.node for st in schedule(exe, tg).phases["forward"]}
    # PyTorch's update from the initial 0 and 1: momentum 0.1, the unbiased batch variance
    conv_a = ref.values[model.graph["a"].node]
    n = conv_a.size // conv_a.shape[1]
    np.testing.assert_allclose(ref.outputs[-4], 0.1 * conv_a.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(ref.outputs[-3], 0.9 + 0.1 * conv_a.var(axis=(0, 2, 3)) * n / (n - 1),
                               rtol=1e-12)
    got = exe(**feeds)
    for g, w in zip(got[-4:-2], ref.outputs[-4:-2]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_batch_norm_scales_start_at_one_and_running_statistics_as_torch(setup):
    model, tg, feeds, ref = setup
    np.testing.assert_array_equal(feeds["a.bn.weight"], np.ones(8, np.float32))
    np.testing.assert_array_equal(feeds["a.bn.bias"], np.zeros(8, np.float32))
    np.testing.assert_array_equal(feeds["fc.bias"], np.zeros(5, np.float32))
    np.testing.assert_array_equal(feeds["b.bn.running_var"], np.ones(8, np.float32))
    np.testing.assert_array_equal(feeds["b.bn.running_mean"], np.zeros(8, np.float32))
    assert np.std(feeds["a.weight"]) > 0


#: the bias gradient as its own BiasAddBackward sum (bn-backward-sums would make it a row of
#: the batch norm's shared sums, passes/fuse_bn_backward.py)
UNFUSED_BIAS_GRADIENT = {"prefer": {"conv": ["gemm"]}, "exclude": ["bn-backward-sums"]}


def _bias_grad_step(exe):
    return next(i for i, st in enumerate(exe.steps) if st.name.startswith("a.bn.grad/")
                and abstract_of(st.op).name == "BiasAddBackward")


def test_a_cancelling_sum_passes_the_check_and_is_vanishing_end_to_end(setup):
    model, tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy=UNFUSED_BIAS_GRADIENT)
    i = _bias_grad_step(exe)
    step, want = exe.steps[i], ref.values[exe.steps[i].node]
    ins = [np.asarray(ref.values[a], np.float32) for a in step.args]
    noise = step.kernel(step.ctx, step.op.op, *ins)
    assert check.relative_error(np, noise, want) > 1e-2  # noise against noise: meaningless
    res = check.check_lowering(exe, ref)
    assert res.passed, res.failures
    e2e = check.end_to_end(np, exe(**feeds), ref)
    assert e2e["vanishing_grad"] == 1 and e2e["worst_grad"] != "a.bn.bias"
    assert e2e["vanishing_state"] == 1 and e2e["max_grad"] < 1e-3 and e2e["max_state"] < 1e-5
    without_state = check.end_to_end(np, exe(**feeds)[:-4], ref)  # a peer's output and gradients
    assert "max_state" not in without_state and without_state["max_grad"] == e2e["max_grad"]


def test_a_wrong_value_of_a_cancelling_sum_is_still_caught(setup):
    model, tg, feeds, ref = setup
    exe = og.compile(tg.outputs, policy=UNFUSED_BIAS_GRADIENT)
    i = _bias_grad_step(exe)
    good = exe.steps[i]
    # a 1e-3 relative error on the scale of the terms summed: far above rounding
    exe.steps[i] = attrs.evolve(good, kernel=lambda ctx, op, gy: good.kernel(ctx, op, gy)
                                + np.float32(1e-3) * np.sqrt(np.square(gy).sum(axis=(0, 2, 3))))
    res = check.check_lowering(exe, ref)
    (f,) = res.failures
    assert f["node"] == good.name and 5e-4 < f["rel_error"] < 2e-3
