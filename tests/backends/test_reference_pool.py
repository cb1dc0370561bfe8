"""SEMANTICS.md pooling rules on the reference pooling kernels.

Expected values are either written by hand for tiny cases or computed by a
direct per-window loop written here (float64), independent of the kernels'
padded sliding-window formulation.
"""

import itertools
import math

import numpy as np
import pytest

from opgraph.backends.reference import pool
from opgraph.errors import ParameterError, ShapeError
from opgraph.params import padding2d, pool_out_size

from central_differences import numgrad


def loop_pool(x, k, s, pad, ceil, mode, count_include_pad=True):
    """Direct per-window pooling: windows enumerated by their start, cells
    classified as input / explicit padding / ceil overhang one by one."""
    (pt, pb), (pl, pr) = pad
    n, c, h, w = x.shape
    oh = pool_out_size(h, k[0], s[0], pad[0], ceil)
    ow = pool_out_size(w, k[1], s[1], pad[1], ceil)
    y = np.zeros((n, c, oh, ow))
    for i, j in itertools.product(range(oh), range(ow)):
        vals, cells, padcells = [], 0, 0
        for p, q in itertools.product(range(k[0]), range(k[1])):
            r, col = i * s[0] - pt + p, j * s[1] - pl + q
            if 0 <= r < h and 0 <= col < w:
                vals.append(x[:, :, r, col])
                cells += 1
            elif -pt <= r < h + pb and -pl <= col < w + pr:
                padcells += 1
        stack = np.stack(vals, axis=-1)
        if mode == "max":
            y[:, :, i, j] = stack.max(axis=-1)
        else:
            div = cells + padcells if count_include_pad else cells
            y[:, :, i, j] = stack.sum(axis=-1) / div
    return y


# (in, kernel, stride, (pad_begin, pad_end), ceil_mode, expected out), counted by hand.
SIZES = [
    (5, 2, 2, (1, 1), False, 3),   # padded 7: starts 0,2,4 (a 4th at 6 would not fit)
    (5, 2, 2, (1, 1), True, 3),    # ceil gives 4, but window 4 starts at 6 >= 5+1: dropped
    (3, 2, 2, (1, 1), True, 2),    # ceil gives 3, window 3 starts at 4 >= 3+1: dropped
    (6, 3, 2, (0, 0), False, 2),   # starts 0,2 (start 4 would need cell 6)
    (6, 3, 2, (0, 0), True, 3),    # start 4 < 6 kept, overhangs by one cell
    (112, 3, 2, (0, 0), True, 56), # GoogLeNet's ceil-mode pool
    (112, 3, 2, (0, 0), False, 55),
    (55, 3, 2, (0, 0), True, 27),  # AlexNet: ceil changes nothing here
    (4, 1, 2, (0, 0), False, 2),   # stride larger than the kernel
    (7, 3, 2, (1, 1), True, 4),
]


@pytest.mark.parametrize("n,k,s,pad,ceil,want", SIZES)
def test_output_size_and_ceil_drop_rule(n, k, s, pad, ceil, want):
    assert pool_out_size(n, k, s, pad, ceil) == want
    x = np.random.default_rng(0).standard_normal((1, 1, n, 2))
    kw = dict(kernel_size=(k, 1), stride=(s, 1), padding=(pad, (0, 0)), ceil_mode=ceil)
    assert pool.max_pool2d(np, x, **kw).shape == (1, 1, want, 2)
    assert pool.avg_pool2d(np, x, count_include_pad=True, **kw).shape == (1, 1, want, 2)


CONFIGS = [  # kernel, stride, padding, ceil_mode, input HW
    ((2, 2), (2, 2), ((0, 0), (0, 0)), False, (4, 5)),
    ((3, 3), (2, 2), ((1, 1), (1, 1)), True, (7, 6)),
    ((3, 2), (2, 3), ((1, 0), (0, 1)), True, (6, 7)),   # asymmetric everything
    ((2, 2), (2, 2), ((1, 1), (1, 1)), True, (5, 3)),   # ceil drop rule
    ((1, 1), (2, 2), ((0, 0), (0, 0)), False, (5, 5)),  # stride > kernel
    ((3, 3), (1, 1), ((1, 1), (1, 1)), False, (4, 4)),  # overlapping windows
    ((3, 3), (2, 2), ((0, 0), (0, 0)), True, (6, 6)),   # overhang without padding
]


