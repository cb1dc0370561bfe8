"""Finite-difference checks of the fused convolutions' gradient rules
(``opgraph/ops/conv_fused.py``), in float64: the forward with its epilogue
(bias, residual addend, ReLU / ReLU6 / none) and backward-data with its ReLU
gradient, each as a function of every input. ``Conv2dBiasRelu`` is checked in
test_conv_pool_gradients.py."""

import numpy as np
import pytest

import opgraph as og
from opgraph import ops

from .gradcheck import check_grad

#: (stride, padding, (in_channels, out_channels, groups))
GEOMETRIES = [(1, 1, (4, 3, 1)), (2, ((0, 1), (2, 0)), (4, 6, 2)), ((2, 1), 0, (4, 4, 4))]


@pytest.mark.parametrize("activation, residual", [("none", False), ("none", True), ("relu", True),
                                                  ("relu6", False), ("relu6", True)])
@pytest.mark.parametrize("stride, padding, grouping", GEOMETRIES)
def test_conv2d_bias_activation(activation, residual, stride, padding, grouping):
    """``act(conv(x, w) + b [+ r])``; values spread over both ReLU6 bounds."""
    c, o, groups = grouping
    g = og.Graph()
    x, w, b = g.input("x", (2, c, 7, 6)), g.param("w", (o, c // groups, 3, 2)), g.param("b", (o,))
    params = dict(stride=stride, padding=padding, dilation=1, groups=groups, activation=activation,
                  residual=residual)
    out_shape = ops.Conv2d(stride=stride, padding=padding, groups=groups).infer(x.type, w.type).shape
    r = g.input("r", out_shape) if residual else None
    y = g.apply(ops.Conv2dBiasActivation, params, [x, w, b] + ([r] if residual else []))
    rng = np.random.default_rng(7)
    feeds = {"x": 2 * rng.standard_normal(x.shape), "w": rng.standard_normal(w.shape),
             "b": rng.standard_normal(b.shape)}
    if residual:
        feeds["r"] = 3 * rng.standard_normal(out_shape)
    out = og.compile([y], pipeline="reference", dtype="float64")(**feeds)[0]
    if activation == "relu6":
        assert (out == 6).any() and (out == 0).any() and ((out > 0) & (out < 6)).any()
    check_grad(y, [x, w, b] + ([r] if residual else []), feeds, kink_retries=2)


@pytest.mark.parametrize("stride, padding, grouping", GEOMETRIES)
def test_conv2d_backward_data_relu(stride, padding, grouping):
    """``Conv2dBackwardData(gy, w) * (y > 0)`` in gy and w (the second
    derivatives through the mask); in y its derivative is 0 (y kept off 0)."""
    c, o, groups = grouping
    x_shape, w_shape = (2, c, 6, 5), (o, c // groups, 3, 2)
    conv = ops.Conv2d(stride=stride, padding=padding, groups=groups)
    gy_shape = conv.infer(og.TensorType(x_shape), og.TensorType(w_shape)).shape
    g = og.Graph()
    gy, w, y = g.input("gy", gy_shape), g.param("w", w_shape), g.input("y", x_shape)
    out = g.apply(ops.Conv2dBackwardDataRelu, dict(conv.conv_params(), input_shape=x_shape), [gy, w, y])
    rng = np.random.default_rng(3)
    mask = rng.standard_normal(x_shape)
    feeds = {"gy": rng.standard_normal(gy_shape), "w": rng.standard_normal(w_shape),
             "y": np.where(mask > 0, mask + 0.5, mask - 0.5)}  # no entry within 0.5 of the kink
    grads = check_grad(out, [gy, w, y], feeds)
    assert not np.any(grads["y"])
    # the fused node is the unfused pair's value
    masked = g.apply(ops.ReluBackward, {}, [y, g.apply(ops.Conv2dBackwardData,
                                                       dict(conv.conv_params(), input_shape=x_shape), [gy, w])])
    a, b = og.compile([out, masked], pipeline="reference", dtype="float64")(**feeds)
    np.testing.assert_array_equal(a, b)
