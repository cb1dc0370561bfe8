"""SEMANTICS.md rules of gradients that finite differences cannot see.

* Max-pool ties: the whole output gradient of a window goes to the first
  maximum in row-major window order; the gradient summed over a window equals
  the output gradient. Expected routing is found here by a direct loop over
  each window's cells (independent of the kernels' sliding-window code).
* A stride that does not tile the input: the input gradient keeps the input's
  full shape, and rows/columns that no window touches get exact zeros.
"""

import itertools

import numpy as np
import pytest

import opgraph as og
from opgraph import ops

from .gradcheck import check_grad, reference_compile, run


def _first_max(x, i, j, k, s, pad):
    """(row, col) of the first maximum of window (i, j) in row-major order; padding
    cells (-inf) never win because every window holds an input cell."""
    best, where = -np.inf, None
    for p, q in itertools.product(range(k[0]), range(k[1])):
        r, c = i * s[0] - pad[0][0] + p, j * s[1] - pad[1][0] + q
        if 0 <= r < x.shape[0] and 0 <= c < x.shape[1] and (where is None or x[r, c] > best):
            best, where = x[r, c], (r, c)
    return where


TIE_CASES = [  # kernel, stride, padding, ceil_mode
    (2, 2, 0, False),
    (3, 1, 1, False),
    (3, 2, ((1, 0), (0, 1)), True),
    ((2, 3), (1, 2), 0, True),
]


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", TIE_CASES)
def test_max_pool_ties_route_to_first_maximum(kernel, stride, padding, ceil_mode):
    rng = np.random.default_rng(0)
    x_val = rng.integers(0, 2, size=(1, 1, 5, 6)).astype(float)  # many ties: values 0 and 1
    x_val[0, 0, 1:4, 1:4] = 1.0  # a plateau: every window over it is one big tie
    g = og.Graph()
    x = g.input("x", x_val.shape)
    y = og.max_pool2d(x, kernel, stride, padding, ceil_mode)
    (gx,) = og.grad(y, [x])
    f = reference_compile([y, gx])
    op = y.op
    oh, ow = y.shape[2:]
    # One window at a time: a one-hot output gradient must land, whole, on one cell.
    for i, j in itertools.product(range(oh), range(ow)):
        gy = np.zeros(y.shape)
        gy[0, 0, i, j] = 1.0
        _, got = f(x=x_val, grad_outputs={y: gy})
        want = np.zeros(x_val.shape)
        want[(0, 0, *_first_max(x_val[0, 0], i, j, op.kernel_size, op.stride, op.padding))] = 1.0
        np.testing.assert_array_equal(got, want, err_msg=f"window ({i}, {j})")
    # All windows at once: gradients of overlapping windows add; nothing is lost.
    gy = rng.standard_normal(y.shape)
    _, got = f(x=x_val, grad_outputs={y: gy})
    assert got.sum() == pytest.approx(gy.sum(), rel=1e-12)


def test_max_pool_tie_gradient_sums_to_output_gradient_per_window():
    """Non-overlapping 2x2 windows of a constant input: each window's gradient
    sum is its output gradient, all of it on the window's top-left cell."""
    g = og.Graph()
    x = g.input("x", (2, 3, 4, 6))
    y = og.max_pool2d(x, 2)
    gx = og.grad(y, x)
    gy = np.random.default_rng(1).standard_normal(y.shape)
    (got,) = run(gx, {"x": np.full(x.shape, 0.5)}, grad_outputs={y: gy})
    window_sums = got.reshape(2, 3, 2, 2, 3, 2).sum(axis=(3, 5))
    np.testing.assert_array_equal(window_sums, gy)
    np.testing.assert_array_equal(got[:, :, ::2, ::2], gy)


