"""The kernels of max pooling through saved winners (``MaxPool2dArgmax``,
``MaxPool2dTake``, ``MaxPool2dBackwardIndices``): the float64 oracle
(``reference/pool_indices.py``) against ``MaxPool2d`` and its gradients, and
the ``cuda`` node kernels, scalar and vector, run on the CPU through the g++
emulator of their CUDA text, against the oracle on the same stored values, on
SEMANTICS.md's hard cases (ties, -inf windows, NaN, padding, ceil_mode)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import channels_last
from cuda_cpu_emulator import GXX, EmulatedCupy
from cupy_standin import cupy_replaced
from opgraph import ops
from opgraph.backends.cuda import pool, rules
from opgraph.backends.cuda.codegen import launch
from opgraph.backends.reference import pool as ref_pool, pool_indices as ref_idx
from opgraph.backends.registry import KernelContext
from opgraph.errors import ParameterError, ShapeError
from opgraph.ops.pool_indices import MASKED
from opgraph.types import TensorType, is_channels_last, numpy_dtype

#: (kernel_size, stride, padding, ceil_mode): GoogLeNet's 3x3/2 with ceil_mode and
#: its inception branch's 3x3/1 padded, VGG's 2x2/2, an asymmetric padding
GEOMETRIES = [((3, 3), (2, 2), ((0, 0), (0, 0)), True), ((3, 3), (1, 1), ((1, 1), (1, 1)), False),
              ((2, 2), (2, 2), ((0, 0), (0, 0)), False), ((3, 3), (2, 2), ((1, 0), (0, 1)), True)]
IDS = ["3x3s2-ceil", "3x3s1p1", "2x2s2", "3x3s2-asym"]


def _hard_input(shape, dtype, seed, layout="NHWC"):
    """Few distinct values (ties, zeros for the ReLU mark), an all -inf region, a NaN."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, size=shape).astype(np.float32)
    a[0, :, :3, :3] = -np.inf
    a[-1, 1, 2, 4] = np.nan
    a = a.astype(numpy_dtype(dtype))
    return channels_last(a) if layout == "NHWC" else a


def _op(kind, geometry, **extra):
    k, s, p, ceil = geometry
    return kind(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, **extra)


def _kw(geometry):
    k, s, p, ceil = geometry
    return dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)


def _geometry(op, in_hw, out_hw):
    return ref_pool.node_geometry(op, in_hw, out_hw)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
@pytest.mark.parametrize("relu", [False, True])
def test_the_oracle_equals_max_pooling_and_its_gradients(geometry, relu):
    """Take of the argmax is MaxPool2d bit for bit; the gather is MaxPool2dBackward
    (masked: MaxPool2dBackwardRelu) in float64; unmasked it ignores the mark."""
    x = np.asarray(_hard_input((2, 3, 9, 11), "float64", 3, "NCHW"))
    pooled = _op(ops.MaxPool2d, geometry).output_shape(x.shape)
    g = _geometry(_op(ops.MaxPool2d, geometry), x.shape[2:], pooled[2:])
    y, idx = ref_idx.max_pool2d_with_indices(np, x, g, relu)
    want_y = ref_pool.max_pool2d(np, x, **_kw(geometry))
    np.testing.assert_array_equal(ref_idx.max_pool2d_take(np, x, idx, g), want_y)
    assert ((idx >= MASKED) == ~(want_y > 0)).all() if relu else (idx < MASKED).all()
    gy = np.random.default_rng(4).standard_normal(pooled)
    plain = ref_pool.max_pool2d_backward(np, x, gy, **_kw(geometry))
    np.testing.assert_allclose(ref_idx.max_pool2d_backward_indices(np, idx, gy, g, x.shape, masked=False), plain,
                               rtol=1e-12, atol=1e-12)
    if relu:
        want = ref_pool.max_pool2d_backward_relu(np, x, gy, **_kw(geometry))
        np.testing.assert_allclose(ref_idx.max_pool2d_backward_indices(np, idx, gy, g, x.shape, masked=True), want,
                                   rtol=1e-12, atol=1e-12)
        taken = ref_idx.max_pool2d_take(np, x, idx, g, masked=True)
        np.testing.assert_array_equal(taken, np.where(idx >= MASKED, 0.0, want_y))


