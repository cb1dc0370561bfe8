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


def test_the_pool_draws_each_position_and_type_once():
    from opgraph.passes.autotune_inputs import InputPool
    from opgraph.types import TensorType
    t, u = TensorType((2, 3, 4, 4), "float32", "NHWC"), TensorType((3,), "float32")
    pool = InputPool(np, seed=5)
    a = pool.inputs([t, t, u])
    assert pool.inputs([t, t, u])[0] is a[0] and pool.drawn == 3
    assert not np.array_equal(a[0], a[1])  # same type, other position: other values
    assert a[0].strides[1] == a[0].itemsize  # drawn in the type's layout (channels-last)
    again = InputPool(np, seed=5).inputs([t, t, u])
    assert all(np.array_equal(x, y) for x, y in zip(a, again))  # seeded: the same arrays in every run
    assert InputPool(np, seed=5).inputs([TensorType((2, 3), "bfloat16")])[0].dtype.name == "bfloat16"


def test_the_pool_drops_the_oldest_arrays_beyond_its_bound():
    from opgraph.passes.autotune_inputs import InputPool
    from opgraph.types import TensorType
    types = [TensorType((64, 64), "float32") for _ in range(3)]  # 16 KiB each
    pool = InputPool(np, seed=0, limit_bytes=40_000)
    first = pool.inputs(types[:1])[0]
    pool.inputs(types)  # positions 1 and 2: 48 KiB in all, over the bound
    assert pool.bytes <= 40_000 and pool.drawn == 3
    redrawn = pool.inputs(types[:1])[0]  # position 0 was the oldest: drawn again, equal values
    assert pool.drawn == 4 and redrawn is not first and np.array_equal(redrawn, first)


def test_one_autotune_run_draws_a_shared_type_once(monkeypatch, tmp_path):
    """A ReLU and a sigmoid of the same shape, each with two candidates: the
    second node reuses the first one's input (before the pool each node drew
    its own)."""
    from opgraph.passes import autotune_inputs
    pools = []
    real = autotune_inputs.InputPool

    class Recorded(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            pools.append(self)
    monkeypatch.setattr("opgraph.passes.autotune.InputPool", Recorded)
    for op_type in (ops.Relu, ops.Sigmoid):
        ref = registry.rules_for(op_type)["reference"]
        install_rule(monkeypatch, op_type, attrs.evolve(ref, algorithm="fast", tags=frozenset()))
    g = og.Graph()
    x = g.input("x", (4, 3, 5, 5))
    outs = [og.sigmoid(og.relu(x, name="r1"), name="r2")]
    pol = LoweringPolicy(autotune=True, cache=str(tmp_path / "c.json"))
    ctx = PassContext(policy=pol, timer=StubTimer({"fast": 1.0, "reference": 3.0}), versions=lambda: {},
                      device_name=lambda: "test-cpu")
    Pipeline("t", [LowerPass(), AutotunePass()]).run(g, outs, ctx)
    assert [ctx.report.node(n).how for n in ("r1", "r2")] == ["autotune", "autotune"]
    assert len(pools) == 1 and pools[0].drawn == 1


class _Device:
    """A stand-in array module that is not NumPy (as CuPy is not): NumPy arrays,
    its own generator, and dtype names parsed as CuPy parses them."""

    def __init__(self):
        self.generators = []
        outer = self

        class _Random:
            @staticmethod
            def default_rng(seed):
                outer.generators.append(seed)
                return np.random.default_rng(seed)

        self.random = _Random()
        self.ascontiguousarray = np.ascontiguousarray

    @staticmethod
    def asarray(a, dtype=None):
        from opgraph.types import numpy_dtype
        return np.asarray(a, dtype=None if dtype is None else numpy_dtype(dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_a_device_draws_with_its_own_generator_seeded_from_the_pass(dtype):
    from opgraph.passes.autotune_inputs import InputPool
    from opgraph.types import TensorType, is_channels_last
    t = TensorType((2, 3, 4, 5), dtype, "NHWC")
    dev = _Device()
    (a,) = InputPool(dev, seed=7).inputs([t])
    (b,) = InputPool(dev, seed=7).inputs([t])
    assert len(dev.generators) == 2 and dev.generators[0] == dev.generators[1]  # seeded, reproducible
    assert a.dtype.name == dtype and a.shape == t.shape and is_channels_last(a)
    np.testing.assert_array_equal(a.astype(np.float64), b.astype(np.float64))
    assert 0.5 < float(np.std(a.astype(np.float64))) < 1.5  # standard normal, not zeros
    (c,) = InputPool(dev, seed=8).inputs([t])
    assert not np.array_equal(a.astype(np.float64), c.astype(np.float64))