def test_max_pool_select_uses_the_same_first_maximum():
    """The second-derivative op reads v where the backward op routes (ties included)."""
    g = og.Graph()
    x, v = g.input("x", (1, 1, 4, 4)), g.input("v", (1, 1, 4, 4))
    params = ops.MaxPool2d(kernel_size=3, stride=1, padding=1).params()
    sel = g.apply(ops.MaxPool2dSelect, params, [x, v])
    x_val = np.zeros((1, 1, 4, 4))
    v_val = np.arange(16.0).reshape(1, 1, 4, 4)
    (got,) = run(sel, {"x": x_val, "v": v_val})
    want = np.array([[v_val[0, 0][_first_max(x_val[0, 0], i, j, (3, 3), (1, 1), ((1, 1), (1, 1)))]
                      for j in range(4)] for i in range(4)])
    np.testing.assert_array_equal(got[0, 0], want)


# ---- strides that do not tile the input ---------------------------------------

def test_conv_input_gradient_when_stride_does_not_tile():
    """H = W = 8, k = 3, s = 2, no padding: windows start at 0, 2, 4 and cover rows
    0..6; row and column 7 get exactly zero gradient, and the shape is 8x8."""
    g = og.Graph()
    x, w = g.input("x", (2, 3, 8, 8)), g.param("w", (4, 3, 3, 3))
    y = og.conv2d(x, w, stride=2)
    assert y.shape == (2, 4, 3, 3)
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal(x.shape), "w": rng.standard_normal(w.shape)}
    gx = check_grad(y, [x, w], feeds)["x"]
    assert gx.shape == (2, 3, 8, 8)
    assert np.all(gx[:, :, 7, :] == 0) and np.all(gx[:, :, :, 7] == 0)
    assert np.all(gx[:, :, :7, :7] != 0)


def test_conv_input_gradient_when_dilated_stride_skips_cells():
    """k = 1, s = 3 on H = 7: rows 0, 3, 6 are read; every other row gets exactly 0."""
    g = og.Graph()
    x, w = g.input("x", (1, 2, 7, 7)), g.param("w", (3, 2, 1, 1))
    y = og.conv2d(x, w, stride=3)
    rng = np.random.default_rng(3)
    gx = check_grad(y, [x, w], {"x": rng.standard_normal(x.shape), "w": rng.standard_normal(w.shape)})["x"]
    touched = np.zeros(7, bool)
    touched[[0, 3, 6]] = True
    assert np.all(gx[:, :, ~touched, :] == 0) and np.all(gx[:, :, :, ~touched] == 0)
    assert np.all(gx[:, :, touched][:, :, :, touched] != 0)


@pytest.mark.parametrize("builder", [og.max_pool2d, og.avg_pool2d])
def test_pool_input_gradient_when_stride_does_not_tile(builder):
    g = og.Graph()
    x = g.input("x", (1, 2, 8, 7))
    y = builder(x, 3, 2)  # rows 0..6 and columns 0..6 are read
    assert y.shape == (1, 2, 3, 3)
    rng = np.random.default_rng(4)
    gx = check_grad(y, [x], {"x": rng.permutation(112).reshape(x.shape) * 0.01})["x"]
    assert gx.shape == x.shape
    assert np.all(gx[:, :, 7, :] == 0)


# ---- batch size 0 ------------------------------------------------------------------

def test_batch_size_zero_gives_empty_outputs_and_zero_weight_gradients():
    g = og.Graph()
    x = g.input("x", (0, 3, 8, 8))
    w1, b1 = g.param("w1", (4, 3, 3, 3)), g.param("b1", (4,))
    w2, b2 = g.param("w2", (5, 16), ), g.param("b2", (5,))
    h = og.max_pool2d(og.relu(og.conv2d(x, w1, b1, stride=2, padding=1)), 2)
    y = og.linear(og.flatten(h), w2, b2)
    grads = og.grad(y, [x, w1, b1, w2, b2])
    rng = np.random.default_rng(5)
    feeds = {"x": np.zeros(x.shape), **{p.name: rng.standard_normal(p.shape) for p in (w1, b1, w2, b2)}}
    y_val, *g_vals = run([y, *grads], feeds, grad_outputs={y: np.zeros(y.shape)})
    assert y_val.shape == (0, 5)
    assert g_vals[0].shape == (0, 3, 8, 8)
    for p, gv in zip((w1, b1, w2, b2), g_vals[1:]):
        assert gv.shape == p.shape and np.all(gv == 0)
