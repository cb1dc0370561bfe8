"""The depthwise backward-filter kernel (``backends/cuda/depthwise_filter.py``) on
the CPU, through the g++ emulator of its CUDA text: against the float64
reference on MobileNet-v2's and EfficientNet-B0's geometries (3x3 and 5x5,
stride 1 and 2), asymmetric padding, dilation, a non-square kernel with mixed
stride, in every storage dtype, on the vector path (C a multiple of V = 16
bytes / itemsize) and the scalar one (V = 1), with every autotune variant and
other chunkings (each against the reference; a call is deterministic); the
column plan covers every (pixel, tap) once; the result is stored as cuDNN's
channels-last backward-filter stores it; the sources compile with nvcc where
it is installed; and the ``cuda`` rule declines what it does not take."""

from __future__ import annotations

import numpy as np
import pytest

from cuda_cpu_emulator import GXX, NVCC, nvcc_check
from depthwise_emulated import DTYPES, assert_close, case_id, emu, forward_hw, lanes_run  # noqa: F401 (emu: a fixture)
from opgraph import ops
from opgraph.backends.cuda import depthwise_filter as dwf
from opgraph.backends.cuda import depthwise
from opgraph.backends.reference import conv as ref_conv
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType, numpy_dtype, to_layout

pytestmark = pytest.mark.skipif(GXX is None, reason="no g++: the kernel's CUDA text cannot run on the CPU")

#: (input (N, C, H, W), kernel, stride, padding ((top, bottom), (left, right)), dilation)
CASES = [
    ((2, 16, 9, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),     # 3x3/1
    ((3, 16, 10, 10), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),   # 3x3/2 (MobileNet-v2, even input)
    ((1, 24, 11, 9), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),    # 5x5/2 (EfficientNet-B0)
    ((2, 16, 8, 9), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),     # 5x5/1, padding 2
    ((1, 8, 8, 7), (3, 3), (2, 1), ((0, 1), (2, 0)), (1, 1)),      # asymmetric padding and stride
    ((1, 8, 9, 9), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2)),      # dilation 2
    ((2, 8, 9, 10), (3, 2), (2, 3), ((1, 2), (0, 1)), (2, 3)),     # non-square kernel, mixed stride and dilation
    ((0, 8, 5, 5), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),      # an empty batch: zeros
]

