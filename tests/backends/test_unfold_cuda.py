"""The few-channel convolution on cuBLAS (``backends/cuda/unfold.py``) on the
CPU: its unfolding and clip kernels run through the g++ emulator of their
CUDA text, the cuBLAS product through a NumPy stand-in of ``gemm_ex_into``
(operands decoded from their storage bits, float64 sums, rounded once into
the output's storage, beta = 1 adding). Forward (no bias, bias, bias + ReLU
and ReLU6, NaN kept) and backward-filter against the float64 reference on the
stems of the benchmark models (11x11/4, 7x7/2, 3x3/2) and on asymmetric
padding, dilation and a non-square kernel with mixed stride, in every
storage dtype and with float32 storage computed in bf16; every autotune
variant and other chunkings agree; results are channels-last; the rule
declines what it does not take; the sources compile with nvcc where it is
installed. The product's argument mapping is tested on its own
(``test_cublas_matmul.py``); the GPU test (``tests/gpu/test_unfold_gpu.py``)
runs the whole on cuBLAS."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from cuda_cpu_emulator import GXX, NVCC, nvcc_check
from depthwise_emulated import assert_close, case_id, emu, forward_hw  # noqa: F401 (emu: a fixture)
from opgraph import ops
from opgraph.backends.cuda import storage, unfold
from opgraph.backends.cuda.cublas import gemm_ex_args
from opgraph.backends.reference import conv as ref_conv
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType, is_channels_last, numpy_dtype, to_layout

pytestmark = pytest.mark.skipif(GXX is None, reason="no g++: the kernel's CUDA text cannot run on the CPU")

#: (input (N, C, H, W), kernel, stride, padding ((top, bottom), (left, right)), dilation)
CASES = [
    ((2, 3, 27, 27), (11, 11), (4, 4), ((0, 0), (0, 0)), (1, 1)),  # OverFeat's conv1 (smaller image)
    ((2, 3, 16, 16), (7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1)),    # ResNet / GoogLeNet / DenseNet stem
    ((3, 3, 9, 10), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),     # MobileNet-v2 / EfficientNet-B0 stem
    ((1, 5, 10, 9), (3, 2), (2, 1), ((0, 1), (2, 0)), (2, 1)),     # asymmetric padding, dilation, C = 5
    ((2, 1, 8, 7), (3, 3), (1, 3), ((1, 1), (1, 1)), (1, 1)),      # one channel, mixed stride
    ((1, 3, 11, 12), (3, 3), (1, 2), ((2, 1), (2, 2)), (1, 2)),    # width dilation 2: the per-element path
    ((2, 2, 6, 7), (2, 2), (1, 1), ((0, 1), (1, 0)), (1, 1)),      # K = 8: the bias column opens a new block
    ((0, 3, 9, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),      # an empty batch
]

#: storage dtype, precision, tolerance against float64 (relative, Frobenius)
PAIRS = [("float32", "fp32", 1e-6), ("bfloat16", "bf16", 1e-2), ("float16", "fp16", 2e-3),
         ("float32", "bf16", 1e-2), ("float32", "tf32", 1e-6), ("bfloat16", "tf32", 1e-2), ("float16", "bf16", 1e-2)]
#: the stand-in computes tf32 as fp32 (cuBLAS's TF32 rounding is the GPU test's)


def _decode(a, storage: str):
    """Raw operand bits (uint16 of bfloat16 / float16, or float32) as float64."""
    if storage == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if storage == "float16":
        return a.view(np.float16).astype(np.float64)
    return a.astype(np.float64)


def _encode(values, storage: str):
    """float64 -> the raw storage bits (rounded once, to nearest even)."""
    if storage == "bfloat16":
        return values.astype(numpy_dtype("bfloat16")).view(np.uint16)
    if storage == "float16":
        return values.astype(np.float16).view(np.uint16)
    return values.astype(np.float32)


def _numpy_gemm_ex_into(xp, a, b, out, precision, *, transpose_a=False, transpose_b=False, accumulate=False):
    """``gemm_ex_into`` on NumPy arrays (module docstring)."""
    gemm_ex_args(a.shape, b.shape, transpose_a, transpose_b)  # the real call's shape checks
    storage = {"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32")
    av, bv = _decode(a, storage), _decode(b, storage)
    prod = (av.T if transpose_a else av) @ (bv.T if transpose_b else bv)
    out_storage = "float32" if out.dtype == np.float32 else storage
    if accumulate:
        prod = prod + _decode(out, out_storage)
    out[...] = _encode(prod, out_storage)


@pytest.fixture
def cublas(emu, monkeypatch):
    monkeypatch.setattr(unfold, "gemm_ex_into", _numpy_gemm_ex_into)
    return emu


def _operands(case, dtype, bias=True):
    shape, k, s, p, d = case
    n, c = shape[:2]
    o = 6
    rng = np.random.default_rng(sum(shape) + 7 * k[0] + k[1])
    x = rng.standard_normal(shape)
    w = rng.standard_normal((o, c, *k)) / np.sqrt(c * k[0] * k[1])
    b = rng.standard_normal(o) if bias else None
    gy = rng.standard_normal((n, o, *forward_hw(shape, k, s, p, d)))
    store = numpy_dtype(dtype)
    nhwc = lambda a: to_layout(np, a.astype(store), "NHWC")  # noqa: E731
    return nhwc(x), nhwc(w), None if b is None else b.astype(store), nhwc(gy)


def _reference_forward(case, x, w, b, activation):
    shape, k, s, p, d = case
    y = ref_conv.conv2d_forward(np, x.astype(np.float64), w.astype(np.float64), stride=s, padding=p, dilation=d)
    if b is not None:
        y = y + b.astype(np.float64).reshape(1, -1, 1, 1)
    lo, hi = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0)}[activation]
    return np.clip(y, lo, hi) if lo is not None else y


def _forward(case, x, w, b, precision, activation="none", **options):
    shape, k, s, p, d = case
    return unfold.conv2d_forward(np, x, w, b, stride=s, padding=p, dilation=d, groups=1, precision=precision,
                                 activation=activation, **options)


def _backward_filter(case, x, gy, o, precision, **options):
    shape, k, s, p, d = case
    return unfold.conv2d_backward_filter(np, x, gy, stride=s, padding=p, dilation=d, groups=1,
                                         weight_shape=(o, shape[1], *k), precision=precision, **options)


def _close(out, ref, dtype, tol):
    assert out.dtype == numpy_dtype(dtype) and out.shape == ref.shape
    if ref.size == 0 or not ref.any():
        assert not out.astype(np.float64).any()
        return
    err = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err < tol, err


@pytest.mark.parametrize("activation, bias", [("none", False), ("none", True), ("relu", True), ("relu6", True)])
@pytest.mark.parametrize("dtype, precision, tol", PAIRS, ids=lambda v: str(v))
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_matches_the_float64_reference(cublas, case, dtype, precision, tol, activation, bias):
    x, w, b, _ = _operands(case, dtype, bias)
    y = _forward(case, x, w, b, precision, activation)
    _close(y, _reference_forward(case, x, w, b, activation), dtype, tol)
    assert is_channels_last(y) or y.shape[0] == 0


@pytest.mark.parametrize("dtype, precision, tol", PAIRS, ids=lambda v: str(v))
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_backward_filter_matches_the_float64_reference(cublas, case, dtype, precision, tol):
    shape, k, s, p, d = case
    x, w, _, gy = _operands(case, dtype)
    dw = _backward_filter(case, x, gy, w.shape[0], precision)
    ref = ref_conv.conv2d_backward_filter(np, x.astype(np.float64), gy.astype(np.float64), stride=s, padding=p,
                                          dilation=d, weight_shape=w.shape)
    _close(dw, ref, dtype, tol)
    # cuDNN's channels-last filter: (O, kH, kW, C) in memory
    assert dw.transpose(0, 2, 3, 1).flags.c_contiguous


@pytest.mark.parametrize("options", [dict(chunks=4), dict(chunks=16), dict(chunks=1000), dict(chunks=3)],
                         ids=lambda o: f"chunks{o['chunks']}")
@pytest.mark.parametrize("dtype, precision", [("bfloat16", "bf16"), ("float32", "fp32")])
def test_pieces_give_the_same_result(cublas, dtype, precision, options):
    """Forward pieces write disjoint rows: the same bits; backward-filter sums
    the pieces' products in fp32: the same to rounding, each against the reference."""
    case = CASES[1]
    shape, k, s, p, d = case
    x, w, b, gy = _operands(case, dtype)
    whole = _forward(case, x, w, b, precision, "relu")
    _close(whole, _reference_forward(case, x, w, b, "relu"), dtype, 1e-2 if dtype == "bfloat16" else 1e-6)
    assert _forward(case, x, w, b, precision, "relu", **options).tobytes() == whole.tobytes()
    dw = _backward_filter(case, x, gy, w.shape[0], precision, **options)
    ref = ref_conv.conv2d_backward_filter(np, x.astype(np.float64), gy.astype(np.float64), stride=s, padding=p,
                                          dilation=d, weight_shape=w.shape)
    _close(dw, ref, dtype, 1e-2 if dtype == "bfloat16" else 1e-6)


