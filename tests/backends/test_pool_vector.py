"""The channels-last vector max pooling (``backends/cuda/pool_vector.py``) on the
CPU, through the g++ emulator of CUDA sources: bit for bit equal to the
scalar ``cuda`` pooling kernels (also emulated) on SEMANTICS.md's hard cases
(ties, -inf windows, NaN, padding, ceil_mode overhang, overlapping windows),
and within tolerance of the float64 reference, max and average pooling,
forward and backward; the ``vector`` autotune
variant is offered where it applies and falls back where a call's operands
do not qualify."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import channels_last
from cuda_cpu_emulator import GXX, EmulatedCupy
from cupy_standin import cupy_replaced
from opgraph import ops
from opgraph.backends.cuda import pool, pool_vector, rules
from opgraph.backends.cuda.codegen import launch
from opgraph.backends.registry import KernelContext
from opgraph.backends.reference import pool as ref_pool
from opgraph.types import TensorType, is_channels_last, numpy_dtype

pytestmark = pytest.mark.skipif(GXX is None, reason="no g++: the kernels' CUDA text cannot run on the CPU")

#: (kernel_size, stride, padding, ceil_mode): GoogLeNet's 3x3/2 with ceil_mode, its
#: inception branch's 3x3/1 padded, VGG's 2x2/2, an asymmetric padding
GEOMETRIES = [((3, 3), (2, 2), ((0, 0), (0, 0)), True), ((3, 3), (1, 1), ((1, 1), (1, 1)), False),
              ((2, 2), (2, 2), ((0, 0), (0, 0)), False), ((3, 3), (2, 2), ((1, 0), (0, 1)), True)]


@pytest.fixture
def emu(monkeypatch):
    with cupy_replaced(monkeypatch, EmulatedCupy(), launch.compiled, pool._compiled) as e:
        yield e


def _hard_input(shape, dtype, seed):
    """Few distinct values (ties), an all -inf window region, a NaN; channels-last."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, size=shape).astype(np.float32)
    a[0, :, :3, :3] = -np.inf
    a[-1, 1, 2, 4] = np.nan
    return channels_last(a.astype(numpy_dtype(dtype)))


def _sliced(a, extra: int, start: int):
    """``a``'s values as channels ``[start, start + C)`` of a wider channels-last buffer."""
    n, c, h, w = a.shape
    wide = channels_last(np.zeros((n, c + extra, h, w), a.dtype))
    wide[:, start:start + c] = a
    return wide[:, start:start + c]


def _op(kind, geometry):
    k, s, p, ceil = geometry
    return kind(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)


def _run(op, arrays, vector: bool, pixels: int = 1):
    t = op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays))
    options = ({"vector": True} | ({"pixels": pixels} if pixels != 1 else {})) if vector else {}
    ctx = KernelContext(np, "cuda", options, TensorType(t.shape, t.dtype, "NHWC"))
    return rules.POOL_KERNELS[type(op)](ctx, op, *arrays)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("pixels", pool_vector.PIXELS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["3x3s2-ceil", "3x3s1p1", "2x2s2", "3x3s2-asym"])
@pytest.mark.parametrize("kind", [ops.MaxPool2d, ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu],
                         ids=lambda k: k.__name__)
