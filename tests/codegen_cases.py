"""Cases of the generated memory-bound kernels, shared by the CPU emulator tests
(tests/backends/test_codegen_*.py) and the GPU tests (tests/gpu/test_codegen_gpu.py):
every op type of the expression table with inputs of each kind, and fused
programs built by hand, each with the float64 reference to compare against.

An input kind names how an operand is made for an iteration shape
``(N, C, H, W)``: ``x`` (full, standard normal, in the case's layout), ``c``
(a ``(C,)`` vector), ``var`` (a positive ``(C,)`` vector), ``stats`` (the
``(2, C)`` mean and variance, float32 for half storage), ``sums`` (the
``(2, C)`` per-channel sums of the batch norm's backward, likewise), ``plane``
(``(N, C, 1, 1)``), ``nc`` (``(N, C)``), ``bias4`` (``(1, C, 1, 1)``), ``mask``
(``(N, 1, 1, 1)``: one factor per sample, as a stochastic-depth mask), ``last``
(``(W,)``) and ``hw`` (``(H, W)``): a trailing block of the shape, as a Linear's
bias on channels-last activations (a packed column operand in C order, strided
in a channels-last iteration).
"""

from __future__ import annotations

import attrs
import numpy as np

from opgraph import ops
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.ops.batchnorm_training import stats_dtype
from opgraph.op import Op
from opgraph.ops.fused import FusedElementwise, FusedStep, Program
from opgraph.types import TensorType, numpy_dtype

#: iteration shape per layout: C a multiple of 8 (channels-last vectors and
#: hoisted channels), H*W a multiple of 8 in the NCHW one (uniform vectors).
SHAPES = {"NCHW": (2, 24, 4, 8), "NHWC": (3, 16, 5, 7)}
#: shapes on the slow paths: no vector divides C or H*W (per-lane indices, tails).
ODD_SHAPE = (2, 5, 3, 7)

TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 1e-2, "float16": 1e-2}


@attrs.frozen
class Case:
    """An op (or ``op(shape)`` for one whose fields depend on the shape) and its input kinds."""

    id: str
    op: object
    kinds: tuple
    exact: bool = False  # a select or a copy: equal to the reference on the stored inputs

    def make(self, shape):
        return self.op if isinstance(self.op, Op) else self.op(tuple(shape))


def _f(op, *kinds, exact=False, name=None):
    return Case(name or op.describe(), op, kinds, exact)


def _count(shape):
    return int(np.prod(shape)) // shape[1]


