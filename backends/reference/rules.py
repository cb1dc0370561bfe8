"""Registers the NumPy reference kernels as the ``reference`` lowering of every op.

The convolution reference (the ``direct`` algorithm) is registered with the
other convolution algorithms in ``opgraph.backends.conv_rules``.
"""

from __future__ import annotations

from opgraph import ops

from ..registry import Rule, register
from . import broadcast, elementwise, linear, loss, lrn, norm, pool, shape, tensor
from . import activation, arithmetic, batchnorm_training, layer_norm, reduce

#: abstract op type -> reference function ``fn(xp, *arrays, **op.params())``.
REFERENCE_KERNELS = {
    ops.MaxPool2d: pool.max_pool2d,
    ops.MaxPool2dBackward: pool.max_pool2d_backward,
    ops.MaxPool2dBackwardRelu: pool.max_pool2d_backward_relu,
    ops.MaxPool2dSelect: pool.max_pool2d_select,
    ops.AvgPool2d: pool.avg_pool2d,
    ops.AvgPool2dBackward: pool.avg_pool2d_backward,
    ops.Relu: elementwise.relu,
    ops.ReluBackward: elementwise.relu_backward,
    ops.Threshold: elementwise.threshold,
    ops.ThresholdBackward: elementwise.threshold_backward,
    ops.Add: elementwise.add,
    ops.BiasAdd: elementwise.bias_add,
    ops.BiasAddBackward: elementwise.bias_add_backward,
    ops.Dropout: elementwise.dropout,
    ops.Zeros: elementwise.zeros,
    ops.LocalResponseNorm: lrn.local_response_norm,
    ops.LocalResponseNormBackward: lrn.local_response_norm_backward,
    ops.Linear: linear.linear,
    ops.MatMul: linear.matmul,
    ops.Softmax: loss.softmax,
    ops.SoftmaxBackward: loss.softmax_backward,
    ops.LogSoftmax: loss.log_softmax,
    ops.LogSoftmaxBackward: loss.log_softmax_backward,
    ops.CrossEntropy: loss.cross_entropy,
    ops.CrossEntropyBackward: loss.cross_entropy_backward,
    ops.Flatten: tensor.flatten,
    ops.Reshape: tensor.reshape,
    ops.Concat: tensor.concat,
    ops.Slice: tensor.slice_,
    ops.SliceBackward: tensor.slice_backward,
    ops.Pad: tensor.pad,
    ops.PadBackward: tensor.pad_backward,
    # broadcasting, batch norm, global pooling, transpose, constants (ONNX import)
    ops.BroadcastAdd: broadcast.broadcast_add,
    ops.Mul: broadcast.mul,
    ops.SumTo: broadcast.sum_to,
    ops.BroadcastTo: broadcast.broadcast_to,
    ops.BatchNorm: norm.batch_norm,
    ops.BatchNormBackwardData: norm.batch_norm_backward_data,
    ops.BatchNormBackwardScale: norm.batch_norm_backward_scale,
    ops.GlobalAvgPool2d: norm.global_avg_pool2d,
    ops.GlobalAvgPool2dBackward: norm.global_avg_pool2d_backward,
    ops.Transpose: shape.transpose,
    ops.Constant: shape.constant,
    # modern convnets: activations, division, means, training-form batch norm, layer norm
    ops.Hardtanh: activation.hardtanh,
    ops.HardtanhBackward: activation.hardtanh_backward,
    ops.Hardsigmoid: activation.hardsigmoid,
    ops.HardsigmoidBackward: activation.hardsigmoid_backward,
    ops.Hardswish: activation.hardswish,
    ops.HardswishBackward: activation.hardswish_backward,
    ops.Sigmoid: activation.sigmoid,
    ops.SigmoidBackward: activation.sigmoid_backward,
    ops.Silu: activation.silu,
    ops.SiluBackward: activation.silu_backward,
    ops.Gelu: activation.gelu,
    ops.GeluBackward: activation.gelu_backward,
    ops.Div: arithmetic.div,
    ops.Neg: arithmetic.neg,
    ops.Mean: reduce.mean,
    ops.MeanBackward: reduce.mean_backward,
    ops.BatchNormStats: batchnorm_training.batch_norm_stats,
    ops.BatchNormTraining: batchnorm_training.batch_norm_training,
    ops.BatchNormTrainingBackwardData: batchnorm_training.batch_norm_training_backward_data,
    ops.BatchNormTrainingBackwardScale: batchnorm_training.batch_norm_training_backward_scale,
    ops.BatchNormTrainingDoubleBackward: batchnorm_training.batch_norm_training_double_backward,
    ops.BatchNormRunningUpdate: batchnorm_training.batch_norm_running_update,
    ops.LayerNorm: layer_norm.layer_norm,
    ops.LayerNormBackwardData: layer_norm.layer_norm_backward_data,
    ops.LayerNormBackwardScale: layer_norm.layer_norm_backward_scale,
    ops.LayerNormDoubleBackward: layer_norm.layer_norm_double_backward,
}


#: op type -> input positions its kernel may write its output into (``out=``;
#: ``Rule.inplace``): an element-wise op into an operand of its output's type.
INPLACE = {
    ops.Relu: 0,
    ops.ReluBackward: 1,  # into gy (input 0 is the ReLU's output, the mask)
    ops.Threshold: 0,
    ops.ThresholdBackward: 1,
    ops.Add: (0, 1),  # a gradient sum accumulates into either addend
    ops.BiasAdd: 0,  # into x, not the (C,) bias
}


def params_kernel(fn, prefix: str = "reference", options: tuple = ()):
    """Wrap ``fn(xp, *arrays, **params)`` as a rule kernel ``(ctx, op, *arrays)``:
    the op's fields are the function's keyword arguments (shared by every
    backend whose kernels follow that convention, e.g. ``cuda_rules``), plus
    those of ``options`` the kernel context sets (an autotune variant's
    choice, e.g. ``specialize``; unset ones keep ``fn``'s defaults). An
    ``out=`` array (an in-place step, ``Rule.inplace``) is passed on to
    ``fn``; the kernel is called without it otherwise."""

    def kernel(ctx, op, *arrays, out=None):
        chosen = {k: ctx.options[k] for k in options if k in ctx.options}
        if out is not None:
            chosen["out"] = out
        return fn(ctx.xp, *arrays, **op.params(), **chosen)

    kernel.__name__ = kernel.__qualname__ = f"{prefix}_{fn.__name__}"
    kernel.__doc__ = fn.__doc__
    return kernel


# Every reference kernel returns a new array, never a view of an input (each
# module's docstring says so): ``fresh_output``.
for _op_type, _fn in REFERENCE_KERNELS.items():
    register(Rule(_op_type, "reference", params_kernel(_fn), tags={"reference"},
                  inplace=INPLACE.get(_op_type), fresh_output=True))
