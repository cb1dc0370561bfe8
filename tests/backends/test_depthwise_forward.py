"""The stride-1 depthwise forward kernel (``backends/cuda/depthwise_forward.py``) on the
CPU, through the g++ emulator of its CUDA text: against the float64 reference
(``conv2d_forward`` plus the bias) on ConvNeXt's 7x7 and the 3x3 and 5x5 of the
mobile networks, asymmetric padding, padding past the kernel's reach, dilation
and non-square kernels, in every storage dtype, with and without a bias, on the
vector and the scalar path, with every autotune variant (bit for bit the
default's result); the sources compile with nvcc where it is installed; and the
``cuda`` rule of ``Conv2d`` declines what it does not take, strides above 1
included."""

from __future__ import annotations

import numpy as np
import pytest

from cuda_cpu_emulator import GXX, NVCC, nvcc_check
from depthwise_emulated import DTYPES, assert_close, emu, lanes_run  # noqa: F401 (emu: a fixture)
from opgraph import ops
from opgraph.backends.cuda import depthwise, depthwise_forward
from opgraph.backends.reference import conv as ref_conv
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.errors import ShapeError
from opgraph.types import TensorType, is_channels_last, numpy_dtype, to_layout

pytestmark = pytest.mark.skipif(GXX is None, reason="no g++: the kernel's CUDA text cannot run on the CPU")

#: (input (N, C, H, W), kernel, padding ((top, bottom), (left, right)), dilation)
CASES = [
    ((2, 16, 9, 9), (7, 7), ((3, 3), (3, 3)), (1, 1)),      # ConvNeXt's depthwise 7x7
    ((2, 16, 9, 9), (3, 3), ((1, 1), (1, 1)), (1, 1)),      # MobileNet-v2's stride-1 3x3
    ((1, 24, 11, 9), (5, 5), ((2, 2), (2, 2)), (1, 1)),     # EfficientNet-B0's stride-1 5x5
    ((1, 8, 8, 7), (3, 3), ((0, 1), (2, 0)), (1, 1)),       # asymmetric padding
    ((1, 8, 6, 6), (3, 3), ((3, 0), (0, 4)), (1, 1)),       # padding past the kernel's reach (outputs of bias only)
    ((1, 8, 9, 9), (3, 3), ((2, 2), (2, 2)), (2, 2)),       # dilation
    ((1, 8, 9, 10), (3, 2), ((1, 2), (0, 1)), (2, 3)),      # non-square kernel, mixed dilation
    ((1, 8, 3, 3), (3, 3), ((0, 0), (0, 0)), (1, 1)),       # no padding: a 1 x 1 output
    ((0, 8, 5, 5), (3, 3), ((1, 1), (1, 1)), (1, 1)),       # an empty batch
    ((2, 1, 4, 4), (3, 3), ((1, 1), (1, 1)), (1, 1)),       # one channel: the layouts coincide
]

#: the vector and scalar paths (C a multiple of every dtype's V or not; widths that are and are not
#: multiples of the 4-pixel strip)
PATH_CASES = [
    ((3, 16, 12, 12), (7, 7), ((3, 3), (3, 3)), (1, 1)),
    ((2, 32, 10, 11), (5, 5), ((2, 2), (2, 2)), (1, 1)),
    ((2, 12, 9, 10), (3, 3), ((1, 1), (1, 1)), (1, 1)),
    ((2, 6, 10, 9), (3, 3), ((1, 1), (1, 1)), (1, 1)),
    ((2, 3, 9, 9), (7, 7), ((3, 3), (3, 3)), (1, 1)),
]

OPTIONS = [dict(rows=4), dict(pixels=8, rows=4), dict(pixels=1), dict(pixels=2, rows=3), dict(pixels=8)]


def case_id(c) -> str:
    return f"{c[0]}-k{c[1][0]}x{c[1][1]}-p{c[2]}-d{c[3]}"


def _operands(case, dtype, bias=True):
    shape, k, p, d = case
    c = shape[1]
    rng = np.random.default_rng(sum(shape) + k[0])
    store = numpy_dtype(dtype)
    x = to_layout(np, rng.standard_normal(shape).astype(store), "NHWC")
    w = to_layout(np, rng.standard_normal((c, 1, *k)).astype(store), "NHWC")
    return x, w, (rng.standard_normal(c).astype(store) if bias else None)