CASES = [
    _f(ops.Relu(), "x", exact=True), _f(ops.ReluBackward(), "x", "x", exact=True),
    _f(ops.Threshold(threshold=0.25, value=-1.0), "x"), _f(ops.ThresholdBackward(threshold=0.25), "x", "x"),
    _f(ops.Hardtanh(min_val=0.0, max_val=6.0), "x", exact=True),
    _f(ops.HardtanhBackward(min_val=0.0, max_val=6.0), "x", "x", exact=True),
    _f(ops.Hardsigmoid(), "x"), _f(ops.HardsigmoidBackward(), "x", "x"),
    _f(ops.Hardswish(), "x"), _f(ops.HardswishBackward(), "x", "x"), _f(ops.HardswishBackward(order=2), "x", "x"),
    _f(ops.Sigmoid(), "x"), _f(ops.SigmoidBackward(), "x", "x"), _f(ops.SigmoidBackward(order=2), "x", "x"),
    _f(ops.Silu(), "x"), _f(ops.SiluBackward(), "x", "x"), _f(ops.SiluBackward(order=2), "x", "x"),
    _f(ops.Gelu(), "x"), _f(ops.Gelu(approximate="tanh"), "x"), _f(ops.GeluBackward(), "x", "x"),
    _f(ops.GeluBackward(approximate="tanh", order=2), "x", "x"),
    _f(ops.Add(), "x", "x"), _f(ops.BroadcastAdd(), "x", "bias4"), _f(ops.Mul(), "x", "plane"),
    _f(ops.BroadcastAdd(), "x", "last", name="BroadcastAdd(trailing W)"),
    _f(ops.Mul(), "hw", "x", name="Mul(trailing HW)"),
    _f(ops.Div(), "x", "var4"), _f(ops.Neg(), "x", exact=True), _f(ops.BiasAdd(), "x", "c"),
    _f(ops.Dropout(p=0.3, training=True, seed=11), "x"), _f(ops.Dropout(p=1.0, training=True), "x", exact=True),
    _f(ops.BiasAddBackward(), "x"), _f(ops.Mean(axes=(0, 2, 3), keepdim=False), "x"),
    _f(ops.Mean(axes=(2, 3), keepdim=True), "x"), _f(ops.GlobalAvgPool2d(), "x"),
    _f(lambda s: ops.MeanBackward(axes=(2, 3), keepdim=False, input_shape=s), "nc", name="MeanBackward"),
    _f(lambda s: ops.GlobalAvgPool2dBackward(input_shape=s), "plane", name="GlobalAvgPool2dBackward"),
    _f(lambda s: ops.AvgPool2d(kernel_size=s[2:], stride=(1, 1)), "x", name="AvgPool2d(whole plane)"),
    _f(lambda s: ops.AvgPool2dBackward(kernel_size=s[2:], stride=(1, 1), input_shape=s), "plane",
       name="AvgPool2dBackward(whole plane)"),
    _f(lambda s: ops.AvgPool2d(kernel_size=s[2:], stride=(3, 2), ceil_mode=True, count_include_pad=False), "x",
       name="AvgPool2d(whole plane, stride 3x2, ceil_mode, count_include_pad=False)"),
    _f(lambda s: ops.AvgPool2dBackward(kernel_size=s[2:], stride=(3, 2), ceil_mode=True, count_include_pad=False,
                                       input_shape=s), "plane",
       name="AvgPool2dBackward(whole plane, stride 3x2, ceil_mode, count_include_pad=False)"),
    _f(lambda s: ops.SumTo(shape=(s[0], s[1], 1, 1)), "x", name="SumTo(plane)"),
    _f(lambda s: ops.SumTo(shape=(1, s[1], 1, 1)), "x", name="SumTo(channel)"),
    _f(lambda s: ops.BroadcastTo(shape=s), "c4", exact=True, name="BroadcastTo"),
    _f(ops.BatchNorm(), "x", "c", "c", "c", "var"), _f(ops.BatchNormBackwardData(), "x", "c", "var"),
    _f(ops.BatchNormBackwardScale(), "x", "c", "var", "x"),
    _f(ops.BatchNormStats(), "x"), _f(ops.BatchNormTraining(), "x", "stats", "c", "c"),
    _f(ops.BatchNormTraining(eps=1e-3), "x", "stats"),
    _f(ops.BatchNormTrainingBackwardData(), "x", "x", "stats", "c"),
    _f(ops.BatchNormTrainingBackwardScale(), "x", "stats", "x"),
    _f(ops.BatchNormTrainingBackwardSums(), "x", "stats", "x"),
    _f(ops.BatchNormBackwardSumsRow(row=0), "sums", "x"), _f(ops.BatchNormBackwardSumsRow(row=1), "sums", "x"),
    _f(ops.BatchNormTrainingBackwardDataFromSums(), "x", "x", "stats", "sums", "c"),
    _f(ops.BatchNormTrainingBackwardDataFromSums(eps=1e-3), "x", "x", "stats", "sums",
       name="BatchNormTrainingBackwardDataFromSums(no weight)"),
    _f(lambda s: ops.BatchNormRunningUpdate(statistic="var", momentum=0.1, count=_count(s)), "stats", "var",
       name="BatchNormRunningUpdate"),
    _f(ops.Mul(), "x", "mask", name="Mul(per-sample)"),
]


def channels_last(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def make_input(rng, kind: str, shape, dtype: str, layout: str):
    """One operand of ``kind`` (module docstring) in storage ``dtype`` (a host array)."""
    n, c = shape[:2]
    dt = numpy_dtype(dtype)
    if kind == "x":
        a = rng.standard_normal(shape).astype(dt)
        return channels_last(a) if layout == "NHWC" and len(shape) == 4 else a
    if kind == "stats":
        return np.stack([rng.standard_normal(c), rng.uniform(0.5, 2.0, c)]).astype(numpy_dtype(stats_dtype(dtype)))
    if kind == "sums":  # sum(gy) and sum(gy * xhat) over n values: of order sqrt(n)
        return (np.sqrt(n * np.prod(shape[2:])) * rng.standard_normal((2, c))).astype(numpy_dtype(stats_dtype(dtype)))
    made = {"c": lambda: rng.standard_normal(c), "var": lambda: rng.uniform(0.5, 2.0, c),
            "plane": lambda: rng.standard_normal((n, c, 1, 1)), "nc": lambda: rng.standard_normal((n, c)),
            "bias4": lambda: rng.standard_normal((1, c, 1, 1)), "var4": lambda: rng.uniform(0.5, 2, (1, c, 1, 1)),
            "mask": lambda: rng.standard_normal((n, 1, 1, 1)),
            "last": lambda: rng.standard_normal(shape[-1:]), "hw": lambda: rng.standard_normal(shape[-2:]),
            "c4": lambda: rng.standard_normal((c, 1, 1))}[kind]
    return made().astype(dt)


def type_of(a, layout: str) -> TensorType:
    lay = layout if a.ndim == 4 and a.shape[2:] != (1, 1) else None
    return TensorType(a.shape, a.dtype.name, lay)


def out_type(op, arrays, layout: str) -> TensorType:
    """The node's output type, stored in ``layout`` when it is a full-size 4-D value."""
    t = op.infer(*(type_of(a, layout) for a in arrays))
    full = max((a.shape for a in arrays if a.ndim == 4), default=None, key=np.prod)
    return attrs.evolve(t, layout=layout if t.ndim == 4 and t.shape == full and t.shape[2:] != (1, 1) else None)


def reference(op, arrays):
    """The op's reference kernel on float64 copies of ``arrays`` (host NumPy)."""
    kernel = rules_for(type(op))["reference"].kernel
    return np.asarray(kernel(KernelContext(np), op, *(np.asarray(a).astype(np.float64) for a in arrays)))


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if np.isnan(out).any() != np.isnan(ref).any():
        return float("inf")
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (den if den else 1.0))


