"""Behaviour of ``opgraph.grad``: accumulation, zeros, no_grad, pruning of
unneeded backward nodes, output-gradient seeds, second derivatives.

Structural claims are checked on the graph (node counts by op type); numbers
against finite differences or closed forms.
"""

from collections import Counter

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import NotDifferentiableError, OpgraphError, ShapeError

from .gradcheck import (away_from_zero, check_grad, projections, reference_compile, run,
                        used_feeds)


def _op_counts(g, since: int = 0) -> Counter:
    """Op names (class name; ``Grad`` for an output-gradient source) of the nodes
    with id >= ``since``, i.e. what a later call added."""
    return Counter(op.name for n, op in g.nx.nodes(data="op") if n >= since)


# ---- accumulation -------------------------------------------------------------

def test_value_used_twice_sums_contributions():
    g = og.Graph()
    x = g.input("x", (3, 4))
    y = og.add(og.relu(x), x)
    feeds = {"x": away_from_zero(np.random.default_rng(0), x.shape)}
    gx = check_grad(y, [x], feeds)["x"]
    (R,) = projections([y])
    np.testing.assert_array_equal(gx, R * (feeds["x"] > 0) + R)


def test_add_of_a_value_with_itself():
    g = og.Graph()
    x = g.input("x", (2, 5))
    y = og.add(x, x)
    assert g.input_ids(y.node) == [x.node, x.node]
    gx = check_grad(y, [x], {"x": np.ones(x.shape)})["x"]
    (R,) = projections([y])
    np.testing.assert_array_equal(gx, 2 * R)


def test_value_used_by_two_branches_of_a_block():
    """An inception-like fan-out: one input feeds three branches that are concatenated."""
    g = og.Graph()
    x = g.input("x", (1, 3, 5, 5))
    w1, w3 = g.param("w1", (2, 3, 1, 1)), g.param("w3", (2, 3, 3, 3))
    branches = [og.conv2d(x, w1), og.conv2d(x, w3, padding=1), og.max_pool2d(x, 3, 1, 1)]
    y = og.concat(branches, 1)
    rng = np.random.default_rng(1)
    feeds = {"x": np.linspace(-1, 1, 75).reshape(x.shape)[:, :, ::-1] + 0.001 * rng.random(x.shape),
             "w1": rng.standard_normal(w1.shape), "w3": rng.standard_normal(w3.shape)}
    check_grad(y, [x, w1, w3], feeds)


# ---- zeros, no_grad, pruning ----------------------------------------------------

def test_wrt_not_depended_on_gets_zeros():
    g = og.Graph()
    x, u = g.input("x", (2, 3)), g.input("u", (4, 1, 2, 2))
    y = og.relu(x)
    gx, gu = og.grad(y, [x, u])
    assert isinstance(gu.op, ops.Zeros) and gu.shape == u.shape
    feeds = {"x": np.ones(x.shape), "u": np.ones(u.shape)}
    _, got = run([gx, gu], feeds, grad_outputs={y: np.ones(y.shape)})
    np.testing.assert_array_equal(got, np.zeros(u.shape))


def test_grad_twice_on_one_graph():
    """A second ``grad`` call adds fresh nodes (fresh names), the first stay valid."""
    g = og.Graph()
    x, u = g.input("x", (2, 3)), g.input("u", (2, 3))
    y = og.relu(x)
    first = og.grad(y, [x, u])
    second = og.grad(y, [x, u])
    assert {v.node for v in first}.isdisjoint(v.node for v in second)
    assert len({v.name for v in first + second}) == 4
    # Both use the one output-gradient placeholder of y.
    assert len(g.sources("grad")) == 1


def test_no_grad_blocks_the_path():
    g = og.Graph()
    x = g.input("x", (3, 4))
    r = og.relu(x)
    y = og.add(r, x)
    before = len(g)
    gx = og.grad(y, x, no_grad=[r])
    assert _op_counts(g, before)["ReluBackward"] == 0
    gy = np.random.default_rng(2).standard_normal(y.shape)
    (got,) = run(gx, {"x": np.random.default_rng(3).standard_normal(x.shape)}, grad_outputs={y: gy})
    np.testing.assert_array_equal(got, gy)


