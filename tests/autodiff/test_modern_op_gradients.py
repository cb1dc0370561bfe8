"""Finite-difference checks of the rules of the modern-convnet activations and their
backward ops (orders 1 and 2), Div, Neg and Mean (second derivatives included).
Inputs of the piecewise activations are kept away from their kinks."""

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import NotDifferentiableError

from .gradcheck import check_grad

KINKS = (-3.0, -1.0, 0.0, 1.0, 3.0, 6.0)


def _away_from_kinks(x, gap=0.05):
    for k in KINKS:
        x = np.where(np.abs(x - k) < gap, k + 2 * gap, x)
    return x


def _normal(values, seed=11, scale=1.0):
    """Normal feeds, drawn apart from check_grad's projections (its seed 0)."""
    rng = np.random.default_rng(seed)
    return {v.name: scale * rng.standard_normal(v.shape) for v in values}


def _inputs(g, **shapes):
    return [g.input(name, shape) for name, shape in shapes.items()]


ACTIVATIONS = {
    "Hardtanh": {"min_val": -1.0, "max_val": 1.0},
    "Hardsigmoid": {"alpha": 0.2, "beta": 0.5},
    "Hardswish": {},
    "Sigmoid": {},
    "Silu": {},
    "Gelu": {"approximate": "none"},
    "GeluTanh": {"approximate": "tanh"},
}


def _activation(name):
    return getattr(ops, name.replace("Tanh", "")), ACTIVATIONS[name]


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation(name):
    cls, params = _activation(name)
    g = og.Graph()
    (x,) = _inputs(g, x=(3, 4, 5))
    feeds = {"x": _away_from_kinks(_normal([x], scale=3.0)["x"])}
    check_grad(g.apply(cls, params, [x]), [x], feeds)


#: (activation, order): every backward op at order 1; order 2 where f'' is not 0 a.e.
BACKWARD_CASES = [(n, 1) for n in sorted(ACTIVATIONS)] + [
    (n, 2) for n in sorted(ACTIVATIONS) if hasattr(_activation(n)[0].backward, "order")]


@pytest.mark.parametrize("name, order", BACKWARD_CASES)
def test_activation_backward(name, order):
    """``(x, gy) -> gy * f^(order)(x)``: linear in gy; in x through order + 1
    (order 2 has no rule in x, so only gy is checked there)."""
    cls, params = _activation(name)
    backward = cls.backward
    if hasattr(backward, "order"):
        params = {**params, "order": order}
    g = og.Graph()
    x, gy = _inputs(g, x=(2, 3, 4), gy=(2, 3, 4))
    feeds = {**_normal([gy], seed=1), "x": _away_from_kinks(_normal([x], scale=3.0)["x"])}
    out = g.apply(backward, params, [x, gy])
    wrt = [x, gy] if order == 1 else [gy]
    grads = check_grad(out, wrt, feeds)
    if not hasattr(backward, "order"):
        assert np.all(grads["x"] == 0)


def test_activation_third_derivative_is_refused():
    g = og.Graph()
    x, gy = _inputs(g, x=(3,), gy=(3,))
    out = g.apply(ops.SiluBackward, {"order": 2}, [x, gy], name="d2")
    with pytest.raises(NotDifferentiableError, match="node d2 .*order > 2"):
        og.grad(out, [x])


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 4, 4), (2, 3, 1, 1)), ((3, 4), (4,)),
                                              ((1, 4), (3, 1)), ((5,), (5,))])
def test_div(a_shape, b_shape):
    g = og.Graph()
    a, b = _inputs(g, a=a_shape, b=b_shape)
    feeds = _normal([a])
    feeds["b"] = _away_from_kinks(_normal([b], seed=2)["b"], gap=0.5) + 0.1  # |b| >= 0.1
    check_grad(og.div(a, b), [a, b], feeds)


def test_div_second_derivative():
    g = og.Graph()
    a, b = _inputs(g, a=(3, 4), b=(3, 1))
    first = og.grad(og.div(a, b), [a, b])
    (r,) = g.sources("grad")
    feeds = {**_normal([a, r.output]), "b": 1.0 + np.random.default_rng(3).random((3, 1))}
    check_grad(first, [a, b, r.output], feeds, seed=4)


def test_neg():
    g = og.Graph()
    (x,) = _inputs(g, x=(2, 3))
    check_grad(og.neg(x), [x], _normal([x]))


@pytest.mark.parametrize("dim, keepdim", [((2, 3), True), (1, False), (None, False), ((0, -1), True)])
def test_mean_and_backward(dim, keepdim):
    g = og.Graph()
    (x,) = _inputs(g, x=(2, 3, 4, 2))
    y = og.mean(x, dim, keepdim)
    check_grad(y, [x], _normal([x]))
    g2 = og.Graph()
    (gy,) = _inputs(g2, gy=y.shape)
    back = g2.apply(ops.MeanBackward, dict(axes=y.op.axes, keepdim=keepdim, input_shape=x.shape), [gy])
    check_grad(back, [gy], _normal([gy]))
