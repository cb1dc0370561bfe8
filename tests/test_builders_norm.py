"""The batch_norm and layer_norm builders: the nodes of the training form, PyTorch's
defaults, the n = 1 error at graph-build time, and errors naming the node, the
parameter and the value."""

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import ParameterError, ShapeError


def _bn_graph(shape=(4, 3, 5, 5), dtype="float32"):
    g = og.Graph()
    x = g.input("x", shape, dtype)
    c = shape[1]
    return g, x, g.buffer("rm", (c,), dtype, value=0.0), g.buffer("rv", (c,), dtype, value=1.0), \
        g.param("w", (c,), dtype), g.param("b", (c,), dtype)


def test_training_nodes_and_pytorch_defaults():
    g, x, rm, rv, w, b = _bn_graph()
    y, new_mean, new_var = og.batch_norm(x, rm, rv, w, b, training=True, return_running_stats=True,
                                         name="bn")
    assert [v.name for v in (y, new_mean, new_var)] == ["bn", "bn/running_mean", "bn/running_var"]
    assert y.op == ops.BatchNormTraining(eps=1e-5) and y.type == x.type
    assert new_mean.op == ops.BatchNormRunningUpdate(statistic="mean", momentum=0.1, count=100)
    assert new_var.op.statistic == "var" and new_var.type == rv.type
    stats = g["bn/stats"]
    assert stats.shape == (2, 3) and stats.dtype == "float32"
    assert og.batch_norm(x, None, None, training=True).op.family == "norm"


def test_half_storage_keeps_float32_statistics():
    g, x, rm, rv, w, b = _bn_graph(dtype="bfloat16")
    y, new_mean, _ = og.batch_norm(x, rm, rv, w, b, training=True, return_running_stats=True, name="bn")
    assert g["bn/stats"].dtype == "float32" and y.dtype == new_mean.dtype == "bfloat16"


@pytest.mark.parametrize("shape", [(1, 3, 1, 1), (1, 3)])
def test_one_value_per_channel_is_an_error_when_the_graph_is_built(shape):
    g, x, *_ = _bn_graph(shape)
    with pytest.raises(ShapeError, match="node bn/stats .*Expected more than 1 value per channel"):
        og.batch_norm(x, None, None, training=True, name="bn")
    with pytest.raises(ParameterError, match="node u .*parameter count=1"):
        g.apply(ops.BatchNormRunningUpdate, dict(statistic="var", count=1), [x, x], name="u")


def test_inference_form_is_the_batch_norm_op_with_unit_affine_when_absent():
    g, x, rm, rv, w, b = _bn_graph()
    y = og.batch_norm(x, rm, rv, name="bn", eps=1e-3)
    assert y.op == ops.BatchNorm(eps=1e-3)
    assert [i.name for i in y.graph.node(y.node).inputs] == ["x", "bn/weight", "bn/bias", "rm", "rv"]


@pytest.mark.parametrize("call, error, texts", [
    (lambda x, rm, rv, w, b: og.batch_norm(x, rm, rv, w, b, training=True, name="bn"), ParameterError,
     ["node bn", "return_running_stats=False", "return_running_stats=True"]),
    (lambda x, rm, rv, w, b: og.batch_norm(x, None, rv, training=True, return_running_stats=True, name="bn"),
     ParameterError, ["node bn", "running_mean=None"]),
    (lambda x, rm, rv, w, b: og.batch_norm(x, rm, None, name="bn"), ParameterError,
     ["node bn", "running_var=None", "inference"]),
    (lambda x, rm, rv, w, b: og.batch_norm(x, rm, rv, return_running_stats=True, name="bn"), ParameterError,
     ["node bn", "return_running_stats=True"]),
    (lambda x, rm, rv, w, b: og.batch_norm(x, rm, rv, training=True, momentum=None,
                                           return_running_stats=True, name="bn"), ParameterError,
     ["node bn", "momentum=None"]),
    (lambda x, rm, rv, w, b: og.batch_norm(x, rm, rv, training=True, momentum=1.5,
                                           return_running_stats=True, name="bn"), ParameterError,
     ["node bn/running_mean", "momentum=1.5"]),
    (lambda x, rm, rv, w, b: og.batch_norm(x, None, None, training=True, eps=-1.0, name="bn"), ParameterError,
     ["node bn", "eps=-1.0"]),
])
def test_errors_name_node_parameter_value(call, error, texts):
    g, x, rm, rv, w, b = _bn_graph()
    with pytest.raises(error) as e:
        call(x, rm, rv, w, b)
    assert all(t in str(e.value) for t in texts), str(e.value)


def test_wrong_weight_shape_names_the_node():
    g, x, rm, rv, w, b = _bn_graph()
    w5 = g.param("w5", (5,))
    with pytest.raises(ShapeError, match=r"node bn .*weight shape \(5,\) != \(C,\) = \(3,\)"):
        og.batch_norm(x, None, None, w5, training=True, name="bn")


@pytest.mark.parametrize("which", ["running_mean", "running_var"])
def test_wrong_running_statistics_shape_names_the_node_in_the_builders_terms(which):
    """Training form: the running update's (2, C) statistics input is internal;
    the error names the argument the user gave (a fresh user got the update
    node's ``stats must be float32[2, 3]``)."""
    g, x, rm, rv, w, b = _bn_graph()
    wrong = g.param("r4", (4,))
    stats = {"running_mean": rm, "running_var": rv, which: wrong}
    with pytest.raises(ShapeError, match=rf"node bn: {which} shape \(4,\) != \(C,\) = \(3,\)"):
        og.batch_norm(x, stats["running_mean"], stats["running_var"], w, b, training=True,
                      return_running_stats=True, name="bn")


def test_layer_norm_builder():
    g = og.Graph()
    x = g.input("x", (2, 7, 7, 8))
    w, b = g.param("w", (8,)), g.param("b", (8,))
    y = og.layer_norm(x, 8, w, b)
    assert y.op == ops.LayerNorm(normalized_shape=(8,), eps=1e-5) and y.shape == x.shape
    assert og.layer_norm(x, (7, 8)).op.normalized_shape == (7, 8)
    with pytest.raises(ShapeError, match=r"node ln .*normalized_shape=\(7,\)"):
        og.layer_norm(x, 7, name="ln")
    with pytest.raises(ShapeError, match=r"node ln2 .*weight shape \(8,\) != \(7, 8\)"):
        og.layer_norm(x, (7, 8), w, name="ln2")


@pytest.mark.parametrize("given", [16.0, None, "8", object()])
def test_layer_norm_refuses_a_normalized_shape_not_of_ints_naming_the_node(given):
    """A float, None, a string or another object: a ParameterError naming the node and the parameter
    (a bare TypeError from ``tuple(16.0)`` before); a NumPy int is an int."""
    g = og.Graph()
    x = g.input("x", (2, 7, 7, 8))
    with pytest.raises(ParameterError, match=r"node ln \(LayerNorm\): parameter normalized_shape="):
        og.layer_norm(x, given, name="ln")
    with pytest.raises(ParameterError, match=r"node ln2 \(LayerNorm\): parameter normalized_shape="):
        og.layer_norm(x, given, None, g.param("b", (8,)), name="ln2")  # the weight made of ns
    assert og.layer_norm(x, np.int64(8)).op.normalized_shape == (8,)