def test_no_grad_on_every_path_gives_zeros():
    g = og.Graph()
    x, w = g.input("x", (1, 2, 4, 4)), g.param("w", (2, 2, 3, 3))
    h = og.relu(og.conv2d(x, w, padding=1))
    y = og.conv2d(h, w, padding=1)
    gx, gw = og.grad(y, [x, w], no_grad=[h])
    assert isinstance(gx.op, ops.Zeros)
    # w still gets the gradient of the second convolution (with h held constant).
    assert isinstance(gw.op, ops.Conv2dBackwardFilter) and gw.graph.input_ids(gw.node)[0] == h.node


def _two_conv_net():
    g = og.Graph()
    x = g.input("x", (2, 3, 8, 8))
    w1, b1 = g.param("w1", (4, 3, 3, 3)), g.param("b1", (4,))
    w2, b2 = g.param("w2", (5, 4, 3, 3)), g.param("b2", (5,))
    h = og.max_pool2d(og.relu(og.conv2d(x, w1, b1, padding=1, name="conv1")), 2)
    y = og.relu(og.conv2d(h, w2, b2, name="conv2"))
    return g, x, [w1, b1, w2, b2], y


def test_params_only_gives_the_first_conv_no_backward_data():
    g, x, params, y = _two_conv_net()
    before = len(g)
    og.grad(y, params)
    counts = _op_counts(g, before)
    assert counts["Conv2dBackwardData"] == 1  # conv2's, to reach conv1; none for conv1
    assert counts["Conv2dBackwardFilter"] == 2
    assert counts["BiasAddBackward"] == 2
    (bwd_data,) = [n for n in g.nx if isinstance(g.node(n).op, ops.Conv2dBackwardData)]
    assert g.node(bwd_data).name == "conv2.grad/conv2d_backward_data"


def test_image_gradient_adds_the_first_backward_data():
    g, x, params, y = _two_conv_net()
    before = len(g)
    og.grad(y, [x, *params])
    assert _op_counts(g, before)["Conv2dBackwardData"] == 2


def test_only_what_wrt_needs_is_built():
    """Asking for the last layer's weight alone builds nothing below that layer."""
    g, x, (w1, b1, w2, b2), y = _two_conv_net()
    before = len(g)
    og.grad(y, [w2])
    assert _op_counts(g, before) == Counter(
        {"Grad": 1, "ReluBackward": 1, "Conv2dBackwardFilter": 1})


# ---- seeds -----------------------------------------------------------------------

def test_scalar_loss_seed_defaults_to_one():
    g = og.Graph()
    logits, target = g.input("logits", (3, 4)), g.input("target", (3,), "int64")
    loss = og.cross_entropy(logits, target, "sum")
    gl = og.grad(loss, logits)
    z = np.random.default_rng(4).standard_normal(logits.shape)
    t = np.array([1, 0, 3])
    (got,) = run(gl, {"logits": z, "target": t})  # no grad_outputs: d(loss)/d(loss) = 1
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, p - np.eye(4)[t], rtol=1e-12, atol=1e-15)


def test_explicit_grad_outputs_value():
    g = og.Graph()
    x, v = g.input("x", (2, 3)), g.input("v", (2, 3))
    y = og.relu(x)
    gx = og.grad(y, x, grad_outputs=[v])
    assert not g.sources("grad")
    xv = away_from_zero(np.random.default_rng(5), x.shape)
    vv = np.random.default_rng(6).standard_normal(x.shape)
    (got,) = run(gx, {"x": xv, "v": vv})
    np.testing.assert_array_equal(got, np.where(xv > 0, vv, 0))


def test_grad_outputs_of_wrong_shape_names_the_output():
    g = og.Graph()
    x, v = g.input("x", (2, 3)), g.input("v", (3, 2))
    y = og.relu(x, name="act")
    with pytest.raises(ShapeError, match="act"):
        og.grad(y, x, grad_outputs={y: v})


def test_values_of_another_graph_are_refused():
    g1, g2 = og.Graph("a"), og.Graph("b")
    x1, x2 = g1.input("x", (2,)), g2.input("x", (2,))
    with pytest.raises(OpgraphError):
        og.grad(og.relu(x1), [x2])


# ---- second derivatives ------------------------------------------------------------

