"""The depthwise backward-data kernel (``backends/cuda/depthwise.py``) on the CPU,
through the g++ emulator of its CUDA text: against the float64 reference on
MobileNet-v2's and EfficientNet-B0's geometries (3x3 and 5x5, stride 1 and 2),
asymmetric padding and dilation, in every storage dtype, on the vector path
(C a multiple of V = 16 bytes / itemsize) and the scalar one (V = 1: other
channel counts, an unaligned gy), with every autotune variant (strip width,
row tiles: bit for bit the default's result); the column plan of a strip
covers every (pixel, tap) once; the sources compile with nvcc where it is
installed; and the ``cuda`` rule declines what it does not take."""

from __future__ import annotations

import numpy as np
import pytest

from cuda_cpu_emulator import GXX, NVCC, nvcc_check
from depthwise_emulated import DTYPES, assert_close, case_id, emu, forward_hw, lanes_run  # noqa: F401 (emu: a fixture)
from opgraph import ops
from opgraph.backends.cuda import depthwise
from opgraph.backends.reference import conv as ref_conv
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.types import TensorType, is_channels_last, numpy_dtype, to_layout

pytestmark = pytest.mark.skipif(GXX is None, reason="no g++: the kernel's CUDA text cannot run on the CPU")

#: (input (N, C, H, W), kernel, stride, padding ((top, bottom), (left, right)), dilation)
CASES = [
    ((2, 16, 9, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    ((2, 16, 10, 10), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),   # MobileNet-v2's stride 2 (even input)
    ((1, 24, 11, 9), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),    # EfficientNet-B0's 5x5 / 2
    ((1, 8, 8, 7), (3, 3), (2, 1), ((0, 1), (2, 0)), (1, 1)),      # asymmetric padding and stride
    ((1, 8, 9, 9), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2)),      # dilation
    ((1, 8, 9, 10), (3, 2), (2, 3), ((1, 2), (0, 1)), (2, 3)),     # non-square kernel, mixed stride and dilation
    ((0, 8, 5, 5), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),      # an empty batch
    ((2, 1, 4, 4), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),      # one channel: the layouts coincide
]


#: the vector and scalar paths: batch > 1, 3x3 and 5x5, stride 1 and 2, C a multiple of
#: every dtype's V (16, 24, 32: 8 lanes of 16-bit, 4 of float32, 2 of float64) or not
#: (12: vector in float32 and float64 only; 6: float64 only; 5 and 3: scalar in every
#: dtype); widths that are and are not multiples of the 4-pixel strip
PATH_CASES = [
    ((3, 16, 12, 12), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    ((2, 24, 13, 11), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    ((2, 32, 10, 10), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
    ((2, 16, 11, 14), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),
    ((2, 12, 9, 10), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    ((2, 6, 10, 9), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    ((3, 5, 8, 8), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),
    ((2, 3, 9, 9), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
]

#: the autotune variants' options (``depthwise.variants``) and others: strips of
#: 1, 2 (rounded to 3 for a column stride of 3) and 8 pixels, tiles of rows
OPTIONS = [dict(rows=4), dict(pixels=8, rows=4), dict(pixels=1), dict(pixels=2, rows=3), dict(pixels=8)]


def _operands(case, dtype):
    shape, k, s, p, d = case
    n, c = shape[:2]
    rng = np.random.default_rng(sum(shape) + k[0])
    gy = rng.standard_normal((n, c, *forward_hw(shape, k, s, p, d)))
    w = rng.standard_normal((c, 1, *k))
    store = numpy_dtype(dtype)
    return to_layout(np, gy.astype(store), "NHWC"), to_layout(np, w.astype(store), "NHWC")


def _run(case, gy_s, w_s, **options):
    shape, k, s, p, d = case
    return depthwise.conv2d_backward_data(np, gy_s, w_s, stride=s, padding=p, dilation=d, groups=shape[1],
                                          input_shape=shape, **options)


def _check(case, dtype, gy_s, w_s, out):
    shape, k, s, p, d = case
    ref = ref_conv.conv2d_backward_data(np, gy_s.astype(np.float64), w_s.astype(np.float64), stride=s, padding=p,
                                        dilation=d, groups=shape[1], input_shape=shape)
    assert out.shape == shape and out.dtype == numpy_dtype(dtype)
    assert is_channels_last(out) or 0 in shape or shape[1] == 1
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_the_float64_reference(emu, case, dtype):
    gy_s, w_s = _operands(case, dtype)
    _check(case, dtype, gy_s, w_s, _run(case, gy_s, w_s))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PATH_CASES, ids=case_id)
def test_vector_and_scalar_paths_match_the_reference(emu, case, dtype):
    gy_s, w_s = _operands(case, dtype)
    _check(case, dtype, gy_s, w_s, _run(case, gy_s, w_s))
    v = depthwise.lanes(dtype)
    assert lanes_run(emu, "opgraph_dw_dgrad_") == {v if case[0][1] % v == 0 else 1}


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
@pytest.mark.parametrize("dtype, case", [("bfloat16", PATH_CASES[0]), ("float32", PATH_CASES[1]),
                                         ("float16", PATH_CASES[3]), ("bfloat16", PATH_CASES[6]),
                                         ("float64", CASES[5]), ("float32", CASES[3]),
                                         ("bfloat16", ((1, 16, 7, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1))),
                                         ("float32", ((1, 8, 5, 13), (3, 3), (3, 3), ((1, 1), (0, 2)), (1, 1)))],
                         ids=lambda x: x if isinstance(x, str) else case_id(x))
def test_every_variant_is_bit_for_bit_the_default(emu, dtype, case, options):
    """Each pixel's taps are summed in the same order (kernel rows, then gy columns) whatever the tiling."""
    gy_s, w_s = _operands(case, dtype)
    want = _run(case, gy_s, w_s)
    got = _run(case, gy_s, w_s, **options)
    _check(case, dtype, gy_s, w_s, got)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_unaligned_gy_takes_the_scalar_path(emu, dtype):
    case = PATH_CASES[0]
    gy_s, w_s = _operands(case, dtype)
    n, c, ho, wo = gy_s.shape
    flat = np.empty(gy_s.size + 1, dtype=gy_s.dtype)  # gy one element into its buffer: 2 or 4 bytes off 16
    nhwc = flat[1:].reshape(n, ho, wo, c)
    nhwc[...] = gy_s.transpose(0, 2, 3, 1)
    shifted = nhwc.transpose(0, 3, 1, 2)
    assert shifted.__array_interface__["data"][0] % 16 != 0
    _check(case, dtype, shifted, w_s, _run(case, shifted, w_s))
    assert lanes_run(emu, "opgraph_dw_dgrad_") == {1}


def test_the_rule_runs_its_variants(emu):
    rule = rules_for(ops.Conv2dBackwardData)["cuda"]
    case = PATH_CASES[1]
    shape, k, s, p, d = case
    op = ops.Conv2dBackwardData(stride=s, padding=p, dilation=d, groups=shape[1], input_shape=shape)
    gy_s, w_s = _operands(case, "bfloat16")
    types = (TensorType(gy_s.shape, "bfloat16", "NHWC"), TensorType(w_s.shape, "bfloat16", "NHWC"))
    outs = [rule.kernel(KernelContext(np, "cuda", options), op, gy_s, w_s)
            for options in rule.variants(op, types, "cuda")]
    assert len(outs) == 3 and len({name for name in (l["name"] for l in emu.raw_launches)}) == 6
    for out in outs:
        _check(case, "bfloat16", gy_s, w_s, out)
    from opgraph.passes.autotune import candidate_set
    assert f"cuda:variants@{depthwise.REVISION}" in candidate_set([(rule, {})])


#: (pixels, kw, sw, pl, dw); strips are multiples of the column stride
STRIPS = [(pixels, *geo) for pixels in (1, 2, 3, 4, 6, 8)
          for geo in [(3, 1, 1, 1), (3, 2, 1, 1), (5, 2, 2, 1), (5, 1, 0, 1), (3, 2, 0, 1), (3, 1, 2, 2),
                      (2, 3, 0, 3), (4, 2, 3, 3), (1, 2, 0, 1), (7, 4, 5, 2)] if pixels % geo[1] == 0]


@pytest.mark.parametrize("pixels, kw, sw, pl, dw", STRIPS)
def test_a_strips_column_plan_covers_every_tap_once(pixels, kw, sw, pl, dw):
    """Pixel w0 + p (w0 a multiple of sw) gets gy column ow through tap k exactly when
    ow * sw = w0 + p + pl - k * dw; the plan lists each such (p, k) once, at ow's j."""
    e, plan = depthwise._strip(pixels, kw, sw, pl, dw)
    assert e % sw == 0
    listed = [(p, k, j) for j, feeds in plan for k, p in feeds]
    assert len(listed) == len(set(listed))
    for w0 in (0, sw, 5 * sw):
        want = {(p, k, (w0 + p + pl - k * dw) // sw - (w0 + e) // sw) for p in range(pixels) for k in range(kw)
                if (w0 + p + pl - k * dw) % sw == 0}
        assert set(listed) == want


def test_the_first_kernel_row_of_each_residue():
    for sh, dh, kh in [(1, 1, 3), (2, 1, 3), (2, 2, 3), (3, 2, 5), (4, 6, 7), (2, 3, 1)]:
        first = depthwise._first_taps(sh, dh, kh)
        for r in range(sh):
            rows = [k for k in range(kh + sh) if k * dh % sh == r]
            assert first[r] == (rows[0] if rows and rows[0] < sh // np.gcd(sh, dh) else kh)


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_the_sources_compile_with_nvcc():
    sources = []
    for dtype in DTYPES:
        for case in (CASES[5], PATH_CASES[1], PATH_CASES[3]):
            shape, k, s, p, d = case
            geo = (shape[1], *shape[2:], *forward_hw(shape, k, s, p, d), *k, *s, p[0][0], p[1][0], *d)
            for v, pixels, rows, wide in ((depthwise.lanes(dtype), 4, 1, False), (1, 8, 4, True)):
                sources.append(depthwise._source(dtype, geo, v, pixels, rows, wide)[2])
    nvcc_check(sources)


def test_the_rule_declines_what_it_does_not_take():
    rule = rules_for(ops.Conv2dBackwardData)["cuda"]
    dw = ops.Conv2dBackwardData(stride=(2, 2), padding=((1, 1), (1, 1)), groups=16, input_shape=(2, 16, 10, 10))
    gy, w = TensorType((2, 16, 5, 5), "bfloat16", "NHWC"), TensorType((16, 1, 3, 3), "bfloat16", "NHWC")
    assert rule.check(dw, (gy, w), "cuda") is None
    assert "channels-last" in rule.check(dw, (TensorType((2, 16, 5, 5), "bfloat16"), w), "cuda")
    dense = ops.Conv2dBackwardData(padding=((1, 1), (1, 1)), input_shape=(2, 16, 5, 5))
    assert "not a depthwise" in rule.check(dense, (TensorType((2, 8, 5, 5), "float32", "NHWC"),
                                                   TensorType((8, 16, 3, 3))), "cuda")
    assert "one dtype" in rule.check(dw, (gy, TensorType((16, 1, 3, 3), "float32", "NHWC")), "cuda")
    far = ops.Conv2dBackwardData(padding=((0, 2 ** 32), (0, 0)), dilation=(2 ** 30, 1), groups=2,
                                 input_shape=(1, 2, 1, 3))
    assert "32-bit" in rule.check(far, (TensorType((1, 2, 1, 3), "float32", "NHWC"),
                                        TensorType((2, 1, 5, 1), "float32", "NHWC")), "cuda")
    grouped = ops.Conv2dBackwardData(padding=((1, 1), (1, 1)), groups=8, input_shape=(2, 16, 5, 5))
    assert "multiplier 1" in rule.check(grouped, (TensorType((2, 32, 5, 5), "float32", "NHWC"),
                                                  TensorType((32, 2, 3, 3))), "cuda")