def test_vector_pooling_equals_the_scalar_kernels_bit_for_bit(emu, kind, geometry, dtype, pixels):
    """Also with ``pixels`` output columns per thread: 11 columns in (9-11 pooled)
    leave a last group of 1-3 columns."""
    x = _hard_input((2, 16, 9, 11), dtype, seed=1)
    op = _op(kind, geometry)
    arrays = [x]
    if kind is not ops.MaxPool2d:
        out = _op(ops.MaxPool2d, geometry).output_shape(x.shape)
        gy = channels_last(np.random.default_rng(2).standard_normal(out).astype(numpy_dtype(dtype)))
        arrays.append(_sliced(gy, 8, 8))  # a 16-byte-aligned channel slice: read at its pitch
    before = len(emu.raw_launches)
    got = _run(op, arrays, vector=True, pixels=pixels)
    names = [x["name"] for x in emu.raw_launches[before:]]
    assert names and all("pool_vec" in n for n in names), names
    assert (pixels == 1) == all("_p" not in n.rsplit("_k", 1)[1] for n in names)  # the scan took them
    want = _run(op, arrays, vector=False)
    assert got.shape == want.shape and got.dtype == want.dtype and is_channels_last(got)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    ref = ref_pool.__dict__[{ops.MaxPool2d: "max_pool2d", ops.MaxPool2dBackward: "max_pool2d_backward",
                             ops.MaxPool2dBackwardRelu: "max_pool2d_backward_relu"}[kind]]
    k, s, p, ceil = geometry
    want64 = ref(np, *(a.astype(np.float64) for a in arrays), kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    g = np.asarray(got, np.float64)
    np.testing.assert_allclose(g, want64, rtol=1e-2 if dtype == "bfloat16" else 1e-6, atol=1e-6)


@pytest.mark.parametrize("pixels", pool_vector.PIXELS)
@pytest.mark.parametrize("geometry", GEOMETRIES[:2], ids=["3x3s2-ceil", "3x3s1p1"])
@pytest.mark.parametrize("kind", [ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu], ids=lambda k: k.__name__)
def test_bfloat16_pair_kernels_keep_signed_zeros_and_non_finite_values(emu, kind, geometry, pixels):
    """The bfloat16 scan and gather work on two lanes, four index bytes, at a
    time (``_scan_pairs``, ``_gather_pairs``): ties of -0.0 and +0.0 (the first
    wins), windows of -inf, NaN in some lanes of a thread but not others, and
    gradients of -0.0, inf and NaN give the lane by lane kernels' bits."""
    rng = np.random.default_rng(7)
    values = np.array([-0.0, 0.0, -1.0, 1.0, np.inf, -np.inf], np.float32)
    x = values[rng.integers(0, len(values), size=(2, 16, 9, 11))]
    x[0, :, :4, :4] = -np.inf
    x[1, 3, 4, 5] = x[1, 12, 0, 0] = np.nan
    x[0, 8:, 5:, 5:] = -0.0
    x[0, 8:, 6, 6] = 0.0
    x = channels_last(x.astype(numpy_dtype("bfloat16")))
    op = _op(kind, geometry)
    out = _op(ops.MaxPool2d, geometry).output_shape(x.shape)
    g = np.array([-0.0, 0.0, 0.5, -2.0, np.inf, -np.inf, np.nan], np.float32)
    gy = channels_last(g[rng.integers(0, len(g), size=out)].astype(numpy_dtype("bfloat16")))
    got = _run(op, [x, gy], vector=True, pixels=pixels)
    want = _run(op, [x, gy], vector=False)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["3x3s2-ceil", "3x3s1p1", "2x2s2", "3x3s2-asym"])