#: C in {16, 24, 12, 5, 3}: a multiple of every dtype's V (16, 24), of float32's
#: and float64's only (12), of none (5, 3: scalar in every dtype); widths that are
#: and are not multiples of the strip
PATH_CASES = [
    ((3, 16, 12, 12), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    ((2, 24, 13, 11), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    ((2, 12, 9, 10), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
    ((3, 5, 8, 8), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),
    ((1, 3, 9, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
]

#: the autotune variants' options and other strips and chunkings (one chunk, every row its own chunk)
OPTIONS = [dict(pixels=4), dict(chunks=2), dict(pixels=1), dict(pixels=3, chunks=3), dict(chunks=1000)]


def _operands(case, dtype):
    shape, k, s, p, d = case
    n, c = shape[:2]
    rng = np.random.default_rng(sum(shape) + 7 * k[0] + k[1])
    x = rng.standard_normal(shape)
    gy = rng.standard_normal((n, c, *forward_hw(shape, k, s, p, d)))
    store = numpy_dtype(dtype)
    return to_layout(np, x.astype(store), "NHWC"), to_layout(np, gy.astype(store), "NHWC")


def _run(case, x_s, gy_s, **options):
    shape, k, s, p, d = case
    return dwf.conv2d_backward_filter(np, x_s, gy_s, stride=s, padding=p, dilation=d, groups=shape[1],
                                      weight_shape=(shape[1], 1, *k), **options)


def _reference(case, x_s, gy_s):
    shape, k, s, p, d = case
    return ref_conv.conv2d_backward_filter(np, x_s.astype(np.float64), gy_s.astype(np.float64), stride=s, padding=p,
                                           dilation=d, groups=shape[1], weight_shape=(shape[1], 1, *k))


def _einsum(case, x_s, gy_s):
    """The formula of the module docstring, tap by tap (an independent check of the reference)."""
    shape, k, s, p, d = case
    n, c, h, w = shape
    ho, wo = gy_s.shape[2:]
    (pt, pb), (pl, pr) = p
    xp_ = np.zeros((n, c, h + pt + pb + d[0] * k[0], w + pl + pr + d[1] * k[1]))
    xp_[:, :, pt:pt + h, pl:pl + w] = x_s.astype(np.float64)
    out = np.zeros((c, 1, *k))
    for kh in range(k[0]):
        for kw in range(k[1]):
            win = xp_[:, :, kh * d[0]:kh * d[0] + s[0] * ho:s[0], kw * d[1]:kw * d[1] + s[1] * wo:s[1]]
            out[:, 0, kh, kw] = np.einsum("nchw,nchw->c", win[:, :, :ho, :wo], gy_s.astype(np.float64))
    return out


def _check(case, dtype, x_s, gy_s, out):
    shape, k = case[0], case[1]
    ref = _reference(case, x_s, gy_s)
    assert out.shape == (shape[1], 1, *k) and out.dtype == numpy_dtype(dtype)
    # cuDNN's channels-last filter: (C, kH, kW, 1) in memory
    assert out.transpose(0, 2, 3, 1).flags.c_contiguous
    if shape[0] == 0:
        assert not out.astype(np.float64).any()
        return
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("case", CASES[:7], ids=case_id)
def test_the_reference_is_the_formula(case):
    x_s, gy_s = _operands(case, "float64")
    assert np.allclose(_reference(case, x_s, gy_s), _einsum(case, x_s, gy_s), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_the_float64_reference(emu, case, dtype):
    x_s, gy_s = _operands(case, dtype)
    _check(case, dtype, x_s, gy_s, _run(case, x_s, gy_s))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PATH_CASES, ids=case_id)
def test_vector_and_scalar_paths_match_the_reference(emu, case, dtype):
    x_s, gy_s = _operands(case, dtype)
    _check(case, dtype, x_s, gy_s, _run(case, x_s, gy_s))
    v = depthwise.lanes(dtype)
    assert lanes_run(emu, "opgraph_dw_wgrad_") == {v if case[0][1] % v == 0 else 1}


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
@pytest.mark.parametrize("dtype, case", [("bfloat16", PATH_CASES[0]), ("float32", PATH_CASES[1]),
                                         ("float16", CASES[2]), ("float64", CASES[6]), ("float32", CASES[4]),
                                         ("bfloat16", PATH_CASES[3])],
                         ids=lambda x: x if isinstance(x, str) else case_id(x))
def test_every_variant_matches_the_reference(emu, dtype, case, options):
    """Variants sum in other orders (strips, chunks): each against the reference, and each deterministic."""
    x_s, gy_s = _operands(case, dtype)
    got = _run(case, x_s, gy_s, **options)
    _check(case, dtype, x_s, gy_s, got)
    again = _run(case, x_s, gy_s, **options)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(again).tobytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("which", ["x", "gy"])
def test_an_unaligned_operand_takes_the_scalar_path(emu, dtype, which):
    case = PATH_CASES[0]
    ops_ = dict(zip(("x", "gy"), _operands(case, dtype)))
    a = ops_[which]
    n, c, h, w = a.shape
    flat = np.empty(a.size + 1, dtype=a.dtype)  # one element into its buffer: 2 or 4 bytes off 16
    nhwc = flat[1:].reshape(n, h, w, c)
    nhwc[...] = a.transpose(0, 2, 3, 1)
    ops_[which] = nhwc.transpose(0, 3, 1, 2)
    assert ops_[which].__array_interface__["data"][0] % 16 != 0
    _check(case, dtype, ops_["x"], ops_["gy"], _run(case, ops_["x"], ops_["gy"]))
    assert lanes_run(emu, "opgraph_dw_wgrad_") == {1}


def test_nchw_operands_are_copied(emu):
    case = PATH_CASES[1]
    x_s, gy_s = _operands(case, "float32")
    _check(case, "float32", np.ascontiguousarray(x_s), np.ascontiguousarray(gy_s),
           _run(case, np.ascontiguousarray(x_s), np.ascontiguousarray(gy_s)))


def test_the_rule_runs_its_variants(emu):
    rule = rules_for(ops.Conv2dBackwardFilter)["cuda"]
    case = PATH_CASES[1]
    shape, k, s, p, d = case
    op = ops.Conv2dBackwardFilter(stride=s, padding=p, dilation=d, groups=shape[1], weight_shape=(shape[1], 1, *k))
    x_s, gy_s = _operands(case, "bfloat16")
    types = (TensorType(x_s.shape, "bfloat16", "NHWC"), TensorType(gy_s.shape, "bfloat16", "NHWC"))
    assert rule.check(op, types, "cuda") is None
    assert op.infer(*types).shape == (shape[1], 1, *k)
    outs = [rule.kernel(KernelContext(np, "cuda", options), op, x_s, gy_s)
            for options in rule.variants(op, types, "cuda")]
    assert len(outs) == 3
    for out in outs:
        _check(case, "bfloat16", x_s, gy_s, out)
    from opgraph.passes.autotune import candidate_set
    assert f"cuda:variants@{dwf.REVISION}" in candidate_set([(rule, {})])
    assert dwf.variants.revision == dwf.REVISION


COLUMNS = [(pixels, kw, sw, dw) for pixels in (1, 2, 3, 4, 8)
           for kw, sw, dw in [(3, 1, 1), (3, 2, 1), (5, 2, 1), (5, 1, 1), (3, 1, 2), (2, 3, 3), (4, 2, 3), (1, 2, 1)]]


@pytest.mark.parametrize("pixels, kw, sw, dw", COLUMNS)
def test_the_column_plan_covers_every_tap_once(pixels, kw, sw, dw):
    plan = dwf._columns(pixels, kw, sw, dw)
    ds = [d for d, _ in plan]
    assert ds == sorted(set(ds))
    listed = [(p, k) for d, feeds in plan for p, k in feeds]
    assert sorted(listed) == [(p, k) for p in range(pixels) for k in range(kw)]
    assert all(d == p * sw + k * dw for d, feeds in plan for p, k in feeds)


def test_register_budget():
    """3x3 in one kernel-row group; 5x5 16-bit split into one row per thread; every group within the budget."""
    assert dwf._row_groups(3, 3, 8, 4) == 1 and dwf._row_groups(5, 5, 8, 4) == 5 and dwf._row_groups(5, 5, 4, 4) == 2
    for kh, kw, v, size in [(3, 3, 8, 4), (5, 5, 8, 4), (5, 5, 2, 8), (7, 7, 4, 4), (3, 3, 1, 4)]:
        g = dwf._row_groups(kh, kw, v, size)
        assert -(-kh // g) * kw * v * size <= dwf.ACC_BYTES or g == kh


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_the_sources_compile_with_nvcc():
    sources = []
    for dtype in DTYPES:
        for case in (CASES[6], PATH_CASES[1], CASES[2]):
            shape, k, s, p, d = case
            geo = (shape[0], shape[1], *shape[2:], *forward_hw(shape, k, s, p, d), *k, *s, p[0][0], p[1][0], *d)
            for v, pixels, wide in ((depthwise.lanes(dtype), 2, False), (1, 4, True)):
                if shape[1] % v:
                    continue
                g = dwf._row_groups(k[0], k[1], v, 8 if dtype == "float64" else 4)
                cb, _, kk = dwf._plan(shape[1], v, g)
                sources.append(dwf._source(dtype, geo, v, pixels, g, cb, kk, 3, wide)[2])
    nvcc_check(sources)


def test_the_rule_declines_what_it_does_not_take():
    rule = rules_for(ops.Conv2dBackwardFilter)["cuda"]
    op = ops.Conv2dBackwardFilter(stride=(2, 2), padding=((1, 1), (1, 1)), groups=16, weight_shape=(16, 1, 3, 3))
    x, gy = TensorType((2, 16, 10, 10), "bfloat16", "NHWC"), TensorType((2, 16, 5, 5), "bfloat16", "NHWC")
    assert rule.check(op, (x, gy), "cuda") is None
    assert "channels-last" in rule.check(op, (TensorType((2, 16, 10, 10), "bfloat16"), gy), "cuda")
    assert "channels-last" in rule.check(op, (x, TensorType((2, 16, 5, 5), "bfloat16")), "cuda")
    assert "one dtype" in rule.check(op, (x, TensorType((2, 16, 5, 5), "float32", "NHWC")), "cuda")
    dense = ops.Conv2dBackwardFilter(padding=((1, 1), (1, 1)), weight_shape=(8, 16, 3, 3))
    assert "not a depthwise" in rule.check(dense, (TensorType((2, 16, 5, 5), "float32", "NHWC"),
                                                   TensorType((2, 8, 5, 5), "float32", "NHWC")), "cuda")
    grouped = ops.Conv2dBackwardFilter(padding=((1, 1), (1, 1)), groups=8, weight_shape=(32, 2, 3, 3))
    assert "multiplier 1" in rule.check(grouped, (TensorType((2, 16, 5, 5), "float32", "NHWC"),
                                                  TensorType((2, 32, 5, 5), "float32", "NHWC")), "cuda")
    x_s, gy_s = _operands(CASES[0], "float32")
    with pytest.raises(Exception, match="not a depthwise"):
        dwf.conv2d_backward_filter(np, x_s, gy_s, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1),
                                   groups=1, weight_shape=(16, 16, 3, 3))


def test_the_rule_is_a_default_candidate_its_tag_turns_off():
    # it ran on the H200 (tests/gpu/test_depthwise_wgrad_gpu.py): autotune times it beside cuDNN's engines
    from opgraph.passes.policy import LoweringPolicy

    rule = rules_for(ops.Conv2dBackwardFilter)["cuda"]
    assert LoweringPolicy().exclusion(rule.algorithm, rule.tags) is None
    off = LoweringPolicy(exclude=["depthwise-wgrad"]).exclusion(rule.algorithm, rule.tags)
    assert off is not None and "depthwise-wgrad" in off


def test_a_kernel_beyond_the_plan_is_declined_not_hung():
    # one kernel row's sums must fit a thread (ACC_BYTES) and the rows a block: 257 x 9 or 11 x 11 in bf16 do not
    assert dwf.too_large(3, 3, "bfloat16") is None and dwf.too_large(5, 5, "float32") is None
    assert "257x9" in dwf.too_large(257, 9, "bfloat16") and "11x11" in dwf.too_large(11, 11, "bfloat16")
    rule = rules_for(ops.Conv2dBackwardFilter)["cuda"]
    op = ops.Conv2dBackwardFilter(padding=((5, 5), (5, 5)), groups=16, weight_shape=(16, 1, 11, 11))
    types = (TensorType((2, 16, 12, 12), "bfloat16", "NHWC"), TensorType((2, 16, 12, 12), "bfloat16", "NHWC"))
    assert "beyond the generated kernel's plan" in rule.check(op, types, "cuda")