@pytest.mark.parametrize("dtype, precision", [("bfloat16", "bf16"), ("float32", "fp32")])
def test_the_64_bit_index_path_matches_the_reference(cublas, monkeypatch, dtype, precision):
    """Sources with 64-bit indices (taken from 2^31 elements on) compute the same."""
    monkeypatch.setattr(unfold, "_INT32_LIMIT", 1)
    case = CASES[1]
    shape, k, s, p, d = case
    x, w, b, gy = _operands(case, dtype)
    _close(_forward(case, x, w, b, precision, "relu"), _reference_forward(case, x, w, b, "relu"), dtype, 1e-2)
    ref = ref_conv.conv2d_backward_filter(np, x.astype(np.float64), gy.astype(np.float64), stride=s, padding=p,
                                          dilation=d, weight_shape=w.shape)
    _close(_backward_filter(case, x, gy, w.shape[0], precision), ref, dtype, 1e-2)
    assert all("_i64_" in run["name"] for run in cublas.raw_launches if run["name"].startswith("opgraph_unfold_b"))


@pytest.mark.parametrize("direction, dtype, precision", [("forward", "bfloat16", "bf16"), ("forward", "bfloat16", "tf32"),
                                                         ("backward_filter", "float32", "bf16"),
                                                         ("forward", "float32", "fp32")])