def test_vector_average_pooling_equals_the_scalar_kernels_bit_for_bit(emu, geometry, dtype, include_pad):
    """Forward and backward, count_include_pad both ways (the divisor with
    explicit padding and the ceil_mode overhang), gy a channel slice."""
    k, s, p, ceil = geometry
    x = channels_last(np.random.default_rng(5).standard_normal((2, 16, 9, 11)).astype(numpy_dtype(dtype)))
    fwd = ops.AvgPool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=include_pad)
    out = fwd.output_shape(x.shape)
    gy = _sliced(channels_last(np.random.default_rng(6).standard_normal(out).astype(numpy_dtype(dtype))), 8, 8)
    bwd = ops.AvgPool2dBackward(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=include_pad,
                                input_shape=x.shape)
    for op, arrays in ((fwd, [x]), (bwd, [gy])):
        before = len(emu.raw_launches)
        got = _run(op, arrays, vector=True)
        assert all("pool_vec_avg" in x["name"] for x in emu.raw_launches[before:]), emu.raw_launches[before:]
        want = _run(op, arrays, vector=False)
        assert got.shape == want.shape and is_channels_last(got)
        np.testing.assert_array_equal(_bits(got), _bits(want))
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == "bfloat16" else dict(rtol=1e-6, atol=1e-6)
    kw = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=include_pad)
    np.testing.assert_allclose(np.asarray(_run(fwd, [x], vector=True), np.float64),
                               ref_pool.avg_pool2d(np, x.astype(np.float64), **kw), **tol)
    np.testing.assert_allclose(np.asarray(_run(bwd, [gy], vector=True), np.float64),
                               ref_pool.avg_pool2d_backward(np, gy.astype(np.float64), input_shape=x.shape, **kw),
                               **tol)


def test_operands_that_do_not_qualify_take_the_scalar_kernels(emu):
    """An unaligned channel slice (start 3), NCHW storage, channels not filling
    16-byte words: the ``vector`` option falls back, with the same result."""
    geometry = GEOMETRIES[0]
    g = ref_pool.PoolGeometry((3, 3), (2, 2), ((0, 0), (0, 0)), (9, 11), (4, 5))
    x = _hard_input((2, 16, 9, 11), "bfloat16", seed=3)
    for a in (_sliced(x, 8, 3), np.ascontiguousarray(x), _hard_input((2, 12, 9, 11), "bfloat16", seed=4)):
        assert pool_vector.applies(g, a) is not None
        before = len(emu.raw_launches)
        got = _run(_op(ops.MaxPool2d, geometry), [a], vector=True)
        assert not any("pool_vec" in x["name"] for x in emu.raw_launches[before:])
        np.testing.assert_array_equal(_bits(got), _bits(_run(_op(ops.MaxPool2d, geometry), [a], vector=False)))


def _variants(op, types, device):
    """The variants the ``cuda`` rule of ``op`` offers."""
    return rules.OPTIONS[type(op)][1](op, types, device)


def test_the_vector_variant_is_offered_for_channels_last_pooling_only():
    op = _op(ops.MaxPool2dBackward, GEOMETRIES[0])
    nhwc = [TensorType((8, 64, 28, 28), "bfloat16", "NHWC"), TensorType((8, 64, 13, 13), "bfloat16", "NHWC")]
    assert {"vector": True} in _variants(op, nhwc, "cuda")
    nchw = [TensorType(t.shape, t.dtype, "NCHW") for t in nhwc]
    odd = [TensorType((8, 60, 28, 28), "bfloat16", "NHWC"), TensorType((8, 60, 13, 13), "bfloat16", "NHWC")]
    half = [TensorType(t.shape, "float16", "NHWC") for t in nhwc]
    for types in (nchw, odd, half):
        assert {"vector": True} not in _variants(op, types, "cuda")
    # the max-pool scans also over several output columns per thread
    assert [v for v in _variants(op, nhwc, "cuda") if "pixels" in v] == [
        {"vector": True, "pixels": n} for n in pool_vector.PIXELS if n != 1]
    avg = ops.AvgPool2d(kernel_size=(3, 3), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False)
    assert {"vector": True} in _variants(avg, nhwc[:1], "cuda")
    assert not any("pixels" in v for v in _variants(avg, nhwc[:1], "cuda"))
    assert {"vector": True} not in _variants(avg, nchw[:1], "cuda")
    select = ops.MaxPool2dSelect(kernel_size=(3, 3), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=False)
    assert {"vector": True} not in _variants(select, nhwc[:1] * 2, "cuda")


