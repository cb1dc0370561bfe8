"""Finite-difference checks of the gradient rules of every non-convolution op.

Element-wise, bias, dropout, LRN, linear/matmul, tensor (flatten, reshape,
concat, slice, pad) and loss ops, plus the backward ops that have a rule of
their own (ReluBackward, ThresholdBackward, BiasAddBackward, SliceBackward,
PadBackward). Inputs of ReLU / threshold are drawn away from the kink.
"""

import itertools

import numpy as np
import pytest

import opgraph as og
from opgraph import ops

from .gradcheck import away_from_zero, check_grad, projections, run

RNG_SEED = 11


def _graph(*shapes, names="xyzuv"):
    g = og.Graph()
    return g, [g.input(n, s) for n, s in zip(names, shapes)]


def _normal(values, seed=RNG_SEED):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape) for v in values}


# ---- element-wise ----------------------------------------------------------

def test_relu():
    g, (x,) = _graph((2, 3, 4, 5))
    feeds = {"x": away_from_zero(np.random.default_rng(0), x.shape)}
    y = og.relu(x)
    grads = check_grad(y, [x], feeds)
    # Also exactly the mask: the rule is gy * (x > 0), gy being the projection R.
    (R,) = projections([y])
    np.testing.assert_array_equal(grads["x"], np.where(feeds["x"] > 0, R, 0.0))


def test_relu_backward():
    g, (x, gy) = _graph((2, 3, 5), (2, 3, 5))
    out = g.apply(ops.ReluBackward, {}, [x, gy])
    feeds = {"x": away_from_zero(np.random.default_rng(1), x.shape),
             "y": np.random.default_rng(2).standard_normal(gy.shape)}
    grads = check_grad(out, [x, gy], feeds)
    assert np.all(grads["x"] == 0)


@pytest.mark.parametrize("threshold, value", [(0.0, 1e-6), (0.5, -2.0)])
def test_threshold(threshold, value):
    g, (x,) = _graph((3, 7))
    feeds = {"x": threshold + away_from_zero(np.random.default_rng(3), x.shape)}
    check_grad(og.threshold(x, threshold, value), [x], feeds)


def test_threshold_backward():
    g, (x, gy) = _graph((3, 7), (3, 7))
    out = g.apply(ops.ThresholdBackward, {"threshold": 0.25}, [x, gy])
    feeds = {"x": 0.25 + away_from_zero(np.random.default_rng(4), x.shape),
             "y": np.random.default_rng(5).standard_normal(gy.shape)}
    check_grad(out, [x, gy], feeds)


def test_add():
    g, (a, b) = _graph((2, 3, 4), (2, 3, 4))
    check_grad(og.add(a, b), [a, b], _normal([a, b]))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 5), (2, 3, 5)])
def test_bias_add(shape):
    g = og.Graph()
    x, b = g.input("x", shape), g.param("b", (shape[1],))
    check_grad(og.bias_add(x, b), [x, b], _normal([x, b]))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 5)])
def test_bias_add_backward(shape):
    g, (gy,) = _graph(shape)
    check_grad(g.apply(ops.BiasAddBackward, {}, [gy]), [gy], _normal([gy]))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 5)])
def test_relu_backward_sums_through_its_slot(shape):
    """``g = ReluBackwardSums(y, gy, s)`` and ``s = ReluBackwardSumsSlot(y, gy)`` (the relu-bias-sums
    rule's pair) in y and gy: g's rule is ReluBackward's, the slot's the bias gradient's through
    the mask (its filler passes nothing to the slot); nothing flows into y."""
    g, (y, gy) = _graph(shape, shape)
    sums = g.apply(ops.ReluBackwardSumsSlot, {}, [y, gy])
    out = g.apply(ops.ReluBackwardSums, {}, [y, gy, sums])
    feeds = {"x": away_from_zero(np.random.default_rng(6), y.shape),
             "y": np.random.default_rng(7).standard_normal(gy.shape)}
    grads = check_grad([out, sums], [y, gy], feeds)
    assert np.all(grads["x"] == 0)


@pytest.mark.parametrize("p, training", [(0.3, True), (0.75, True), (0.5, False)])
def test_dropout(p, training):
    g, (x,) = _graph((3, 4, 5))
    y = og.dropout(x, p, training=training, seed=7)
    grads = check_grad(y, [x], _normal([x]))
    if training:  # the mask is the one of the forward pass: dropped cells get no gradient
        dropped = run(y, {"x": np.ones(x.shape)})[0] == 0
        assert dropped.any() and np.all(grads["x"][dropped] == 0)


# ---- local response norm ---------------------------------------------------

@pytest.mark.parametrize("size, channels", [(1, 4), (2, 5), (3, 5), (4, 6), (5, 7), (5, 3)])
def test_local_response_norm(size, channels):
    g, (x,) = _graph((2, channels, 3, 2))
    # alpha large enough that the normaliser is far from constant.
    y = og.local_response_norm(x, size, alpha=1.5, beta=0.75, k=2.0)
    check_grad(y, [x], _normal([x]))


# ---- linear and matmul -----------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    g = og.Graph()
    x, w = g.input("x", (4, 6)), g.param("w", (5, 6))
    b = g.param("b", (5,)) if bias else None
    wrt = [v for v in (x, w, b) if v is not None]
    check_grad(og.linear(x, w, b), wrt, _normal(wrt))


