"""The fused convolution ops (``opgraph/ops/conv_fused.py``): shape rules,
canonical forms, the epilogue description every backend reads."""

from __future__ import annotations

import pytest

from opgraph import ops
from opgraph.errors import ParameterError, ShapeError
from opgraph.ops.conv_fused import activation_of, epilogue_steps, fused_conv_forward
from opgraph.types import TensorType as T

X, W, B = T((2, 4, 8, 8)), T((6, 4, 3, 3)), T((6,))
P = dict(stride=1, padding=1, dilation=1, groups=1)


def test_forward_shapes_and_the_residual_input():
    op = ops.Conv2dBiasActivation(**P, activation="relu6", residual=True)
    assert op.infer(X, W, B, T((2, 6, 8, 8))) == T((2, 6, 8, 8))
    with pytest.raises(ShapeError, match="residual=True takes 4 inputs, got 3"):
        op.infer(X, W, B)
    with pytest.raises(ShapeError, match=r"residual shape \(2, 6, 4, 4\) != output shape"):
        op.infer(X, W, B, T((2, 6, 4, 4)))
    with pytest.raises(ShapeError, match="mixed dtypes"):
        op.infer(X, W, B, T((2, 6, 8, 8), "float64"))
    plain = ops.Conv2dBiasActivation(**P, activation="none", residual=False)
    with pytest.raises(ShapeError, match="residual=False takes 3 inputs, got 4"):
        plain.infer(X, W, B, T((2, 6, 8, 8)))
    assert plain.flops((X, W, B), plain.infer(X, W, B)) == ops.Conv2d(**P).flops((X, W, B), None)


def test_one_op_per_computation():
    """ReLU alone is Conv2dBiasRelu: the general op refuses that form, and the
    factory the fuse pass uses picks the special case."""
    with pytest.raises(ParameterError, match="Conv2dBiasRelu"):
        ops.Conv2dBiasActivation(**P, activation="relu", residual=False)
    with pytest.raises(ParameterError, match="activation"):
        ops.Conv2dBiasActivation(**P, activation="gelu")
    assert fused_conv_forward(ops.Conv2d(**P).conv_params(), "relu", False) == ops.Conv2dBiasRelu(**P)
    assert type(fused_conv_forward(ops.Conv2d(**P).conv_params(), "relu", True)) is ops.Conv2dBiasActivation
    # Conv2dBiasRelu keeps its fields and description (no activation/residual parameters)
    assert ops.Conv2dBiasRelu(**P).describe() == "Conv2dBiasRelu(stride=1, padding=1, dilation=1, groups=1)"
    assert (ops.Conv2dBiasRelu.activation, ops.Conv2dBiasRelu.residual) == ("relu", False)


def test_backward_data_relu_shapes():
    op = ops.Conv2dBackwardDataRelu(**P, input_shape=(2, 4, 8, 8))
    gy = T((2, 6, 8, 8))
    assert op.infer(gy, W, T((2, 4, 8, 8))) == T((2, 4, 8, 8))
    with pytest.raises(ShapeError, match="ReLU output shape"):
        op.infer(gy, W, T((2, 4, 8, 7)))
    assert op.unfused() == ops.Conv2dBackwardData(**P, input_shape=(2, 4, 8, 8))
    assert op.flops((gy, W, T((2, 4, 8, 8))), None) == op.unfused().flops((gy, W), None)


def test_family_direction_and_epilogue_steps():
    assert {t.__name__: t.direction for t in ops.of_family("conv") if t.fused} == {
        "Conv2dBiasRelu": "fwd", "Conv2dBiasActivation": "fwd", "Conv2dBackwardDataRelu": "dgrad"}
    assert epilogue_steps(ops.Conv2d(**P), 2) == () and epilogue_steps(ops.Conv2d(**P), 3) == ("bias",)
    assert epilogue_steps(ops.Conv2dBiasRelu(**P), 3) == ("bias", "relu")
    assert epilogue_steps(ops.Conv2dBiasActivation(**P, activation="relu6", residual=True), 4) == \
        ("bias", "add", "relu6")
    assert epilogue_steps(ops.Conv2dBiasActivation(**P, activation="none", residual=True), 4) == ("bias", "add")
    assert epilogue_steps(ops.Conv2dBackwardDataRelu(**P, input_shape=(2, 4, 8, 8)), 3) == ("drelu",)
    assert epilogue_steps(ops.Conv2dBackwardData(**P, input_shape=(2, 4, 8, 8)), 2) == ()


def test_activation_of():
    assert activation_of(ops.Relu()) == "relu"
    assert activation_of(ops.Hardtanh(min_val=0.0, max_val=6.0)) == "relu6"
    assert activation_of(ops.Hardtanh(min_val=-1.0, max_val=1.0)) is None
    assert activation_of(ops.Hardtanh(min_val=0.0, max_val=1.0)) is None
    assert activation_of(ops.Threshold(threshold=0.0, value=0.0)) is None