def test_an_index_naming_no_input_cell_reads_minus_inf_and_receives_nothing():
    x = np.arange(16, dtype=np.float64).reshape(1, 1, 4, 4)
    op = ops.MaxPool2d(kernel_size=3, stride=2, padding=1)
    g = _geometry(op, (4, 4), (2, 2))
    idx = np.zeros((1, 1, 2, 2), np.uint8)  # cell (0, 0) of windows starting in the padding
    idx[0, 0, 1, 1] = 9  # past a 3x3 window
    idx[0, 0, 1, 0] = 4  # the centre of the window at (1, -1): input cell (2, 0)
    y = ref_idx.max_pool2d_take(np, x, idx, g)
    np.testing.assert_array_equal(y, [[[[-np.inf, -np.inf], [x[0, 0, 2, 0], -np.inf]]]])
    gx = ref_idx.max_pool2d_backward_indices(np, idx, np.ones((1, 1, 2, 2)), g, x.shape)
    want = np.zeros_like(x)
    want[0, 0, 2, 0] = 1.0
    np.testing.assert_array_equal(gx, want)


def test_the_ops_refuse_bad_indices_and_large_windows():
    x = TensorType((1, 2, 8, 8), "float32")
    with pytest.raises(ParameterError, match="kernel_size.*144 cells.*128"):
        ops.MaxPool2dArgmax(kernel_size=12)
    take = ops.MaxPool2dTake(kernel_size=2, stride=2)
    with pytest.raises(ShapeError, match="float32, not uint8"):
        take.infer(x, TensorType((1, 2, 4, 4), "float32"))
    with pytest.raises(ShapeError, match=r"\(1, 2, 3, 4\) != pooled shape \(1, 2, 4, 4\)"):
        take.infer(x, TensorType((1, 2, 3, 4), "uint8"))
    idx = ops.MaxPool2dArgmax(kernel_size=2, stride=2).infer(x)
    assert idx == TensorType((1, 2, 4, 4), "uint8")
    back = ops.MaxPool2dBackwardIndices(kernel_size=2, stride=2, input_shape=(1, 2, 8, 8))
    assert back.infer(idx, TensorType((1, 2, 4, 4), "bfloat16")) == TensorType((1, 2, 8, 8), "bfloat16")


# ---- the cuda node kernels, emulated

@pytest.fixture
def emu(monkeypatch):
    if GXX is None:
        pytest.skip("no g++: the kernels' CUDA text cannot run on the CPU")
    with cupy_replaced(monkeypatch, EmulatedCupy(), launch.compiled, pool._compiled) as e:
        yield e


def _run(op, arrays, options, layout=None):
    """The node kernel of ``op`` on ``arrays``, its output type in ``layout``
    (default: the first array's storage order)."""
    t = op.infer(*(TensorType(a.shape, "uint8" if a.dtype == np.uint8 else a.dtype.name) for a in arrays))
    layout = layout or ("NHWC" if is_channels_last(arrays[0]) else "NCHW")
    ctx = KernelContext(np, "cuda", options, TensorType(t.shape, t.dtype, layout))
    return rules.POOL_KERNELS[type(op)](ctx, op, *arrays)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


VARIANTS = [{}, {"specialize": True}, {"vector": True}, {"vector": True, "pixels": 2}]


