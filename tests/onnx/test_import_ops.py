"""The abstract ops the ONNX importer added (BroadcastAdd, Mul, SumTo,
BroadcastTo, BatchNorm and its backward ops, GlobalAvgPool2d, Transpose,
Constant): reference kernels against float64 formulas, first and second
derivatives against central finite differences, and their errors. These
need no ``onnx`` package."""

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.errors import NotDifferentiableError, ParameterError, ShapeError


def apply(g, cls, inputs, **params):
    return g.apply(cls, params, inputs)


def numeric_grad(f, feeds, name, h=1e-6):
    """Central differences of the scalar ``f(feeds)`` w.r.t. ``feeds[name]``, element by element."""
    x = feeds[name]
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = f(feeds)
        x[i] = old - h
        down = f(feeds)
        x[i] = old
        out[i] = (up - down) / (2 * h)
    return out


def check_first_and_second_order(g, out, feeds, wrt):
    """Gradients of ``<out, R>`` w.r.t. ``wrt`` against differences, and the
    gradients of ``<grad, U>`` (second order) likewise, all in float64."""
    rng = np.random.default_rng(3)
    r = rng.standard_normal(out.shape)
    values = [g[n] for n in wrt]
    grads = og.grad(out, values, grad_outputs={out: g.add_node(ops.Constant(value=r), [])})
    fwd = og.compile([out], dtype="float64")
    back = og.compile(grads, dtype="float64")

    def run(exe, fd):
        names = {s.name for s in exe.sources}
        return exe(**{k: v for k, v in fd.items() if k in names})

    got = run(back, feeds)
    for n, gv in zip(wrt, got):
        want = numeric_grad(lambda fd: float(np.sum(run(fwd, fd)[0] * r)), feeds, n)
        np.testing.assert_allclose(gv, want, rtol=1e-6, atol=1e-8, err_msg=f"d/d{n}")
    # second order: F = sum_i <grad_i, U_i>, differentiated again
    us = [rng.standard_normal(v.shape) for v in grads]
    second = og.grad(grads, values, grad_outputs=[g.add_node(ops.Constant(value=u), []) for u in us])
    exe2 = og.compile(second, dtype="float64")

    def F(fd):
        return float(sum(np.sum(a * u) for a, u in zip(run(back, fd), us)))

    for n, sv in zip(wrt, run(exe2, feeds)):
        np.testing.assert_allclose(sv, numeric_grad(F, feeds, n), rtol=1e-5, atol=1e-7,
                                   err_msg=f"second order d/d{n}")


# ---- broadcasting ----------------------------------------------------------------
@pytest.mark.parametrize("a,b", [((2, 3, 4), (3, 1)), ((1, 3), (2, 1)), ((4,), ()), ((2, 3), (2, 3))])
def test_broadcast_add_and_mul(a, b):
    rng = np.random.default_rng(0)
    g = og.Graph()
    x, y = g.input("x", a, "float64"), g.input("y", b, "float64")
    s = apply(g, ops.Mul, [apply(g, ops.BroadcastAdd, [x, y]), y])
    assert s.shape == np.broadcast_shapes(a, b)
    feeds = {"x": rng.standard_normal(a), "y": rng.standard_normal(b)}
    np.testing.assert_allclose(og.compile([s])(**feeds)[0], (feeds["x"] + feeds["y"]) * feeds["y"], rtol=1e-15)
    check_first_and_second_order(g, s, feeds, ["x", "y"])


def test_sum_to_and_broadcast_to_are_adjoint():
    rng = np.random.default_rng(1)
    g = og.Graph()
    x = g.input("x", (2, 3, 4), "float64")
    t = apply(g, ops.SumTo, [x], shape=(3, 1))
    b = apply(g, ops.BroadcastTo, [t], shape=(2, 3, 4))
    xv = rng.standard_normal((2, 3, 4))
    tv, bv = og.compile([t, b])(x=xv)
    np.testing.assert_allclose(tv, xv.sum(axis=(0, 2)).reshape(3, 1), rtol=1e-14)
    np.testing.assert_allclose(bv, np.broadcast_to(tv, (2, 3, 4)))
    check_first_and_second_order(g, b, {"x": xv}, ["x"])


def test_broadcast_errors():
    g = og.Graph()
    x = g.input("x", (2, 3))
    with pytest.raises(ShapeError, match="do not broadcast"):
        apply(g, ops.BroadcastAdd, [x, g.input("y", (4,))])
    with pytest.raises(ShapeError, match="shape=\\(4,\\)"):
        apply(g, ops.SumTo, [x], shape=(4,))
    with pytest.raises(ShapeError, match="does not broadcast"):
        apply(g, ops.BroadcastTo, [x], shape=(3, 3))


# ---- batch norm -------------------------------------------------------------------
def bn_graph(with_stats_params=False):
    g = og.Graph()
    x = g.input("x", (2, 3, 2, 2), "float64")
    s, b = g.param("s", (3,), "float64"), g.param("b", (3,), "float64")
    if with_stats_params:
        m, v = g.param("m", (3,), "float64"), g.param("v", (3,), "float64")
    else:
        m = g.add_node(ops.Constant(value=np.array([0.1, -0.2, 0.3])), [], "m")
        v = g.add_node(ops.Constant(value=np.array([0.5, 1.5, 2.0])), [], "v")
    return g, apply(g, ops.BatchNorm, [x, s, b, m, v], eps=1e-3)


