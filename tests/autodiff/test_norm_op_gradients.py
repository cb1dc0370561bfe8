"""Finite-difference checks of the rules of training-form batch norm and layer norm
and of their backward ops (second derivatives), and of the rules that refuse:
batch statistics outside their batch norm, running statistics."""

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import NotDifferentiableError

from .gradcheck import check_grad


def _inputs(g, **shapes):
    return [g.input(name, shape) for name, shape in shapes.items()]


def _bn_feeds(values, seed=10):
    """Normal feeds (x shifted and scaled), drawn apart from check_grad's projections (its
    seed 0): an output gradient affine in x per channel has a zero data gradient."""
    rng = np.random.default_rng(seed)
    feeds = {v.name: rng.standard_normal(v.shape) for v in values}
    feeds["x"] = 2.0 + 3.0 * feeds["x"]
    return feeds


# ---- training batch norm ---------------------------------------------------------

def _bn_graph(shape, affine=2):
    g = og.Graph()
    x = g.input("x", shape)
    w = g.param("w", (shape[1],)) if affine > 0 else None
    b = g.param("b", (shape[1],)) if affine > 1 else None
    return g, x, w, b


@pytest.mark.parametrize("shape", [(3, 2, 3, 2), (5, 3), (2, 2, 1, 1)])
@pytest.mark.parametrize("affine", [0, 1, 2])
def test_batch_norm_training(shape, affine):
    g, x, w, b = _bn_graph(shape, affine)
    wrt = [v for v in (x, w, b) if v is not None]
    y = og.batch_norm(x, None, None, w, b, training=True, eps=1e-3)
    check_grad(y, wrt, _bn_feeds(wrt))


@pytest.mark.parametrize("affine", [0, 1, 2])
def test_batch_norm_training_double_backward(affine):
    """grad of the first gradients (x, weight, bias) w.r.t. x, weight and the
    output gradient: BatchNormTrainingBackwardData (with its double-backward op),
    BatchNormTrainingBackwardScale and BiasAddBackward differentiated."""
    g, x, w, b = _bn_graph((3, 2, 2, 2), affine)
    wrt = [v for v in (x, w, b) if v is not None]
    first = og.grad(og.batch_norm(x, None, None, w, b, training=True, eps=1e-2), wrt)
    (r,) = g.sources("grad")
    feeds = _bn_feeds([*wrt, r.output], seed=1)
    grads = check_grad(first, [x, *([w] if w is not None else []), r.output], feeds, seed=2)
    assert np.abs(grads["x"]).max() > 1e-2  # the double-backward term is exercised


def test_batch_norm_training_backward_ops_from_their_statistics():
    """The backward ops as functions of their own inputs (x, gy, weight)."""
    g = og.Graph()
    x, gy = _inputs(g, x=(3, 2, 2, 2), gy=(3, 2, 2, 2))
    w = g.input("w", (2,))
    stats = g.apply(ops.BatchNormStats, {}, [x])
    data = g.apply(ops.BatchNormTrainingBackwardData, {"eps": 0.1}, [gy, x, stats, w])
    scale = g.apply(ops.BatchNormTrainingBackwardScale, {"eps": 0.1}, [x, stats, gy])
    check_grad([data, scale], [x, gy, w], _bn_feeds([x, gy, w], seed=3))


def test_batch_norm_statistics_and_running_update_refuse_gradients():
    g = og.Graph()
    x = g.input("x", (4, 2))
    rm, rv = g.buffer("rm", (2,), value=0.0), g.buffer("rv", (2,), value=1.0)
    _, new_mean, _ = og.batch_norm(x, rm, rv, training=True, return_running_stats=True, name="bn")
    with pytest.raises(NotDifferentiableError, match="node bn/running_mean .*no gradient"):
        og.grad(new_mean, [x])
    stats = g["bn/stats"]
    with pytest.raises(NotDifferentiableError, match="node bn/stats "):
        og.grad(stats, [x])


def test_batch_norm_training_needs_the_statistics_of_its_input():
    """The rule differentiates through the statistics, so they must be those of x."""
    g = og.Graph()
    x, z = _inputs(g, x=(4, 2), z=(4, 2))
    y = g.apply(ops.BatchNormTraining, {}, [x, g.apply(ops.BatchNormStats, {}, [z])], name="bn")
    with pytest.raises(NotDifferentiableError, match="node bn .*BatchNormStats of its input x"):
        og.grad(y, [x])


# ---- layer norm -------------------------------------------------------------------

@pytest.mark.parametrize("shape, normalized_shape", [((2, 3, 4), 4), ((2, 3, 4), (3, 4)), ((5, 3), (3,))])
@pytest.mark.parametrize("affine", [0, 1, 2])
def test_layer_norm(shape, normalized_shape, affine):
    g = og.Graph()
    x = g.input("x", shape)
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    w = g.param("w", ns) if affine > 0 else None
    b = g.param("b", ns) if affine > 1 else None
    wrt = [v for v in (x, w, b) if v is not None]
    check_grad(og.layer_norm(x, normalized_shape, w, b, eps=1e-3), wrt, _bn_feeds(wrt))


def test_layer_norm_double_backward():
    g = og.Graph()
    x, w, b = g.input("x", (3, 2, 4)), g.param("w", (4,)), g.param("b", (4,))
    first = og.grad(og.layer_norm(x, 4, w, b, eps=1e-2), [x, w, b])
    (r,) = g.sources("grad")
    feeds = _bn_feeds([x, w, b, r.output], seed=5)
    grads = check_grad(first, [x, w, r.output], feeds, seed=6)
    assert np.abs(grads["x"]).max() > 1e-2


def test_layer_norm_data_gradient_filling_its_weight_gradient():
    """``dx = LayerNormBackwardDataSums(gy, x, w, dw)`` and ``dw = LayerNormBackwardScaleSlot(gy, x)``
    (the ln-backward-sums rule's pair) in gy, x and w: dx's rule is the data gradient's, the slot's
    the weight gradient's (its filler passes nothing to the slot)."""
    g = og.Graph()
    gy, x, w = g.input("gy", (3, 2, 4)), g.input("x", (3, 2, 4)), g.param("w", (4,))
    p = {"normalized_shape": (4,), "eps": 1e-2}
    dw = g.apply(ops.LayerNormBackwardScaleSlot, p, [gy, x])
    dx = g.apply(ops.LayerNormBackwardDataSums, p, [gy, x, w, dw])
    check_grad([dx, dw], [gy, x, w], _bn_feeds([gy, x, w], seed=8))