# ------------------------------------------------------------------ fused programs

def program(steps, n_inputs, outputs):
    return FusedElementwise(Program(n_inputs, tuple(FusedStep(op, args) for op, args in steps), outputs))


def fused_cases():
    """``[(id, op, kinds)]``: hand-built chains the fusion pass will make."""
    return [
        ("bn_relu", program([(ops.BatchNormTraining(), (0, 1, 2, 3)), (ops.Relu(), (4,))], 4, 5),
         ("x", "stats", "c", "c")),
        ("stats_bn_relu", program([(ops.BatchNormStats(), (0,)), (ops.BatchNormTraining(), (0, 3, 1, 2)),
                                   (ops.Relu(), (4,))], 3, 5), ("x", "c", "c")),
        ("relu_bwd_bias_grad", program([(ops.ReluBackward(), (0, 1)), (ops.BiasAddBackward(), (2,))], 2, 3),
         ("x", "x")),
        ("silu_se_scale", program([(ops.Silu(), (0,)), (ops.Mean(axes=(2, 3), keepdim=True), (1,)),
                                   (ops.Sigmoid(), (2,)), (ops.Mul(), (1, 3))], 1, 4), ("x",)),
        ("grad_sum_3", program([(ops.Add(), (0, 1)), (ops.Add(), (3, 2))], 3, 4), ("x", "x", "x")),
        ("bn_backward_sums", program([(ops.ReluBackward(), (0, 1)), (ops.BiasAddBackward(), (4,)),
                                      (ops.BatchNormTrainingBackwardScale(), (2, 3, 4))], 4, (5, 6)),
         ("x", "x", "x", "stats")),
        ("relu_bwd_bn_backward_data", program([(ops.ReluBackward(), (0, 1)),
                                               (ops.BatchNormTrainingBackwardData(), (4, 2, 3))], 4, 5),
         ("x", "x", "x", "stats")),
        # an MBConv residual with stochastic depth (benchmarks/models/common.py):
        # x + mask * BN(h), the mask one factor per sample
        ("stochastic_depth_residual", program([(ops.BatchNormTraining(), (0, 1, 2, 3)), (ops.Mul(), (6, 4)),
                                               (ops.Add(), (7, 5))], 6, 8), ("x", "stats", "c", "c", "mask", "x")),
        # ConvNeXt's first Linear: its bias add recomputed in the GELU's gradient (bias-remat), and a
        # per-channel sum after a trailing-axis bias (a split program reducing over other axes)
        ("bias_gelu_backward", program([(ops.BroadcastAdd(), (0, 1)), (ops.GeluBackward(), (3, 2))], 3, 4),
         ("x", "last", "x")),
        ("bias_relu_channel_sums", program([(ops.BroadcastAdd(), (0, 1)), (ops.Relu(), (2,)),
                                            (ops.BiasAddBackward(), (3,))], 2, 4), ("x", "last")),
        # a full-size output whose program also reduces to planes (a squeeze-and-excitation scale)
        ("bias_se_scale", program([(ops.BroadcastAdd(), (0, 1)), (ops.Mean(axes=(2, 3), keepdim=True), (2,)),
                                   (ops.Sigmoid(), (3,)), (ops.Mul(), (2, 4))], 2, 5), ("x", "last")),
    ]


__all__ = ["SHAPES", "ODD_SHAPE", "TOLERANCE", "Case", "CASES", "channels_last", "make_input",
           "type_of", "out_type", "reference", "rel_err", "program", "fused_cases"]