@pytest.mark.parametrize("chunks", [1, 4])
def test_the_workspace_counts_what_a_call_allocates(cublas, monkeypatch, direction, dtype, precision, chunks):
    """The rule's workspace against the bytes of every array the call allocates
    (NumPy's allocators wrapped, counting the calls made from ``unfold.py`` and
    the storage conversions it calls, not the emulator's own copies), less the
    result it returns."""
    case = CASES[1]
    shape, k, s, p, d = case
    x, w, b, gy = _operands(case, dtype)
    allocated = []
    ours = (unfold.__file__, storage.__file__)

    def counting(fn):
        def wrapped(*args, **kwargs):
            a = fn(*args, **kwargs)
            fresh = not (args and isinstance(args[0], np.ndarray) and np.may_share_memory(a, args[0]))
            if fresh and sys._getframe(1).f_code.co_filename in ours:  # not ascontiguousarray's no-op
                allocated.append(a.nbytes)
            return a
        return wrapped
    for name in ("empty", "zeros", "empty_like", "ascontiguousarray"):
        monkeypatch.setattr(np, name, counting(getattr(np, name)))
    params = dict(stride=s, padding=p, dilation=d, groups=1)
    if direction == "forward":
        op, types = ops.Conv2dBiasRelu(**params), (x, w, b)
        out = _forward(case, x, w, b, precision, "relu", chunks=chunks)
    else:
        op, types = ops.Conv2dBackwardFilter(**params, weight_shape=w.shape), (x, gy)
        out = _backward_filter(case, x, gy, w.shape[0], precision, chunks=chunks)
    monkeypatch.undo()
    in_types = tuple(TensorType(a.shape, dtype, "NHWC" if a.ndim == 4 else None) for a in types)
    claimed = rules_for(type(op))["unfold"].workspace(op, in_types, {"precision": precision, "chunks": chunks})
    scratch = sum(allocated) - out.nbytes
    # less the weights' and bias's conversions, which the count leaves out (a few KB on a stem)
    assert 0 <= scratch - claimed <= 2 * (w.size + b.size) * 4, (claimed, scratch, allocated)


@pytest.mark.parametrize("activation", ["relu", "relu6"])
@pytest.mark.parametrize("dtype, precision", [("bfloat16", "bf16"), ("float32", "fp32"), ("float16", "fp16")])
def test_the_activation_keeps_nan(cublas, dtype, precision, activation):
    """SEMANTICS.md: ReLU and ReLU6 propagate NaN (a clip by comparisons keeps it)."""
    case = CASES[2]
    x, w, b, _ = _operands(case, dtype)
    x = x.copy()
    x[0, 1, 4, 4] = np.nan
    y = _forward(case, x, w, b, precision, activation).astype(np.float64)
    ref = _reference_forward(case, x, w, b, activation)
    assert np.isnan(ref).any()
    assert np.array_equal(np.isnan(y), np.isnan(ref))