def test_decisions_tuned_before_the_vector_kernels_are_tuned_again():
    """The autotune cache keys a decision by the candidates' variant functions
    (``autotune.candidate_set``): max and average pooling's changed name, and
    the vector kernels' revision, so a decision tuned against an older
    revision (or before the kernels existed) is tuned again."""
    from opgraph.backends.registry import rules_for
    from opgraph.passes.autotune import candidate_set
    for op_type in rules.VECTOR_POOLS:
        key = candidate_set([(rules_for(op_type)["cuda"], {})])
        assert f"cuda:vector_pool_variants@{pool_vector.REVISION}" in key
    assert "cuda:pool_variants" in candidate_set([(rules_for(ops.MaxPool2dSelect)["cuda"], {})])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_global_pooling_gradient_tests_only_the_windows_that_exist(emu, dtype):
    """A 5x5 window over a 5x5 plane (GoogLeNet's 7x7 average pool) pools to one
    pixel: the kernels test one covering window, not ceil(5 / 1)^2 = 25 (the
    name carries ``m1x1``), and give the scalar kernels' bits, average and max."""
    x = channels_last(np.random.default_rng(8).standard_normal((2, 16, 5, 5)).astype(numpy_dtype(dtype)))
    gy = channels_last(np.random.default_rng(9).standard_normal((2, 16, 1, 1)).astype(numpy_dtype(dtype)))
    cases = [(ops.AvgPool2dBackward(kernel_size=5, stride=1, input_shape=x.shape), [gy]),
             (ops.MaxPool2dBackward(kernel_size=5, stride=1), [x, gy])]
    for op, arrays in cases:
        before = len(emu.raw_launches)
        got = _run(op, arrays, vector=True)
        names = [r["name"] for r in emu.raw_launches[before:]]
        assert any(n.endswith("_k5x5s1x1m1x1") for n in names), names
        np.testing.assert_array_equal(_bits(got), _bits(_run(op, arrays, vector=False)))


@pytest.mark.parametrize("pixels", [1, 2])
def test_bfloat16_gather_of_windows_over_128_cells_compares_whole_index_bytes(emu, pixels):
    """``MaxPool2dBackward`` indexes windows of up to 255 cells: a 13x13 window's
    winners at 128 and above (cell (12, 12) is index 168) and at their index
    less 128 both route their gradient to their own cell only (the pair gather
    compares all eight bits of an index byte), bit for bit the scalar kernels."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 16, 14, 14)).astype(np.float32)
    x[0, :, 12, 12] = 10.0  # window (0, 0)'s winner: index 168
    x[1, :, 3, 2] = 10.0    # window (0, 0)'s winner: index 41 = 169 - 128
    x = channels_last(x.astype(numpy_dtype("bfloat16")))
    op = ops.MaxPool2dBackward(kernel_size=13, stride=1)
    gy = channels_last(rng.standard_normal((2, 16, 2, 2)).astype(numpy_dtype("bfloat16")))
    before = len(emu.raw_launches)
    got = _run(op, [x, gy], vector=True, pixels=pixels)
    assert any("pool_vec_bwd" in r["name"] for r in emu.raw_launches[before:])
    want = _run(op, [x, gy], vector=False)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert np.asarray(got, np.float32)[0, :, 12, 12].all()  # the winner at index 168 got its gradient


def test_pixel_pitch_of_planes_whose_extents_are_one():
    """A 1 x 1 plane's pixels are its images, whatever stride NumPy or CuPy gave
    its height and width; a column (width 1) steps by its rows."""
    assert pool_vector.pixel_pitch(np.zeros((2, 16, 1, 1), np.float32)) == 16
    wide = channels_last(np.zeros((2, 32, 1, 1), np.float32))
    assert pool_vector.pixel_pitch(wide[:, 8:24]) == 32
    assert pool_vector.pixel_pitch(channels_last(np.zeros((2, 16, 3, 1), np.float32))) == 16
    assert pool_vector.pixel_pitch(np.zeros((2, 16, 3, 1), np.float32)) is None  # NCHW: not channels-last
