"""Finite-difference checks of the convolution and pooling gradient rules.

Every rule (``vjp``) of ``opgraph.ops.conv`` and ``opgraph.ops.pool`` is
checked in float64 against central differences, over grids of stride,
asymmetric padding, dilation, groups (depthwise included), ceil_mode and
count_include_pad. The backward ops are checked as functions of all their
inputs, which tests the second-derivative rules.
"""

import itertools

import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.params import pool_out_size

from .gradcheck import check_grad, distinct

STRIDES = [1, 2, (2, 1)]
PADDINGS = [0, ((0, 1), (2, 0)), "same"]
DILATIONS = [1, (2, 1)]
# (in_channels, out_channels, groups): dense, grouped, depthwise, depthwise x2.
GROUPINGS = [(4, 3, 1), (4, 6, 2), (4, 4, 4), (3, 6, 3)]


def _conv_case(stride, padding, dilation, grouping, bias=True, hw=(7, 6), kernel=(3, 2), seed=0):
    c, o, groups = grouping
    g = og.Graph()
    x = g.input("x", (2, c, *hw))
    w = g.param("w", (o, c // groups, *kernel))
    b = g.param("b", (o,)) if bias else None
    y = og.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal(x.shape), "w": rng.standard_normal(w.shape)}
    if bias:
        feeds["b"] = rng.standard_normal(b.shape)
    return y, [v for v in (x, w, b) if v is not None], feeds


@pytest.mark.parametrize("stride, padding, dilation, grouping",
                         list(itertools.product(STRIDES, PADDINGS, DILATIONS, GROUPINGS)))
def test_conv2d(stride, padding, dilation, grouping):
    y, wrt, feeds = _conv_case(stride, padding, dilation, grouping)
    check_grad(y, wrt, feeds)


@pytest.mark.parametrize("stride, padding, grouping", [
    (1, 1, (4, 3, 1)), (2, ((0, 1), (2, 0)), (4, 6, 2)), ((2, 1), 0, (4, 4, 4))])
def test_conv2d_bias_relu(stride, padding, grouping):
    """The fused node of the fuse pass: relu(conv(x, w) + b)."""
    c, o, groups = grouping
    g = og.Graph()
    x, w, b = g.input("x", (2, c, 7, 6)), g.param("w", (o, c // groups, 3, 2)), g.param("b", (o,))
    params = dict(stride=stride, padding=padding, dilation=1, groups=groups)
    y = g.apply(ops.Conv2dBiasRelu, params, [x, w, b])
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal(x.shape), "w": rng.standard_normal(w.shape),
             "b": rng.standard_normal(b.shape)}
    check_grad(y, [x, w, b], feeds)


@pytest.mark.parametrize("hw, kernel, stride, padding", [
    ((5, 5), (1, 1), 2, 0),              # stride larger than the kernel
    ((2, 3), (3, 3), 1, 1),              # kernel larger than the input, not the padded input
    ((8, 8), (3, 3), 2, 0),              # stride does not tile the input
    ((6, 7), (3, 3), 3, ((1, 0), (0, 1))),
])
def test_conv2d_odd_geometry_without_bias(hw, kernel, stride, padding):
    y, wrt, feeds = _conv_case(stride, padding, 1, (2, 3, 1), bias=False, hw=hw, kernel=kernel)
    check_grad(y, wrt, feeds)


def _backward_case(op_cls, stride, padding, dilation, grouping, seed=1):
    """A graph computing one conv backward op from two sources."""
    c, o, groups = grouping
    x_shape, w_shape = (2, c, 6, 5), (o, c // groups, 3, 2)
    conv = ops.Conv2d(stride=stride, padding=padding, dilation=dilation, groups=groups)
    gy_shape = conv.infer(og.TensorType(x_shape), og.TensorType(w_shape)).shape
    g = og.Graph()
    p = conv.conv_params()
    if op_cls is ops.Conv2dBackwardData:
        a, b = g.input("gy", gy_shape), g.param("w", w_shape)
        out = g.apply(op_cls, dict(p, input_shape=x_shape), [a, b])
    else:
        a, b = g.input("x", x_shape), g.input("gy", gy_shape)
        out = g.apply(op_cls, dict(p, weight_shape=w_shape), [a, b])
    rng = np.random.default_rng(seed)
    return out, [a, b], {a.name: rng.standard_normal(a.shape), b.name: rng.standard_normal(b.shape)}


@pytest.mark.parametrize("op_cls", [ops.Conv2dBackwardData, ops.Conv2dBackwardFilter])
@pytest.mark.parametrize("stride, padding, dilation, grouping", [
    (1, 0, 1, (4, 3, 1)),
    (2, ((0, 1), (2, 0)), 1, (4, 6, 2)),
    ((2, 1), 1, (2, 1), (4, 4, 4)),
    (2, 0, 1, (3, 6, 3)),   # 6 = 2*2 + 2: the last row is touched by no window
])
def test_conv2d_backward_ops(op_cls, stride, padding, dilation, grouping):
    out, wrt, feeds = _backward_case(op_cls, stride, padding, dilation, grouping)
    check_grad(out, wrt, feeds)


# ---- pooling ----------------------------------------------------------------

def _pool_grid():
    """(kernel, stride, padding, ceil_mode) with padding <= kernel/2 per side."""
    cases = []
    for kernel, stride, padding, ceil_mode in itertools.product(
            [2, 3, (3, 2)], [1, 2, None, (1, 3)], [0, 1, ((1, 0), (0, 1))], [False, True]):
        k = (kernel, kernel) if isinstance(kernel, int) else kernel
        pads = ((padding,) * 2,) * 2 if isinstance(padding, int) else padding
        if any(max(p) > kk // 2 for p, kk in zip(pads, k)):
            continue
        cases.append((kernel, stride, padding, ceil_mode))
    return cases


POOL_GRID = _pool_grid()


def _pool_graph(builder, kernel, stride, padding, ceil_mode, hw=(7, 6), **extra):
    g = og.Graph()
    x = g.input("x", (2, 3, *hw))
    return x, builder(x, kernel, stride, padding, ceil_mode, **extra)


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", POOL_GRID)
def test_max_pool2d(kernel, stride, padding, ceil_mode):
    x, y = _pool_graph(og.max_pool2d, kernel, stride, padding, ceil_mode)
    # Values pairwise 0.01 apart: no tie within eps, so the max is differentiable.
    check_grad(y, [x], {"x": distinct(np.random.default_rng(2), x.shape)})


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", POOL_GRID)
def test_avg_pool2d(kernel, stride, padding, ceil_mode, count_include_pad):
    x, y = _pool_graph(og.avg_pool2d, kernel, stride, padding, ceil_mode,
                       count_include_pad=count_include_pad)
    check_grad(y, [x], {"x": np.random.default_rng(3).standard_normal(x.shape)})


DOUBLE_GRID = [(3, 2, 1, True), (2, 1, 0, False), ((3, 2), (1, 3), ((1, 0), (0, 1)), True),
               (3, 2, 0, False)]


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", DOUBLE_GRID)
def test_max_pool2d_backward_and_select(kernel, stride, padding, ceil_mode):
    """Both are linear in their second input with routing fixed by x: the
    derivative in x is zero (away from ties) and in the other input is the
    adjoint op, which ``check_grad`` compares with finite differences."""
    params = ops.MaxPool2d(kernel_size=kernel, stride=kernel if stride is None else stride,
                           padding=padding, ceil_mode=ceil_mode).params()
    rng = np.random.default_rng(4)
    x_shape = (2, 2, 7, 6)
    out_shape = ops.MaxPool2d(**params).infer(og.TensorType(x_shape)).shape
    for op_cls, second_shape in [(ops.MaxPool2dBackward, out_shape), (ops.MaxPool2dSelect, x_shape),
                                 (ops.MaxPool2dBackwardRelu, out_shape)]:
        g = og.Graph()
        x, v = g.input("x", x_shape), g.input("v", second_shape)
        out = g.apply(op_cls, params, [x, v])
        feeds = {"x": distinct(rng, x_shape), "v": rng.standard_normal(second_shape)}
        grads = check_grad(out, [x, v], feeds)
        assert np.all(grads["x"] == 0)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", DOUBLE_GRID)
def test_avg_pool2d_backward(kernel, stride, padding, ceil_mode, count_include_pad):
    op = ops.AvgPool2d(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
                       count_include_pad=count_include_pad)
    x_shape = (2, 2, 7, 6)
    g = og.Graph()
    gy = g.input("gy", op.infer(og.TensorType(x_shape)).shape)
    out = g.apply(ops.AvgPool2dBackward, dict(op.params(), input_shape=x_shape), [gy])
    check_grad(out, [gy], {"gy": np.random.default_rng(5).standard_normal(gy.shape)})


def test_pool_grid_covers_ceil_mode_overhang():
    """The grid is only worth something if ceil_mode changes some output sizes."""
    changed = 0
    for kernel, stride, padding, ceil_mode in POOL_GRID:
        op = ops.MaxPool2d(kernel_size=kernel, stride=kernel if stride is None else stride,
                           padding=padding)
        sizes = [(pool_out_size(n, k, s, p, True), pool_out_size(n, k, s, p, False))
                 for n, k, s, p in zip((7, 6), op.kernel_size, op.stride, op.padding)]
        changed += ceil_mode and any(a != b for a, b in sizes)
    assert changed >= 5


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", DOUBLE_GRID)
def test_max_pool2d_through_saved_winners(kernel, stride, padding, ceil_mode, masked):
    """``MaxPool2dTake(x, MaxPool2dArgmax(x))`` (the pool-argmax rule's forward;
    ``masked``: 0 where the ReLU mark is set) in x, and the gather
    ``MaxPool2dBackwardIndices(idx, gy)`` in gy and in x (through the argmax:
    zero away from ties), against finite differences."""
    window = dict(kernel_size=kernel, stride=kernel if stride is None else stride, padding=padding,
                  ceil_mode=ceil_mode)
    params = ops.MaxPool2d(**window).params()
    rng = np.random.default_rng(6)
    x_shape = (2, 2, 7, 6)
    out_shape = ops.MaxPool2d(**params).infer(og.TensorType(x_shape)).shape
    g = og.Graph()
    x, gy = g.input("x", x_shape), g.input("gy", out_shape)
    idx = g.apply(ops.MaxPool2dArgmax, dict(params, relu=masked), [x])
    y = g.apply(ops.MaxPool2dTake, dict(params, masked=masked), [x, idx])
    feeds = {"x": distinct(rng, x_shape), "gy": rng.standard_normal(out_shape)}
    check_grad(y, [x], feeds)
    gx = g.apply(ops.MaxPool2dBackwardIndices, dict(params, masked=masked, input_shape=x_shape), [idx, gy])
    grads = check_grad(gx, [x, gy], feeds)
    assert np.all(grads["x"] == 0)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", DOUBLE_GRID)
def test_max_pool2d_scan_through_its_slot(kernel, stride, padding, ceil_mode, relu):
    """``MaxPool2dScan(x, MaxPool2dArgmaxSlot(x))`` (the pool-scan rule's forward,
    ``relu`` marking the winners it saves, never its maximum) in x against finite
    differences: its rule is MaxPool2d's (a gradient that scans x again, so it never reads
    the slot before the scan fills it); the slot, like the argmax, is piecewise constant
    (no gradient)."""
    window = dict(kernel_size=kernel, stride=kernel if stride is None else stride, padding=padding,
                  ceil_mode=ceil_mode)
    params = ops.MaxPool2d(**window).params()
    rng = np.random.default_rng(7)
    x_shape = (2, 2, 7, 6)
    g = og.Graph()
    x = g.input("x", x_shape)
    slot = g.apply(ops.MaxPool2dArgmaxSlot, dict(params, relu=relu), [x])
    y = g.apply(ops.MaxPool2dScan, dict(params, relu=relu), [x, slot])
    check_grad(y, [x], {"x": distinct(rng, x_shape)})