def distinct_input(shape, seed=0):
    """Values at least 1e-2 apart, so central differences never cross a tie."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.arange(math.prod(shape))).reshape(shape) * 0.01 - 1.0


@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_max_matches_direct_loop(k, s, pad, ceil, hw):
    x = np.random.default_rng(1).standard_normal((2, 3) + hw)
    y = pool.max_pool2d(np, x, kernel_size=k, stride=s, padding=pad, ceil_mode=ceil)
    np.testing.assert_array_equal(y, loop_pool(x, k, s, pad, ceil, "max"))


@pytest.mark.parametrize("cip", [True, False])
@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_avg_matches_direct_loop(k, s, pad, ceil, hw, cip):
    x = np.random.default_rng(2).standard_normal((2, 3) + hw)
    y = pool.avg_pool2d(np, x, kernel_size=k, stride=s, padding=pad, ceil_mode=ceil,
                        count_include_pad=cip)
    np.testing.assert_allclose(y, loop_pool(x, k, s, pad, ceil, "avg", cip), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("cip,want", [
    # x = [1, 2, 3, 4], k=3, s=2, pad (1, 1), ceil: windows cover input cells
    # {-1,0,1}, {1,2,3}, {3,4,5}; -1 and 4 are explicit padding, 5 is overhang.
    (True, [(0 + 1 + 2) / 3, (2 + 3 + 4) / 3, (4 + 0) / 2]),   # overhang not counted
    (False, [(1 + 2) / 2, (2 + 3 + 4) / 3, 4 / 1]),
])
def test_avg_divisor_by_hand_with_ceil_overhang(cip, want):
    x = np.array([1.0, 2.0, 3.0, 4.0])
    kw = dict(ceil_mode=True, count_include_pad=cip)
    y = pool.avg_pool2d(np, x.reshape(1, 1, 1, 4), kernel_size=(1, 3), stride=(1, 2),
                        padding=((0, 0), (1, 1)), **kw)
    np.testing.assert_allclose(y.ravel(), want, rtol=1e-15)
    # the same along H: the rule is per axis
    yt = pool.avg_pool2d(np, x.reshape(1, 1, 4, 1), kernel_size=(3, 1), stride=(2, 1),
                         padding=((1, 1), (0, 0)), **kw)
    np.testing.assert_allclose(yt.ravel(), want, rtol=1e-15)
    # 2-D: the divisor is the product of the per-axis counts
    x2 = np.ones((1, 1, 4, 4))
    y2 = pool.avg_pool2d(np, x2, kernel_size=3, stride=2, padding=1, ceil_mode=True,
                         count_include_pad=cip)
    cells = np.array([2.0, 3.0, 1.0])          # input cells per window along an axis
    div = np.array([3.0, 3.0, 2.0]) if cip else cells
    np.testing.assert_allclose(y2[0, 0], np.outer(cells, cells) / np.outer(div, div), rtol=1e-15)


def test_same_padding_extra_pixel_bottom_right():
    x = np.arange(25.0).reshape(1, 1, 5, 5)
    pad = padding2d("same", in_hw=(5, 5), kernel=(2, 2), stride=(1, 1))
    assert pad == ((0, 1), (0, 1))
    y = pool.max_pool2d(np, x, kernel_size=2, stride=1, padding=pad, ceil_mode=False)
    assert y.shape == (1, 1, 5, 5)
    assert y[0, 0, 0, 0] == x[0, 0, 1, 1]          # no top/left padding
    assert y[0, 0, 4, 4] == x[0, 0, 4, 4]          # last window: one input cell + padding
    a = pool.avg_pool2d(np, x, kernel_size=2, stride=1, padding=pad, ceil_mode=False,
                        count_include_pad=True)
    assert a[0, 0, 0, 0] == (0 + 1 + 5 + 6) / 4
    assert a[0, 0, 4, 4] == 24 / 4
    assert a[0, 0, 4, 0] == (20 + 21) / 4
    # the string form resolves to the same thing inside the kernel
    np.testing.assert_array_equal(
        pool.max_pool2d(np, x, kernel_size=2, stride=1, padding="same", ceil_mode=False), y)
    # stride 2, kernel 3, in 6: out 3, total pad 1, all of it bottom/right
    pad = padding2d("same", in_hw=(6, 6), kernel=(3, 3), stride=(2, 2))
    assert pad == ((0, 1), (0, 1))
    x6 = np.arange(36.0).reshape(1, 1, 6, 6)
    y6 = pool.max_pool2d(np, x6, kernel_size=3, stride=2, padding=pad, ceil_mode=False)
    np.testing.assert_array_equal(y6[0, 0], [[14, 16, 17], [26, 28, 29], [32, 34, 35]])


def test_nan_propagates_and_takes_the_gradient():
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    x[0, 0, 0, 1] = np.nan        # in window (0, 0), not its maximum
    kw = dict(kernel_size=2, stride=2, padding=0, ceil_mode=False)
    y = pool.max_pool2d(np, x, **kw)
    assert np.isnan(y[0, 0, 0, 0])
    assert np.isnan(y).sum() == 1
    np.testing.assert_array_equal(y[0, 0, 1], [13, 15])
    gy = np.full((1, 1, 2, 2), 3.0)
    gx = pool.max_pool2d_backward(np, x, gy, **kw)
    assert np.isfinite(gx).all()
    assert gx[0, 0, 0, 1] == 3.0 and gx[0, 0, 1, 1] == 0.0


def test_all_minus_inf_window_gives_minus_inf_and_finite_routed_gradient():
    x = np.full((1, 1, 3, 3), -np.inf)
    x[0, 0, 2, 2] = 1.0
    kw = dict(kernel_size=2, stride=2, padding=1, ceil_mode=False)
    y = pool.max_pool2d(np, x, **kw)
    # window (0,0) holds padding and the -inf input cell (0,0) only
    np.testing.assert_array_equal(y[0, 0], [[-np.inf, -np.inf], [-np.inf, 1.0]])
    gy = np.array([[[[1.0, 2.0], [4.0, 8.0]]]])
    gx = pool.max_pool2d_backward(np, x, gy, **kw)
    assert np.isfinite(gx).all()
    # the gradient goes to the first *input* cell of each window, never into padding
    want = np.zeros((3, 3))
    want[0, 0], want[0, 1], want[1, 0], want[2, 2] = 1.0, 2.0, 4.0, 8.0
    np.testing.assert_array_equal(gx[0, 0], want)


def test_ties_go_to_first_maximum_in_row_major_order():
    x = np.zeros((1, 1, 3, 3))
    gy = np.array([[[[1.0, 2.0], [4.0, 8.0]]]])
    kw = dict(kernel_size=2, stride=1, padding=0, ceil_mode=False)
    gx = pool.max_pool2d_backward(np, x, gy, **kw)
    # every window's first cell is its top-left one
    np.testing.assert_array_equal(gx[0, 0], [[1, 2, 0], [4, 8, 0], [0, 0, 0]])
    # max at window positions (0, 1) and (1, 0): (0, 1) comes first row-major
    x = np.array([[[[0.0, 5.0], [5.0, 1.0]]]])
    gx = pool.max_pool2d_backward(np, x, np.array([[[[7.0]]]]), kernel_size=2, stride=2,
                                  padding=0, ceil_mode=False)
    np.testing.assert_array_equal(gx[0, 0], [[0, 7], [0, 0]])


@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_tied_gradient_sums_to_output_gradient(k, s, pad, ceil, hw):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2, (2, 2) + hw).astype(np.float64)   # many ties
    x[0, 0] = -np.inf                                          # all -inf windows too
    kw = dict(kernel_size=k, stride=s, padding=pad, ceil_mode=ceil)
    y = pool.max_pool2d(np, x, **kw)
    gy = rng.standard_normal(y.shape)
    gx = pool.max_pool2d_backward(np, x, gy, **kw)
    np.testing.assert_allclose(gx.sum(axis=(2, 3)), gy.sum(axis=(2, 3)), rtol=1e-12)
    assert np.isfinite(gx).all()


@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_max_backward_finite_differences(k, s, pad, ceil, hw):
    x = distinct_input((1, 2) + hw)
    kw = dict(kernel_size=k, stride=s, padding=pad, ceil_mode=ceil)
    gy = np.random.default_rng(4).standard_normal(pool.max_pool2d(np, x, **kw).shape)
    want = numgrad(lambda v: pool.max_pool2d(np, v, **kw), x, gy)
    np.testing.assert_allclose(pool.max_pool2d_backward(np, x, gy, **kw), want, atol=1e-8)


@pytest.mark.parametrize("cip", [True, False])
@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_avg_backward_finite_differences(k, s, pad, ceil, hw, cip):
    x = np.random.default_rng(5).standard_normal((1, 2) + hw)
    kw = dict(kernel_size=k, stride=s, padding=pad, ceil_mode=ceil, count_include_pad=cip)
    gy = np.random.default_rng(6).standard_normal(pool.avg_pool2d(np, x, **kw).shape)
    want = numgrad(lambda v: pool.avg_pool2d(np, v, **kw), x, gy)
    got = pool.avg_pool2d_backward(np, gy, input_shape=x.shape, **kw)
    np.testing.assert_allclose(got, want, atol=1e-8)


def test_backward_fills_rows_no_window_touches_with_zero():
    x = np.random.default_rng(7).standard_normal((1, 1, 5, 5))
    kw = dict(kernel_size=2, stride=2, padding=0, ceil_mode=False)   # row/col 4 unused
    gy = np.ones((1, 1, 2, 2))
    gmax = pool.max_pool2d_backward(np, x, gy, **kw)
    gavg = pool.avg_pool2d_backward(np, gy, input_shape=x.shape, count_include_pad=True, **kw)
    for g in (gmax, gavg):
        assert g.shape == x.shape
        assert not g[0, 0, 4].any() and not g[0, 0, :, 4].any()


def test_batch_size_zero():
    x = np.zeros((0, 3, 6, 6))
    kw = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)
    y = pool.max_pool2d(np, x, **kw)
    assert y.shape == (0, 3, 4, 4)
    assert pool.max_pool2d_backward(np, x, y, **kw).shape == x.shape
    a = pool.avg_pool2d(np, x, count_include_pad=False, **kw)
    assert a.shape == (0, 3, 4, 4)
    g = pool.avg_pool2d_backward(np, a, count_include_pad=False, input_shape=x.shape, **kw)
    assert g.shape == x.shape


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_is_kept(dtype):
    x = np.random.default_rng(8).standard_normal((1, 2, 5, 5)).astype(dtype)
    kw = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)
    y = pool.max_pool2d(np, x, **kw)
    a = pool.avg_pool2d(np, x, count_include_pad=True, **kw)
    assert y.dtype == dtype and a.dtype == dtype
    assert pool.max_pool2d_backward(np, x, y, **kw).dtype == dtype
    assert pool.avg_pool2d_backward(np, a, count_include_pad=True, input_shape=x.shape, **kw).dtype == dtype
    ref = loop_pool(x.astype(np.float64), (3, 3), (2, 2), ((1, 1), (1, 1)), True, "avg")
    np.testing.assert_allclose(a, ref, rtol=2e-3 if dtype == np.float16 else 1e-6, atol=1e-3)


def test_bad_parameters_raise():
    x = np.zeros((1, 1, 4, 4))
    with pytest.raises(ParameterError, match="padding"):
        pool.max_pool2d(np, x, kernel_size=2, stride=2, padding=2, ceil_mode=False)
    with pytest.raises(ParameterError, match="padding"):
        pool.avg_pool2d(np, x, kernel_size=3, stride=1, padding=((0, 2), (0, 0)), ceil_mode=False,
                        count_include_pad=True)
    with pytest.raises(ParameterError, match="stride"):
        pool.max_pool2d(np, x, kernel_size=2, stride=0, padding=0, ceil_mode=False)
    with pytest.raises(ShapeError):
        pool.max_pool2d(np, x, kernel_size=5, stride=1, padding=0, ceil_mode=False)
    with pytest.raises(ShapeError):
        pool.avg_pool2d_backward(np, np.zeros((1, 1, 3, 3)), kernel_size=2, stride=2, padding=0,
                                 ceil_mode=False, count_include_pad=True, input_shape=(1, 1, 4, 4))


@pytest.mark.parametrize("k,s,pad,ceil,hw", CONFIGS)
def test_select_is_the_adjoint_of_max_backward(k, s, pad, ceil, hw):
    rng = np.random.default_rng(9)
    x = rng.integers(0, 3, (2, 2) + hw).astype(np.float64)   # ties included
    x[1, 1] = -np.inf
    kw = dict(kernel_size=k, stride=s, padding=pad, ceil_mode=ceil)
    v = rng.standard_normal(x.shape)
    gy = rng.standard_normal(pool.max_pool2d(np, x, **kw).shape)
    lhs = np.sum(pool.max_pool2d_select(np, x, v, **kw) * gy)
    rhs = np.sum(v * pool.max_pool2d_backward(np, x, gy, **kw))
    assert lhs == pytest.approx(rhs, rel=1e-12)
    # selecting x itself gives the forward output
    np.testing.assert_array_equal(pool.max_pool2d_select(np, x, x, **kw), pool.max_pool2d(np, x, **kw))


def test_pool_relu_backward_by_hand():
    # x is a ReLU's output pooled 2x2: the gradient reaches a window's winner only where it is > 0
    x = np.array([[[[0.0, 3.0, 0.0, 0.0],
                    [1.0, 2.0, 0.0, 0.0],
                    [np.nan, 5.0, -0.0, 0.0],
                    [7.0, 1.0, 0.0, -1.0]]]])
    gy = np.array([[[[10.0, 20.0], [30.0, 40.0]]]])
    kw = dict(kernel_size=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False)
    want = np.zeros_like(x)
    want[0, 0, 0, 1] = 10.0  # 3 wins and is > 0; the all-zero window (20) routes nothing;
    # the NaN wins its window (30) but fails the mask; 0.0 wins the last (40): masked too
    got = pool.max_pool2d_backward_relu(np, x, gy, **kw)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == gy.dtype
    with pytest.raises(ShapeError, match="gy has shape"):
        pool.max_pool2d_backward_relu(np, x, gy[:, :, :1], **kw)


@pytest.mark.parametrize("dtype, g", [("float16", 0.7), ("bfloat16", 0.7)])
def test_max_pool_backward_sums_half_precision_in_float32(dtype, g):
    # the centre of a 3x3 plane wins all nine overlapping 3x3 windows (stride 1,
    # padding 1): nine gradients of 0.7 summed in float32 and rounded once give
    # 6.30078125 (fp16) / 6.28125 (bf16); rounding every partial sum in the
    # storage dtype gives 6.296875 / 6.25
    from opgraph.backends.reference import pool as rp
    from opgraph.types import numpy_dtype

    dt = numpy_dtype(dtype)
    x = np.zeros((1, 1, 3, 3), dtype=dt)
    x[0, 0, 1, 1] = 1  # the winner of every window that holds it
    gy = np.full((1, 1, 3, 3), g, dtype=dt)
    gx = rp.max_pool2d_backward(np, x, gy, kernel_size=(3, 3), stride=(1, 1),
                                padding=((1, 1), (1, 1)), ceil_mode=False)
    exact = 9 * float(np.asarray(gy[0, 0, 0, 0], np.float64))
    assert gx.dtype == dt and float(gx[0, 0, 1, 1]) == float(np.asarray(exact, np.float32).astype(dt))


# ---- graph nodes: the op's canonical fields and the node's types, nothing re-derived

NODE_CASES = [  # (kernel, stride, padding, ceil_mode), asymmetric and ceil-mode overhangs
    ((3, 2), (2, 1), ((1, 0), (0, 1)), True),
    ((2, 3), (2, 2), ((1, 1), (1, 0)), False),
]


@pytest.mark.parametrize("kernel, stride, padding, ceil", NODE_CASES)
def test_node_kernels_read_the_node_geometry_and_never_recompute_it(monkeypatch, kernel, stride, padding,
                                                                    ceil):
    """Every pooling node's reference kernel equals the standalone function,
    with ``padding2d`` and ``pool_out_size`` unavailable to it: the geometry
    comes from the op's fields and the node's types (``ctx.out_type``)."""
    import opgraph as og
    from opgraph.backends.registry import KernelContext, lookup
    from opgraph.ops import (AvgPool2dBackward, MaxPool2dBackward, MaxPool2dBackwardRelu,
                             MaxPool2dSelect)

    rng = np.random.default_rng(7)
    g = og.Graph()
    xv = g.input("x", (2, 3, 9, 8), "float64")
    fields = dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil)
    nodes = [og.max_pool2d(xv, kernel, stride, padding, ceil),
             og.avg_pool2d(xv, kernel, stride, padding, ceil)]
    gy = g.input("gy", nodes[0].shape, "float64")
    nodes += [g.apply(MaxPool2dBackward, fields, [xv, gy]), g.apply(MaxPool2dBackwardRelu, fields, [xv, gy]),
              g.apply(MaxPool2dSelect, fields, [xv, xv]),
              g.apply(AvgPool2dBackward, dict(fields, input_shape=xv.shape), [gy])]
    feeds = {"x": rng.standard_normal(xv.shape), "gy": rng.standard_normal(gy.shape)}
    standalone = {"MaxPool2d": pool.max_pool2d, "AvgPool2d": pool.avg_pool2d,
                  "MaxPool2dBackward": pool.max_pool2d_backward,
                  "MaxPool2dBackwardRelu": pool.max_pool2d_backward_relu,
                  "MaxPool2dSelect": pool.max_pool2d_select, "AvgPool2dBackward": pool.avg_pool2d_backward}
    args = {v.name: [feeds[i.name] for i in g.node(v.node).inputs] for v in nodes}
    want = {v.name: standalone[v.op.name](np, *args[v.name], **v.op.params()) for v in nodes}

    def unavailable(*a, **k):
        raise AssertionError("a node kernel re-derived its geometry")

    monkeypatch.setattr(pool, "padding2d", unavailable)
    monkeypatch.setattr(pool, "pool_out_size", unavailable)
    for v in nodes:
        ctx = KernelContext(np, "cpu", {}, v.type)
        got = lookup(type(v.op), "reference").kernel(ctx, v.op, *args[v.name])
        assert got.shape == v.shape
        np.testing.assert_array_equal(got, want[v.name])


def test_a_node_kernel_sizes_its_output_from_the_context():
    """The pooled extent is ``ctx.out_type``'s when given (the executor's), the
    op's own rule otherwise (a kernel called by hand)."""
    from opgraph.backends.registry import KernelContext, lookup
    from opgraph.ops import MaxPool2d
    from opgraph.types import TensorType

    op = MaxPool2d(kernel_size=2, stride=2)
    x = np.arange(2 * 6 * 6, dtype=np.float64).reshape(1, 2, 6, 6)
    kernel = lookup(MaxPool2d, "reference").kernel
    assert kernel(KernelContext(np), op, x).shape == (1, 2, 3, 3)
    # given a type, the kernel reads its extent and computes none (a smaller one shows it)
    given = KernelContext(np, out_type=TensorType((1, 2, 2, 3), "float64"))
    assert kernel(given, op, x).shape == (1, 2, 2, 3)