def test_batch_norm_forward_and_gradients():
    rng = np.random.default_rng(2)
    g, y = bn_graph()
    feeds = {"x": rng.standard_normal((2, 3, 2, 2)), "s": rng.standard_normal(3), "b": rng.standard_normal(3)}
    m, v = np.array([0.1, -0.2, 0.3]), np.array([0.5, 1.5, 2.0])
    ch = (1, 3, 1, 1)
    want = (feeds["x"] - m.reshape(ch)) / np.sqrt(v.reshape(ch) + 1e-3) * feeds["s"].reshape(ch) + \
        feeds["b"].reshape(ch)
    np.testing.assert_allclose(og.compile([y])(**feeds)[0], want, rtol=1e-13)
    check_first_and_second_order(g, y, feeds, ["x", "s", "b"])


def test_batch_norm_float16_and_empty_batch():
    g = og.Graph()
    x = g.input("x", (0, 2, 3, 3), "float16")
    vec = [g.param(n, (2,), "float16", value=np.ones(2, np.float16)) for n in "sbmv"]
    y = apply(g, ops.BatchNorm, [x, *vec])
    gs = og.grad(y, vec[0])
    out, gsv = og.compile([y, gs])(x=np.zeros((0, 2, 3, 3), np.float16), grad_outputs={y: np.zeros((0, 2, 3, 3))})
    assert out.shape == (0, 2, 3, 3) and out.dtype == np.float16
    np.testing.assert_array_equal(gsv, np.zeros(2, np.float16))


def test_batch_norm_running_statistics_have_no_gradient():
    g, y = bn_graph(with_stats_params=True)
    with pytest.raises(NotDifferentiableError, match="running mean"):
        og.grad(y, [g["m"]])
    og.grad(y, [g["x"], g["s"]])  # fine: the statistics are not asked for


def test_batch_norm_shape_errors():
    g = og.Graph()
    x = g.input("x", (2, 3, 4, 4))
    good, bad = g.input("c", (3,)), g.input("d", (4,))
    with pytest.raises(ShapeError, match="var shape \\(4,\\)"):
        apply(g, ops.BatchNorm, [x, good, good, good, bad])
    with pytest.raises(ParameterError, match="eps"):
        apply(g, ops.BatchNorm, [x, good, good, good, good], eps=-1.0)


# ---- global pooling, transpose, constants -------------------------------------------
def test_global_avg_pool_and_transpose():
    rng = np.random.default_rng(4)
    g = og.Graph()
    x = g.input("x", (2, 3, 2, 3), "float64")
    t = apply(g, ops.Transpose, [x], perm=(0, 3, 1, 2))
    p = apply(g, ops.GlobalAvgPool2d, [t])
    assert t.shape == (2, 3, 3, 2) and p.shape == (2, 3, 1, 1)
    xv = rng.standard_normal((2, 3, 2, 3))
    tv, pv = og.compile([t, p])(x=xv)
    np.testing.assert_array_equal(tv, xv.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(pv, xv.transpose(0, 3, 1, 2).mean(axis=(2, 3), keepdims=True), rtol=1e-14)
    check_first_and_second_order(g, p, {"x": xv}, ["x"])


def test_transpose_and_global_pool_errors():
    g = og.Graph()
    x = g.input("x", (2, 3, 4))
    with pytest.raises(ParameterError, match="perm"):
        apply(g, ops.Transpose, [x], perm=(0, 0, 1))
    with pytest.raises(ShapeError, match="2 entries for a 3-D input"):
        apply(g, ops.Transpose, [x], perm=(1, 0))
    with pytest.raises(ShapeError, match="4-D"):
        apply(g, ops.GlobalAvgPool2d, [x])
    with pytest.raises(ShapeError, match="empty"):
        apply(g, ops.GlobalAvgPool2d, [g.input("e", (1, 2, 0, 3))])


def test_constant_value_semantics():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    c1, c2 = ops.Constant(value=a), ops.Constant(value=a.copy())
    assert c1 == c2 and hash(c1) == hash(c2)
    assert c1 != ops.Constant(value=a.astype(np.float64)) and c1 != ops.Constant(value=a.T)
    a[0, 0] = 99.0  # the op copied its value
    assert c1.value[0, 0] == 0.0 and not c1.value.flags.writeable
    assert ops.Constant(value=np.array([1, 2], np.int32)).value.dtype == np.int64
    assert c1.infer().shape == (2, 3) and "float32[2, 3]" in c1.describe()
    with pytest.raises(ParameterError, match="dtype"):
        ops.Constant(value=np.array([True]))
    g = og.Graph()
    k = g.add_node(c1, [])
    out = og.compile([k])()[0]
    out[0, 0] = 5.0  # a fresh, writable copy
    assert c1.value[0, 0] == 0.0