def test_nchw_operands_are_copied(cublas):
    case = CASES[2]
    x, w, b, gy = _operands(case, "float32")
    y = _forward(case, np.ascontiguousarray(x), np.ascontiguousarray(w), b, "fp32", "relu")
    _close(y, _reference_forward(case, x, w, b, "relu"), "float32", 1e-6)


def test_the_rules_run_their_variants(cublas):
    """Each registered kernel (Conv2d, Conv2dBiasRelu, Conv2dBiasActivation with ReLU6,
    backward-filter), every variant, against the reference."""
    case = CASES[1]
    shape, k, s, p, d = case
    x, w, b, gy = _operands(case, "bfloat16")
    t = lambda a, layout="NHWC": TensorType(a.shape, "bfloat16", layout)  # noqa: E731
    params = dict(stride=s, padding=p, dilation=d, groups=1)
    forward = [(ops.Conv2d(**params), (x, w), "none", None),
               (ops.Conv2dBiasRelu(**params), (x, w, b), "relu", b),
               (ops.Conv2dBiasActivation(**params, activation="relu6"), (x, w, b), "relu6", b)]
    for op, arrays, activation, bias in forward:
        rule = rules_for(type(op))["unfold"]
        types = tuple(t(a, "NHWC" if a.ndim == 4 else None) for a in arrays)
        assert rule.check(op, types, "cuda") is None, type(op).__name__
        ref = _reference_forward(case, x, w, bias, activation)
        for options in rule.variants(op, types, "cuda"):
            out = rule.kernel(KernelContext(np, "cuda", {**options, "precision": "bf16"}), op, *arrays)
            _close(out, ref, "bfloat16", 1e-2)
    op = ops.Conv2dBackwardFilter(**params, weight_shape=w.shape)
    rule = rules_for(ops.Conv2dBackwardFilter)["unfold"]
    types = (t(x), t(gy))
    assert rule.check(op, types, "cuda") is None
    ref = ref_conv.conv2d_backward_filter(np, x.astype(np.float64), gy.astype(np.float64), **params,
                                          weight_shape=w.shape)
    for options in rule.variants(op, types, "cuda"):
        _close(rule.kernel(KernelContext(np, "cuda", {**options, "precision": "bf16"}), op, x, gy), ref,
               "bfloat16", 1e-2)
    from opgraph.passes.autotune import candidate_set
    assert f"unfold:variants@{unfold.REVISION}" in candidate_set([(rule, {})])


def _types(shape, weight, dtype="bfloat16", layout="NHWC"):
    return TensorType(shape, dtype, layout), TensorType(weight, dtype, layout)


@pytest.mark.parametrize("why, op, types", [
    ("16-byte rows", ops.Conv2d(stride=2, padding=1), _types((2, 8, 9, 9), (4, 8, 3, 3))),
    ("16-byte rows", ops.Conv2d(stride=2, padding=1), _types((2, 4, 9, 9), (4, 4, 3, 3), "float32")),
    ("groups=1", ops.Conv2d(stride=1, padding=1, groups=3), _types((2, 3, 9, 9), (3, 1, 3, 3))),
    ("channels-last", ops.Conv2d(stride=1, padding=1), _types((2, 3, 9, 9), (4, 3, 3, 3), layout="NCHW")),
    ("one dtype of", ops.Conv2d(stride=1, padding=1), _types((2, 3, 9, 9), (4, 3, 3, 3), "float64")),
    ("beyond the rule's", ops.Conv2d(stride=1, padding=0), _types((1, 7, 40, 40), (4, 7, 13, 13))),
])
def test_the_rule_declines(why, op, types):
    reason = rules_for(type(op))["unfold"].check(op, types, "cuda")
    assert reason is not None and why in reason


def test_the_rule_declines_a_residual_epilogue():
    op = ops.Conv2dBiasActivation(stride=1, padding=1, activation="relu", residual=True)
    x, w = _types((2, 3, 9, 9), (4, 3, 3, 3))
    types = (x, w, TensorType((4,), "bfloat16"), TensorType((2, 4, 9, 9), "bfloat16", "NHWC"))
    assert "residual" in rules_for(type(op))["unfold"].check(op, types, "cuda")


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_sources_compile_with_nvcc(cublas):
    for case in CASES[:3]:
        x, w, b, gy = _operands(case, "bfloat16")
        _forward(case, x, w, b, "bf16", "relu6")
    nvcc_check(cublas.cuda_sources)