def _run(case, x, w, b, **options):
    shape, k, p, d = case
    return depthwise_forward.conv2d(np, x, w, b, stride=(1, 1), padding=p, dilation=d, groups=shape[1], **options)


def _check(case, dtype, x, w, b, out):
    shape, k, p, d = case
    ref = ref_conv.conv2d_forward(np, x.astype(np.float64), w.astype(np.float64), stride=(1, 1), padding=p,
                                  dilation=d, groups=shape[1])
    if b is not None:
        ref = ref + b.astype(np.float64)[None, :, None, None]
    assert out.shape == ref.shape and out.dtype == numpy_dtype(dtype)
    assert is_channels_last(out) or 0 in out.shape or shape[1] == 1 or out.shape[2:] == (1, 1)  # ambiguous
    if ref.size and np.linalg.norm(ref):
        assert_close(out, ref, dtype)
    else:
        assert not np.any(out)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_the_float64_reference(emu, case, dtype, bias):
    x, w, b = _operands(case, dtype, bias)
    _check(case, dtype, x, w, b, _run(case, x, w, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PATH_CASES, ids=case_id)
def test_vector_and_scalar_paths_match_the_reference(emu, case, dtype):
    x, w, b = _operands(case, dtype)
    _check(case, dtype, x, w, b, _run(case, x, w, b))
    v = depthwise.lanes(dtype)
    assert lanes_run(emu, "opgraph_dw_fprop_bias_") == {v if case[0][1] % v == 0 else 1}


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
@pytest.mark.parametrize("dtype, case", [("bfloat16", PATH_CASES[0]), ("float32", PATH_CASES[1]),
                                         ("float16", CASES[3]), ("float64", CASES[6]), ("bfloat16", CASES[4])],
                         ids=lambda x: x if isinstance(x, str) else case_id(x))
def test_every_variant_is_bit_for_bit_the_default(emu, dtype, case, options):
    x, w, b = _operands(case, dtype)
    want = _run(case, x, w, b)
    got = _run(case, x, w, b, **options)
    _check(case, dtype, x, w, b, got)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def test_an_unaligned_input_takes_the_scalar_path(emu):
    case = PATH_CASES[0]
    x, w, b = _operands(case, "bfloat16")
    n, c, h, wd = x.shape
    flat = np.empty(x.size + 1, dtype=x.dtype)  # x one element into its buffer: 2 bytes off 16
    nhwc = flat[1:].reshape(n, h, wd, c)
    nhwc[...] = x.transpose(0, 2, 3, 1)
    shifted = nhwc.transpose(0, 3, 1, 2)
    assert shifted.__array_interface__["data"][0] % 16 != 0
    _check(case, "bfloat16", shifted, w, b, _run(case, shifted, w, b))
    assert lanes_run(emu, "opgraph_dw_fprop_bias_") == {1}


def test_the_rule_runs_its_variants_on_a_node_with_a_bias(emu):
    rule = rules_for(ops.Conv2d)["cuda"]
    case = PATH_CASES[0]
    shape, k, p, d = case
    op = ops.Conv2d(padding=p, dilation=d, groups=shape[1])
    x, w, b = _operands(case, "bfloat16")
    types = (TensorType(x.shape, "bfloat16", "NHWC"), TensorType(w.shape, "bfloat16", "NHWC"),
             TensorType(b.shape, "bfloat16"))
    assert rule.check(op, types, "cuda") is None
    outs = [rule.kernel(KernelContext(np, "cuda", options), op, x, w, b)
            for options in rule.variants(op, types, "cuda")]
    assert len(outs) == 3
    for out in outs:
        _check(case, "bfloat16", x, w, b, out)
    from opgraph.passes.autotune import candidate_set
    assert f"cuda:variants@{depthwise_forward.REVISION}" in candidate_set([(rule, {})])


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_the_sources_compile_with_nvcc():
    sources = []
    for dtype in DTYPES:
        for shape, k, p, d in (CASES[0], CASES[6]):
            out = depthwise_forward.forward_shape(shape, (shape[1], 1, *k), p, d)
            mirrored = ((k[0] - 1) * d[0] - p[0][0], (k[1] - 1) * d[1] - p[1][0])
            geo = (shape[1], *out[2:], *shape[2:], *k, 1, 1, *mirrored, *d)
            for v, pixels, rows, wide in ((depthwise.lanes(dtype), 4, 1, False), (1, 8, 4, True)):
                sources.append(depthwise._source(dtype, geo, v, pixels, rows, wide, True, True)[2])
    nvcc_check(sources)


def test_the_rule_declines_what_it_does_not_take():
    rule = rules_for(ops.Conv2d)["cuda"]
    dw = ops.Conv2d(padding=((3, 3), (3, 3)), groups=16)
    x, w = TensorType((2, 16, 9, 9), "bfloat16", "NHWC"), TensorType((16, 1, 7, 7), "bfloat16", "NHWC")
    assert rule.check(dw, (x, w), "cuda") is None
    strided = ops.Conv2d(stride=(2, 2), padding=((1, 1), (1, 1)), groups=16)
    assert "stride (2, 2)" in rule.check(strided, (x, TensorType((16, 1, 3, 3), "bfloat16", "NHWC")), "cuda")
    assert "channels-last" in rule.check(dw, (TensorType((2, 16, 9, 9), "bfloat16"), w), "cuda")
    assert "the input is" in rule.check(dw, (TensorType((2, 16, 9, 9), "bfloat16"), w), "cuda")
    dense = ops.Conv2d(padding=((1, 1), (1, 1)))
    assert "not a depthwise convolution of multiplier 1 (groups=1, input channels 16, weight (8, 16, 3, 3))" in \
        rule.check(dense, (TensorType((2, 16, 5, 5), "float32", "NHWC"), TensorType((8, 16, 3, 3))), "cuda")
    assert "one dtype" in rule.check(dw, (x, TensorType((16, 1, 7, 7), "float32", "NHWC")), "cuda")
    assert "bias float32" in rule.check(dw, (x, w, TensorType((16,), "float32")), "cuda")
    grouped = ops.Conv2d(padding=((1, 1), (1, 1)), groups=8)
    assert "multiplier 1" in rule.check(grouped, (TensorType((2, 16, 5, 5), "float32", "NHWC"),
                                                  TensorType((32, 2, 3, 3))), "cuda")


def test_its_tag_turns_off_this_rule_alone():
    from opgraph.passes.policy import LoweringPolicy
    policy = LoweringPolicy(exclude=["depthwise-fprop"])
    forward = rules_for(ops.Conv2d)["cuda"]
    assert "depthwise-fprop" in (policy.exclusion(forward.algorithm, forward.tags) or "")
    for op_type in (ops.Conv2dBackwardData, ops.Conv2dBackwardFilter):
        other = rules_for(op_type)["cuda"]
        assert policy.exclusion(other.algorithm, other.tags) is None


def test_the_rule_declines_a_padded_input_beyond_32_bit_indices_naming_the_callers_padding():
    rule = rules_for(ops.Conv2d)["cuda"]
    far = ops.Conv2d(padding=((2 ** 31 + 5, 0), (1, 1)), groups=8)
    why = rule.check(far, (TensorType((1, 8, 5, 5), "float32", "NHWC"), TensorType((8, 1, 3, 3), "float32", "NHWC")),
                     "cuda")
    assert why == f"padding (({2 ** 31 + 5}, 0), (1, 1)) and dilation (1, 1) reach beyond 32-bit tap arithmetic"


def test_the_kernel_refuses_a_strided_call_and_mixed_dtypes():
    x = np.zeros((1, 8, 5, 5), np.float32)
    w = np.zeros((8, 1, 3, 3), np.float32)
    with pytest.raises(ShapeError, match=r"depthwise conv2d: stride \(2, 2\)"):
        depthwise_forward.conv2d(np, x, w, stride=(2, 2), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=8)
    kw = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=8)
    with pytest.raises(ShapeError, match="input float32, weight float32 and bias float64 differ"):
        depthwise_forward.conv2d(np, x, w, np.zeros(8), **kw)
    with pytest.raises(ShapeError, match="input float32 and weight float64 differ"):
        depthwise_forward.conv2d(np, x, w.astype(np.float64), **kw)
    with pytest.raises(ShapeError, match=r"bias shape \(2,\) != \(channels,\) = \(8,\)"):
        depthwise_forward.conv2d(np, x, w, np.zeros(2, np.float32), **kw)
    with pytest.raises(ShapeError, match=r"the dilated kernel 7x7 \(dilation \(1, 1\)\) is larger than the padded"):
        depthwise_forward.conv2d(np, x, np.zeros((8, 1, 7, 7), np.float32), stride=(1, 1),
                                 padding=((0, 0), (0, 0)), dilation=(1, 1), groups=8)