@pytest.mark.parametrize("transpose_a, transpose_b", list(itertools.product([False, True], repeat=2)))
def test_matmul(transpose_a, transpose_b):
    m, k, n = 3, 4, 5
    g, (a, b) = _graph((k, m) if transpose_a else (m, k), (n, k) if transpose_b else (k, n))
    y = og.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    assert y.shape == (m, n)
    check_grad(y, [a, b], _normal([a, b]))


@pytest.mark.parametrize("transpose_a, transpose_b", list(itertools.product([False, True], repeat=2)))
def test_matmul_of_one_value_twice(transpose_a, transpose_b):
    """``x @ x`` (any transposes): both contributions are summed."""
    g, (x,) = _graph((4, 4))
    check_grad(og.matmul(x, x, transpose_a=transpose_a, transpose_b=transpose_b), [x], _normal([x]))


# ---- tensor ops -------------------------------------------------------------

@pytest.mark.parametrize("start_dim", [1, 2, 0])
def test_flatten(start_dim):
    g, (x,) = _graph((2, 3, 4, 2))
    check_grad(og.flatten(x, start_dim), [x], _normal([x]))


def test_reshape():
    g, (x,) = _graph((2, 3, 4))
    check_grad(og.reshape(x, (4, 6)), [x], _normal([x]))


@pytest.mark.parametrize("dim", [1, 0, -1, 3])
def test_concat(dim):
    shapes = []
    for extent in (2, 3, 1):
        s = [2, 3, 2, 2]
        s[dim % 4] = extent
        shapes.append(tuple(s))
    g, xs = _graph(*shapes)
    check_grad(og.concat(xs, dim=dim), xs, _normal(xs))


def test_concat_of_one_value_twice():
    g, (x, y) = _graph((2, 2, 3, 3), (2, 1, 3, 3))
    out = og.concat([x, y, x], 1)
    grads = check_grad(out, [x, y], _normal([x, y]))
    (R,) = projections([out])
    np.testing.assert_allclose(grads["x"], R[:, 0:2] + R[:, 3:5], rtol=1e-15)


@pytest.mark.parametrize("axis, start, stop", [(1, 1, 3), (3, 0, 2), (-1, 2, 4), (0, 1, 2)])
def test_slice(axis, start, stop):
    g, (x,) = _graph((2, 4, 3, 4))
    y = g.apply(ops.Slice, dict(axis=axis, start=start, stop=stop), [x])
    check_grad(y, [x], _normal([x]))


def test_slice_backward():
    g, (gy,) = _graph((2, 2, 3, 4))
    out = g.apply(ops.SliceBackward, dict(axis=1, start=1, stop=3, input_shape=(2, 5, 3, 4)), [gy])
    check_grad(out, [gy], _normal([gy]))


@pytest.mark.parametrize("padding, value", [(((1, 0), (2, 3)), 0.0), (1, 1.5)])
def test_pad(padding, value):
    g, (x,) = _graph((2, 3, 3, 4))
    check_grad(og.pad(x, padding, value), [x], _normal([x]))


def test_pad_backward():
    g, (gy,) = _graph((2, 3, 6, 7))
    out = g.apply(ops.PadBackward, {"padding": ((1, 2), (0, 3))}, [gy])
    assert out.shape == (2, 3, 3, 4)
    check_grad(out, [gy], _normal([gy]))


# ---- softmax and losses -----------------------------------------------------

@pytest.mark.parametrize("builder", [og.softmax, og.log_softmax])
@pytest.mark.parametrize("shape, dim", [((3, 5), 1), ((2, 4, 3), -1), ((3, 2, 2, 2), 0)])
def test_softmax_and_log_softmax(builder, shape, dim):
    g, (x,) = _graph(shape)
    check_grad(builder(x, dim), [x], _normal([x]))


@pytest.mark.parametrize("builder", [og.softmax, og.log_softmax])
def test_softmax_gradient_with_huge_logits(builder):
    """Max subtraction keeps the gradient finite (and right) for logits near 1e4."""
    g, (x,) = _graph((2, 4))
    feeds = {"x": 1e4 + np.random.default_rng(6).standard_normal(x.shape)}
    check_grad(builder(x), [x], feeds)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy(reduction):
    g = og.Graph()
    logits, target = g.input("logits", (5, 4)), g.input("target", (5,), "int64")
    loss = og.cross_entropy(logits, target, reduction)
    feeds = {"logits": 3 * np.random.default_rng(8).standard_normal(logits.shape),
             "target": np.array([0, 3, 3, 1, 2])}
    check_grad(loss, [logits], feeds)


def test_linear_cross_entropy_head():
    """A classifier head, linear -> cross_entropy, differentiated through both ops."""
    g = og.Graph()
    x, w, b = g.input("x", (4, 6)), g.param("w", (3, 6)), g.param("b", (3,))
    target = g.input("target", (4,), "int64")
    loss = og.cross_entropy(og.linear(x, w, b), target)
    feeds = {**_normal([x, w, b]), "target": np.array([2, 0, 1, 2])}
    check_grad(loss, [x, w, b], feeds)