@pytest.mark.parametrize("options", VARIANTS, ids=["scalar", "specialize", "vector", "vector-p2"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_cuda_kernels_equal_the_oracle(emu, geometry, dtype, layout, options):
    """Argmax (relu or not) and take bit for bit, the gather (masked or not)
    within one rounding of its float32 sums; the vector kernels ran where
    the operands are channels-last (and only there)."""
    x = _hard_input((2, 16, 9, 11), dtype, 1, layout)
    pooled = _op(ops.MaxPool2d, geometry).output_shape(x.shape)
    g = _geometry(_op(ops.MaxPool2d, geometry), x.shape[2:], pooled[2:])
    gy = np.random.default_rng(2).standard_normal(pooled).astype(numpy_dtype(dtype))
    gy = channels_last(gy) if layout == "NHWC" else gy
    x64 = np.asarray(x, np.float64)
    for relu in (False, True):
        before = len(emu.raw_launches) + len(emu.launches)
        idx = _run(_op(ops.MaxPool2dArgmax, geometry, relu=relu), [x], options)
        _, want_idx = ref_idx.max_pool2d_with_indices(np, x64, g, relu)
        assert idx.dtype == np.uint8 and is_channels_last(idx) == (layout == "NHWC")
        np.testing.assert_array_equal(idx, want_idx)
        y = _run(_op(ops.MaxPool2dTake, geometry), [x, idx], options)
        assert y.dtype == x.dtype and is_channels_last(y) == (layout == "NHWC")
        np.testing.assert_array_equal(_bits(y), _bits(np.asarray(ref_pool.max_pool2d(np, x, **_kw(geometry)))))
        for masked in ((False, True) if relu else (False,)):
            op = _op(ops.MaxPool2dBackwardIndices, geometry, masked=masked, input_shape=x.shape)
            gx = _run(op, [idx, gy], options)
            want = ref_idx.max_pool2d_backward_indices(np, want_idx, np.asarray(gy, np.float64), g, x.shape, masked)
            assert gx.dtype == gy.dtype and gx.shape == x.shape
            tol = 8e-3 if dtype == "bfloat16" else 1e-6
            np.testing.assert_allclose(np.asarray(gx, np.float64), want, rtol=tol, atol=tol)
        names = [c["name"] for c in (emu.raw_launches + emu.launches)][before:]
        vectored = options.get("vector") and layout == "NHWC"
        assert names and all(("pool_vec" in n) == bool(vectored) for n in names), names


def test_a_marked_window_takes_zero_when_masked(emu):
    x = _hard_input((1, 8, 6, 6), "float32", 5)
    geometry = GEOMETRIES[2]
    idx = _run(_op(ops.MaxPool2dArgmax, geometry, relu=True), [x], {"vector": True})
    assert (idx >= MASKED).any() and (idx < MASKED).any()
    for options in ({}, {"vector": True}):
        y = _run(_op(ops.MaxPool2dTake, geometry, masked=True), [x, idx], options)
        plain = ref_pool.max_pool2d(np, x, **_kw(geometry))
        np.testing.assert_array_equal(np.asarray(y), np.where(np.asarray(idx) >= MASKED, 0.0, plain))


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_the_scalar_kernels_take_half_and_double_storage(emu, dtype):
    """float16 computes in float32 (cast back once), float64 as itself: the argmax
    and take equal the oracle's bit for bit, the gather within a rounding."""
    geometry = GEOMETRIES[0]
    x = _hard_input((2, 4, 9, 11), dtype, 7, "NCHW")
    pooled = _op(ops.MaxPool2d, geometry).output_shape(x.shape)
    g = _geometry(_op(ops.MaxPool2d, geometry), x.shape[2:], pooled[2:])
    idx = _run(_op(ops.MaxPool2dArgmax, geometry, relu=True), [x], {"vector": True})  # no vector path: scalar
    _, want_idx = ref_idx.max_pool2d_with_indices(np, np.asarray(x, np.float64), g, True)
    np.testing.assert_array_equal(idx, want_idx)
    y = _run(_op(ops.MaxPool2dTake, geometry), [x, idx], {})
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, ref_pool.max_pool2d(np, x, **_kw(geometry)))
    gy = np.random.default_rng(8).standard_normal(pooled).astype(dtype)
    gx = _run(_op(ops.MaxPool2dBackwardIndices, geometry, masked=True, input_shape=x.shape), [idx, gy], {})
    want = ref_idx.max_pool2d_backward_indices(np, want_idx, gy.astype(np.float64), g, x.shape, True)
    assert gx.dtype == gy.dtype
    np.testing.assert_allclose(gx.astype(np.float64), want, rtol=2e-3 if dtype == "float16" else 1e-12)
    assert not any("pool_vec" in c["name"] for c in emu.raw_launches)


def test_a_one_by_one_pooled_gradient_comes_back_in_the_nodes_layout(emu):
    """A global max pool's indices (1 x 1) have no storage order of their own: the
    gather lays its output out as the node's type says (NHWC here), not NCHW."""
    x = _hard_input((2, 8, 5, 5), "float32", 9)
    geometry = ((5, 5), (5, 5), ((0, 0), (0, 0)), False)
    idx = _run(_op(ops.MaxPool2dArgmax, geometry), [x], {})
    gy = channels_last(np.random.default_rng(3).standard_normal((2, 8, 1, 1)).astype(np.float32))
    gx = _run(_op(ops.MaxPool2dBackwardIndices, geometry, input_shape=x.shape), [idx, gy], {}, layout="NHWC")
    assert is_channels_last(gx) and gx.shape == x.shape
    g = _geometry(_op(ops.MaxPool2d, geometry), (5, 5), (1, 1))
    np.testing.assert_allclose(gx, ref_idx.max_pool2d_backward_indices(np, np.asarray(idx), gy, g, x.shape),
                               rtol=1e-6)


def test_indices_that_are_not_dense_channels_last_take_the_scalar_kernels(emu):
    geometry = GEOMETRIES[2]
    x = _hard_input((2, 16, 8, 8), "bfloat16", 4)
    idx = np.asarray(_run(_op(ops.MaxPool2dArgmax, geometry), [x], {"vector": True}))
    nchw = np.ascontiguousarray(idx)  # the same indices stored NCHW
    before = len(emu.raw_launches)
    y = _run(_op(ops.MaxPool2dTake, geometry), [x, nchw], {"vector": True})
    assert not any("pool_vec" in c["name"] for c in emu.raw_launches[before:])
    np.testing.assert_array_equal(_bits(y), _bits(np.asarray(ref_pool.max_pool2d(np, x, **_kw(geometry)))))


def test_windows_over_128_cells_keep_the_vector_forward_and_average_kernels():
    """Only the kernels that index a window's winner need its index in a byte."""
    types = [TensorType((2, 16, 14, 14), "bfloat16", "NHWC")]
    big = dict(kernel_size=(12, 12), stride=(1, 1))
    for op in (ops.MaxPool2d(**big), ops.AvgPool2d(**big)):
        assert {"vector": True} in rules.vector_pool_variants(op, types, "cuda")
    assert {"vector": True} not in rules.vector_pool_variants(ops.MaxPool2dBackwardRelu(**big), types * 2, "cuda")
    assert {"vector": True} in rules.vector_pool_variants(ops.MaxPool2dBackward(**big), types * 2, "cuda")


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_the_bfloat16_vector_take_reads_any_index_as_the_oracle_does(emu, geometry, masked):
    """Indices the argmax never writes: a cell in the padding or the ceil_mode
    overhang, an index past the window (-inf), marked lanes: the vector take
    of bfloat16 (which moves bits and tests each lane against the window's
    in-bounds cells) reads what the float64 oracle reads, bit for bit."""
    x = _hard_input((2, 16, 9, 11), "bfloat16", 3, "NHWC")
    op = _op(ops.MaxPool2dTake, geometry, masked=masked)
    pooled = _op(ops.MaxPool2d, geometry).output_shape(x.shape)
    g = _geometry(_op(ops.MaxPool2d, geometry), x.shape[2:], pooled[2:])
    k = geometry[0][0] * geometry[0][1]
    idx = channels_last(np.random.default_rng(4).integers(0, k + 3, size=pooled).astype(np.uint8))
    idx[0, ::3] += MASKED
    before = len(emu.raw_launches)
    y = _run(op, [x, idx], {"vector": True})
    assert any("pool_vec_take" in r["name"] for r in emu.raw_launches[before:])
    want = ref_idx.max_pool2d_take(np, np.asarray(x, np.float64), np.asarray(idx), g, masked=masked)
    np.testing.assert_array_equal(_bits(y), _bits(np.asarray(want).astype(x.dtype)))


@pytest.mark.parametrize("kernel", [(6, 6), (4, 8), (1, 32)], ids=["36-cells", "32-cells", "1x32"])
def test_the_bfloat16_vector_take_of_wide_windows(emu, kernel):
    """Windows of more than ``TAKE_BITS_CELLS`` (32) cells take the lane by lane
    kernel, those of exactly 32 (the bit ``1 << 31``) the bits kernel: both
    equal the oracle, bit for bit, on indices of every cell and past the window."""
    from opgraph.backends.cuda import pool_vector_lanes
    x = _hard_input((1, 16, 10, 40), "bfloat16", 6, "NHWC")
    geometry = (kernel, (1, 1), ((0, 0), (0, 0)), False)
    pooled = _op(ops.MaxPool2d, geometry).output_shape(x.shape)
    g = _geometry(_op(ops.MaxPool2d, geometry), x.shape[2:], pooled[2:])
    cells = kernel[0] * kernel[1]
    idx = channels_last(np.random.default_rng(5).integers(0, cells + 2, size=pooled).astype(np.uint8))
    idx[..., 0, 0] = cells - 1  # the last cell: bit 31 of a 32-cell window
    y = _run(_op(ops.MaxPool2dTake, geometry), [x, idx], {"vector": True})
    want = ref_idx.max_pool2d_take(np, np.asarray(x, np.float64), np.asarray(idx), g)
    np.testing.assert_array_equal(_bits(y), _bits(np.asarray(want).astype(x.dtype)))
    assert (cells <= pool_vector_lanes.TAKE_BITS_CELLS) == (cells != 36)


def test_the_bfloat16_take_quiets_a_signalling_nan_as_max_pooling_does(emu):
    """A signalling NaN winner (0x7f81) comes out quieted (0x7fc1) from the take,
    as from ``MaxPool2d``: the pool-argmax rewrite keeps the pooled bits."""
    x = _hard_input((1, 16, 6, 6), "bfloat16", 9, "NHWC")
    x[0, 3, 2, 2] = 0.0
    raw = np.asarray(x).view(np.uint16)
    raw[0, 3, 2, 2] = 0x7f81  # a signalling NaN
    geometry = GEOMETRIES[2]
    idx = _run(_op(ops.MaxPool2dArgmax, geometry), [x], {"vector": True})
    y = _run(_op(ops.MaxPool2dTake, geometry), [x, idx], {"vector": True})
    plain = _run(_op(ops.MaxPool2d, geometry), [x], {"vector": True})
    assert _bits(y)[0, 3, 1, 1] == 0x7fc1
    np.testing.assert_array_equal(_bits(y), _bits(plain))