def _small_conv_net(seed=7):
    """conv+bias -> relu -> max-pool -> conv (stride 2, grouped) -> avg-pool ->
    flatten -> linear: every op with a second-derivative rule."""
    g = og.Graph()
    x = g.input("x", (2, 2, 6, 6))
    w1, b1 = g.param("w1", (4, 2, 3, 3)), g.param("b1", (4,))
    w2 = g.param("w2", (4, 2, 2, 2))
    w3, b3 = g.param("w3", (3, 4)), g.param("b3", (3,))
    h = og.max_pool2d(og.relu(og.conv2d(x, w1, b1, padding=1)), 3, 1, 1)
    h = og.avg_pool2d(og.conv2d(h, w2, stride=2, padding=((0, 1), (1, 0)), groups=2), 3, 2,
                      ceil_mode=True)
    y = og.linear(og.flatten(h), w3, b3, name="fc")
    rng = np.random.default_rng(seed)
    feeds = {v.name: rng.standard_normal(v.shape) for v in (x, w1, b1, w2, w3, b3)}
    return g, x, [w1, b1, w2, w3, b3], y, feeds


def test_double_backward_of_a_conv_net():
    """``grad(sum(R2 * grad(sum(R1 * y), w)), .)`` against finite differences of the
    first gradient, w.r.t. every parameter, the image and R1 itself."""
    g, x, params, y, feeds = _small_conv_net()
    first = og.grad(y, params)
    (r1,) = g.sources("grad")
    feeds[r1.name] = np.random.default_rng(8).standard_normal(y.shape)
    check_grad(first, [*params, x, r1.output], feeds, seed=9)


def test_hessian_vector_product_is_symmetric():
    """For f = sum(R1 * y), <v2, H v1> == <v1, H v2> with H the Hessian in (w1, w2, w3)."""
    g, x, params, y, feeds = _small_conv_net(seed=10)
    w1, _, w2, w3, _ = params
    ws = [w1, w2, w3]
    first = og.grad(y, ws)
    (r1,) = g.sources("grad")
    rng = np.random.default_rng(11)
    feeds[r1.name] = rng.standard_normal(y.shape)
    v1 = [rng.standard_normal(w.shape) for w in ws]
    v2 = [rng.standard_normal(w.shape) for w in ws]
    hvp = og.grad(first, ws)  # seeds: one placeholder per first-order gradient
    f = reference_compile(hvp)
    h_v1 = f(grad_outputs=dict(zip(first, v1)), **used_feeds(f, feeds))
    h_v2 = f(grad_outputs=dict(zip(first, v2)), **used_feeds(f, feeds))
    a = sum(np.sum(p * q) for p, q in zip(v2, h_v1))
    b = sum(np.sum(p * q) for p, q in zip(v1, h_v2))
    assert abs(a) > 1e-3
    assert a == pytest.approx(b, rel=1e-10)


def test_grad_through_an_op_without_a_second_derivative_raises():
    g = og.Graph()
    x = g.input("x", (1, 4, 2, 2))
    y = og.local_response_norm(x, 3)
    gx = og.grad(y, x)
    with pytest.raises(NotDifferentiableError, match="LocalResponseNormBackward"):
        og.grad(gx, x)


@pytest.mark.parametrize("model", ["alexnet", "googlenet"])
def test_benchmark_protocol_on_the_models(model):
    """Gradients w.r.t. the parameters only: every convolution but the first gets
    a backward-data node, every one a backward-filter node (graph only, not run)."""
    from opgraph.benchmarks.models import MODELS

    m = MODELS[model](batch=2)
    convs = [n for n in m.graph.nx if isinstance(m.graph.node(n).op, ops.Conv2d)]
    before = len(m.graph)
    grads = og.grad(m.output, m.params)
    counts = _op_counts(m.graph, before)
    assert counts["Conv2dBackwardFilter"] == len(convs)
    assert counts["Conv2dBackwardData"] == len(convs) - 1
    first_weight = m.params[0].node
    for n in m.graph.nx:
        if isinstance(m.graph.node(n).op, ops.Conv2dBackwardData):
            assert m.graph.input_ids(n)[1] != first_weight
    assert [v.shape for v in grads] == [p.shape for p in m.params]
