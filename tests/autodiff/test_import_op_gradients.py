"""Finite-difference checks of the rules of the ops added for model import:
broadcasting add/mul and their SumTo/BroadcastTo pair, global average
pooling, inference batch norm and its backward ops, transpose.

Each backward op is checked as a function of all its differentiable inputs
(second derivatives).
"""

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import NotDifferentiableError

from .gradcheck import check_grad


def _inputs(g, **shapes):
    return [g.input(name, shape) for name, shape in shapes.items()]


def _normal(values, seed=0):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape) for v in values}


@pytest.mark.parametrize("op_cls", [ops.BroadcastAdd, ops.Mul])
@pytest.mark.parametrize("a_shape, b_shape", [
    ((2, 3, 4), (3, 1)),       # b stretched on two axes, one of them missing
    ((1, 4), (3, 1)),          # both stretched
    ((2, 3), (2, 3)),          # no broadcast
    ((5,), (2, 1, 5)),
])
def test_broadcasting_binary_ops(op_cls, a_shape, b_shape):
    g = og.Graph()
    a, b = _inputs(g, a=a_shape, b=b_shape)
    check_grad(g.apply(op_cls, {}, [a, b]), [a, b], _normal([a, b]))


def test_mul_of_one_value_twice():
    g = og.Graph()
    (x,) = _inputs(g, x=(3, 4))
    grads = check_grad(g.apply(ops.Mul, {}, [x, x]), [x], _normal([x]))
    assert grads["x"].shape == (3, 4)


@pytest.mark.parametrize("x_shape, shape", [((2, 3, 4), (3, 1)), ((2, 3), (1, 3)), ((4,), (4,))])
def test_sum_to_and_broadcast_to(x_shape, shape):
    g = og.Graph()
    (x,) = _inputs(g, x=x_shape)
    check_grad(g.apply(ops.SumTo, {"shape": shape}, [x]), [x], _normal([x]))
    g = og.Graph()
    (s,) = _inputs(g, s=shape)
    check_grad(g.apply(ops.BroadcastTo, {"shape": x_shape}, [s]), [s], _normal([s]))


def test_global_avg_pool_and_backward():
    g = og.Graph()
    (x,) = _inputs(g, x=(2, 3, 4, 5))
    check_grad(g.apply(ops.GlobalAvgPool2d, {}, [x]), [x], _normal([x]))
    g = og.Graph()
    (gy,) = _inputs(g, gy=(2, 3, 1, 1))
    out = g.apply(ops.GlobalAvgPool2dBackward, {"input_shape": (2, 3, 4, 5)}, [gy])
    check_grad(out, [gy], _normal([gy]))


def _bn_feeds(values, seed=1):
    """Normal feeds, except a positive variance in [0.5, 1.5)."""
    feeds = _normal(values, seed)
    if "var" in feeds:
        feeds["var"] = 0.5 + np.random.default_rng(seed).random(feeds["var"].shape)
    return feeds


@pytest.mark.parametrize("x_shape", [(2, 3, 4, 2), (4, 3)])
def test_batch_norm(x_shape):
    g = og.Graph()
    x, scale, bias, mean, var = _inputs(g, x=x_shape, scale=(3,), bias=(3,), mean=(3,), var=(3,))
    y = g.apply(ops.BatchNorm, {"eps": 1e-3}, [x, scale, bias, mean, var])
    check_grad(y, [x, scale, bias], _bn_feeds([x, scale, bias, mean, var]))


def test_batch_norm_backward_ops():
    g = og.Graph()
    gy, scale, var = _inputs(g, gy=(2, 3, 2, 2), scale=(3,), var=(3,))
    out = g.apply(ops.BatchNormBackwardData, {"eps": 1e-3}, [gy, scale, var])
    check_grad(out, [gy, scale], _bn_feeds([gy, scale, var]))
    g = og.Graph()
    x, mean, var, gy = _inputs(g, x=(2, 3, 2, 2), mean=(3,), var=(3,), gy=(2, 3, 2, 2))
    out = g.apply(ops.BatchNormBackwardScale, {"eps": 1e-3}, [x, mean, var, gy])
    check_grad(out, [x, gy], _bn_feeds([x, mean, var, gy]))


def test_batch_norm_double_backward():
    """grad of the (x, scale) gradients of a batch norm, against finite differences
    (bilinear in (x, scale) and the output gradient: the cross terms are nonzero)."""
    g = og.Graph()
    x, scale, bias, mean, var = _inputs(g, x=(2, 3, 2, 2), scale=(3,), bias=(3,), mean=(3,), var=(3,))
    y = g.apply(ops.BatchNorm, {}, [x, scale, bias, mean, var])
    first = og.grad(y, [x, scale])
    (r,) = g.sources("grad")
    feeds = _bn_feeds([x, scale, bias, mean, var, r.output], seed=2)
    grads = check_grad(first, [x, scale, r.output], feeds, seed=3)
    assert np.abs(grads["scale"]).max() > 0.1 and np.abs(grads["x"]).max() > 0.1


def test_batch_norm_statistics_get_no_gradient():
    g = og.Graph()
    x, scale, bias, mean, var = _inputs(g, x=(2, 3), scale=(3,), bias=(3,), mean=(3,), var=(3,))
    y = g.apply(ops.BatchNorm, {}, [x, scale, bias, mean, var], name="bn")
    with pytest.raises(NotDifferentiableError, match="node bn .*mean"):
        og.grad(y, [x, mean])


@pytest.mark.parametrize("perm", [(1, 0), (0, 2, 3, 1), (3, 1, 0, 2)])
def test_transpose(perm):
    g = og.Graph()
    (x,) = _inputs(g, x=(2, 3, 4, 5)[:len(perm)])
    check_grad(g.apply(ops.Transpose, {"perm": perm}, [x]), [x], _normal([x]))
