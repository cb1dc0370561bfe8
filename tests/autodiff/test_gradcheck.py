"""The finite-difference checker itself: it must fail on wrong gradients.

Each test plants one error (a wrong rule, or a kernel off at a single element)
and expects ``check_grad`` to raise, in both the element-wise and the
directional mode; a checker that passes everything would make every gradient
test in this folder worthless.
"""

import contextlib

import attrs
import numpy as np
import pytest

import opgraph as og
from opgraph import ops
from opgraph.backends import registry
from opgraph.op import Op

from .gradcheck import away_from_zero, check_grad


@contextlib.contextmanager
def patched_kernel(op_type, wrap):
    """Replace the reference kernel of ``op_type`` by ``wrap(kernel)`` for the block."""
    rule = registry.lookup(op_type, "reference")
    registry.register(attrs.evolve(rule, kernel=wrap(rule.kernel)))
    try:
        yield
    finally:
        registry.register(rule)


def _conv(hw=(8, 8), stride=1):
    g = og.Graph()
    x, w = g.input("x", (2, 3, *hw)), g.param("w", (4, 3, 3, 3))
    rng = np.random.default_rng(0)
    return og.conv2d(x, w, stride=stride), x, w, {"x": rng.standard_normal(x.shape),
                                                  "w": rng.standard_normal(w.shape)}


def test_wrong_rule_is_caught(monkeypatch):
    monkeypatch.setattr(ops.Relu, "vjp", lambda self, node, gy, wanted: (gy,))  # forgets the mask
    g = og.Graph()
    x = g.input("x", (3, 4))
    with pytest.raises(AssertionError, match="gradient of x"):
        check_grad(og.relu(x), [x], {"x": away_from_zero(np.random.default_rng(1), x.shape)})


@pytest.mark.parametrize("directional_only", [False, True])
def test_one_wrong_element_is_caught(directional_only):
    """Conv2dBackwardFilter off by 1e-3 at one of its 108 elements (|g| ~ 50)."""
    def wrap(kernel):
        def bad(ctx, op, *arrays):
            out = kernel(ctx, op, *arrays)
            out[1, 2, 0, 1] += 1e-3
            return out
        return bad

    y, x, w, feeds = _conv()
    mode = dict(max_elementwise=200, directional_only=directional_only)
    check_grad(y, [w], feeds, **mode)  # sound without the error
    with patched_kernel(ops.Conv2dBackwardFilter, wrap):
        with pytest.raises(AssertionError, match="direction" if directional_only else r"at \(1, 2, 0, 1\)"):
            check_grad(y, [w], feeds, **mode)


def test_nonzero_gradient_on_an_untouched_row_is_caught():
    """With a stride that does not tile the input, a gradient leaking into the
    last row (which no window reads) is an error the check sees."""
    def wrap(kernel):
        def bad(ctx, op, *arrays):
            out = kernel(ctx, op, *arrays)
            out[:, :, -1, :] += 1e-4
            return out
        return bad

    y, x, w, feeds = _conv(hw=(8, 8), stride=2)
    with patched_kernel(ops.Conv2dBackwardData, wrap):
        with pytest.raises(AssertionError, match="gradient of x"):
            check_grad(y, [x], feeds, max_elementwise=400)


# Op -> the test module that checks its rule against finite differences.
FD_CHECKED = {
    **dict.fromkeys(["Conv2d", "Conv2dBackwardData", "Conv2dBackwardFilter", "Conv2dBiasRelu", "MaxPool2d",
                     "MaxPool2dBackward", "MaxPool2dBackwardRelu", "MaxPool2dSelect", "AvgPool2d",
                     "AvgPool2dBackward", "MaxPool2dArgmax", "MaxPool2dTake", "MaxPool2dBackwardIndices",
                     "MaxPool2dArgmaxSlot", "MaxPool2dScan"],
                    "test_conv_pool_gradients"),
    **dict.fromkeys(["Conv2dBiasActivation", "Conv2dBackwardDataRelu"], "test_conv_fused_gradients"),
    **dict.fromkeys(["Relu", "ReluBackward", "Threshold", "ThresholdBackward", "Add", "BiasAdd",
                     "BiasAddBackward", "Dropout", "LocalResponseNorm", "Linear", "MatMul",
                     "Flatten", "Reshape", "Concat", "Slice", "SliceBackward", "Pad",
                     "PadBackward", "Softmax", "LogSoftmax", "CrossEntropy", "ReluBackwardSumsSlot",
                     "ReluBackwardSums"],
                    "test_op_gradients"),
    **dict.fromkeys(["BroadcastAdd", "Mul", "SumTo", "BroadcastTo", "GlobalAvgPool2d",
                     "GlobalAvgPool2dBackward", "BatchNorm", "BatchNormBackwardData",
                     "BatchNormBackwardScale", "Transpose"], "test_import_op_gradients"),
    **dict.fromkeys(["Hardtanh", "HardtanhBackward", "Hardsigmoid", "HardsigmoidBackward", "Hardswish",
                     "HardswishBackward", "Sigmoid", "SigmoidBackward", "Silu", "SiluBackward", "Gelu",
                     "GeluBackward", "Div", "Neg", "Mean", "MeanBackward"], "test_modern_op_gradients"),
    **dict.fromkeys(["BatchNormTraining", "BatchNormTrainingBackwardData", "BatchNormTrainingBackwardScale",
                     "LayerNorm", "LayerNormBackwardData", "LayerNormBackwardScale", "LayerNormBackwardDataSums",
                     "LayerNormBackwardScaleSlot"], "test_norm_op_gradients"),
}
NO_INPUTS = {"Zeros", "Constant"}  # their rule returns nothing
#: Rules that refuse with a reason (checked in test_norm_op_gradients): batch statistics are
#: differentiated by their BatchNormTraining reader, running statistics get no gradient; a
#: fused node is made after grad (checked in tests/test_ops_fused.py).
REFUSES = {"BatchNormStats", "BatchNormRunningUpdate", "FusedElementwise",
           # made by the bn-backward-sums fuse rule after grad (tests/ops/test_batchnorm_sums.py)
           "BatchNormTrainingBackwardSums", "BatchNormBackwardSumsRow", "BatchNormTrainingBackwardDataFromSums"}


def test_every_gradient_rule_has_a_finite_difference_test():
    """A new op with a ``vjp`` fails here until a finite-difference test covers it."""
    with_rule = {n for n in ops.__all__ if getattr(ops, n).vjp is not Op.vjp}
    missing = with_rule - set(FD_CHECKED) - NO_INPUTS - REFUSES
    assert not missing, f"no finite-difference test for the gradient rule of {sorted(missing)}"
    assert set(FD_CHECKED) <= with_rule  # the list names no op without a rule
