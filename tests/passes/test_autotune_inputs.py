"""The autotune pass's inputs: batch statistics read beside their x are x's own.

Before ``autotune_inputs.consistent_inputs``, a training batch-norm node with
two candidates got a standard-normal (2, C) ``stats`` input, whose negative
variances made every candidate and the reference NaN: autotune raised "no
correct candidate" for every such node on a GPU (codegen, cuDNN, reference)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends import registry
from opgraph.backends.reference.batchnorm_training import batch_norm_stats
from opgraph.op import abstract_of
from opgraph.passes.autotune import AutotunePass
from opgraph.passes.autotune_inputs import consistent_inputs, random_inputs
from opgraph.passes.base import PassContext, Pipeline
from opgraph.passes.lower import LowerPass
from opgraph.passes.policy import LoweringPolicy

from passes_stubs import StubTimer, install_rule


def _training_step():
    g = og.Graph()
    x, w, b = g.input("x", (4, 3, 5, 5)), g.param("w", (3,)), g.param("b", (3,))
    y = og.batch_norm(x, None, None, w, b, training=True, name="bn")
    dx, dw = og.grad(y, [x, w], grad_outputs=[y])
    return g, [y, dx, dw]


def _node(graph, op_type):
    return next(v for v in graph.nodes_in_order() if isinstance(abstract_of(v.op), op_type))


@pytest.mark.parametrize("op_type", [ops.BatchNormTraining, ops.BatchNormTrainingBackwardData,
                                     ops.BatchNormTrainingBackwardScale])
def test_stats_beside_their_x_are_recomputed_from_it(op_type):
    g, _ = _training_step()
    view = _node(g, op_type)
    arrays = random_inputs(view.input_types, np, seed=3)
    got = consistent_inputs(view, arrays, np, "cpu")
    stats_at = next(i for i, v in enumerate(view.inputs) if isinstance(v.op, ops.BatchNormStats))
    x_node = g.node(view.inputs[stats_at].node).inputs[0].node
    x_at = next(i for i, v in enumerate(view.inputs) if v.node == x_node)
    np.testing.assert_allclose(got[stats_at], batch_norm_stats(np, arrays[x_at].astype(np.float64)), rtol=1e-6)
    assert got[stats_at].dtype == arrays[stats_at].dtype and (got[stats_at][1] >= 0).all()
    for i in set(range(len(arrays))) - {stats_at}:
        assert got[i] is arrays[i]  # the other inputs are the random ones


def test_inputs_of_other_producers_stay_random():
    g = og.Graph()
    x = g.input("x", (2, 3))
    s = og.relu(x)
    y = og.add(s, x)
    view = g.node(y.node)
    arrays = random_inputs(view.input_types, np, seed=1)
    assert all(a is b for a, b in zip(consistent_inputs(view, arrays, np, "cpu"), arrays))


@pytest.mark.parametrize("op_type", [ops.BatchNormTraining, ops.BatchNormTrainingBackwardData,
                                     ops.BatchNormTrainingBackwardScale])
def test_a_training_batch_norm_node_with_two_candidates_is_tuned(op_type, monkeypatch, tmp_path):
    ref = registry.rules_for(op_type)["reference"]
    install_rule(monkeypatch, op_type, attrs.evolve(ref, algorithm="fast", tags=frozenset()))
    g, outs = _training_step()
    pol = LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json"))
    ctx = PassContext(policy=pol, timer=StubTimer({"fast": 1.0, "reference": 3.0}), versions=lambda: {},
                      device_name=lambda: "test-cpu")
    graph, louts = Pipeline("t", [LowerPass(), AutotunePass()]).run(g, outs, ctx)
    view = _node(graph, op_type)
    rows = {c.label: c for c in ctx.report.node(view.name).candidates}
    assert rows["fast"].status == "chosen" and rows["reference"].status == "ok"
    assert rows["fast"].rel_error < 1e-6
