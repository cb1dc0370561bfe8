"""The ``tile`` variant of the bfloat16 max-pool window scan, take and gather
(``backends/cuda/pool_vector.py``: ``_scan_tile``, ``_take_tile``, ``_gather_tile``) on the CPU,
through the g++ emulator of their CUDA text (``__syncthreads`` and shared
memory included): bit for bit the pair kernels' results (``_scan_pairs``,
``_gather_pairs``, ``_take_bits``) and the float64 oracle's indices, on SEMANTICS.md's hard
cases (ties of -0.0 and +0.0, windows of -inf, NaN and signalling NaN in some lanes, padding and
the ceil_mode overhang, the ReLU mark), for GoogLeNet's 3x3/1 and 3x3/2 and
VGG's 2x2/2 windows and an asymmetric padding, on odd extents, with x or gy a
channel slice of a wider buffer, with the default tiles and with small ones
(partial tiles at every edge, several tiles per row and column, channel
blocks); the gradients summed in window order; the rules offer the variant
for bfloat16 windows it takes."""

from __future__ import annotations

import numpy as np
import pytest

from codegen_cases import channels_last
from cuda_cpu_emulator import GXX, NVCC, EmulatedCupy, nvcc_check
from cupy_standin import cupy_replaced
from opgraph import ops
from opgraph.backends.cuda import pool, pool_vector, rules
from opgraph.backends.cuda.codegen import launch
from opgraph.backends.reference import pool as ref_pool, pool_indices as ref_idx
from opgraph.backends.registry import KernelContext
from opgraph.ops.pool_indices import MASKED
from opgraph.types import TensorType, numpy_dtype

needs_gxx = pytest.mark.skipif(GXX is None, reason="no g++: the kernels' CUDA text cannot run on the CPU")

BF16 = numpy_dtype("bfloat16")
#: (kernel_size, stride, padding, ceil_mode): GoogLeNet's 3x3/2 ceil_mode and its
#: inception's 3x3/1 padded, VGG's 2x2/2, an asymmetric padding with ceil_mode
GEOMETRIES = [((3, 3), (2, 2), ((0, 0), (0, 0)), True), ((3, 3), (1, 1), ((1, 1), (1, 1)), False),
              ((2, 2), (2, 2), ((0, 0), (0, 0)), False), ((3, 3), (2, 2), ((1, 0), (0, 1)), True)]
IDS = ["3x3s2-ceil", "3x3s1p1", "2x2s2", "3x3s2-asym"]
#: the default tile, and small ones: 2-3 tiles down and across a 9 x 11 plane, with
#: partial tiles at the far edges, and 1 or 3 channel groups of 16 bytes per block
#: (the gather's a multiple of the strides)
SCAN_TILES = {"default": True, "small": pool_vector.TileShape(3, 4, 1), "groups": pool_vector.TileShape(2, 3, 3)}
GATHER_TILES = {"default": True, "small": pool_vector.TileShape(2, 4, 1), "groups": pool_vector.TileShape(4, 2, 3)}
SHAPE = (2, 24, 9, 11)


@pytest.fixture
def emu(monkeypatch):
    with cupy_replaced(monkeypatch, EmulatedCupy(), launch.compiled, pool._compiled) as e:
        yield e


def _geometry(geometry, shape=SHAPE):
    k, s, p, ceil = geometry
    op = ops.MaxPool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    return ref_pool.node_geometry(op, shape[2:], op.output_shape(shape)[2:])


def _hard_x(shape=SHAPE, seed=1):
    """Ties of -0.0 and +0.0 and of small integers, a corner of -inf (whole windows),
    a block of -0.0 with one +0.0, and NaN in single lanes of a pixel's 8."""
    rng = np.random.default_rng(seed)
    values = np.array([-0.0, 0.0, -1.0, 1.0, 2.0, np.inf, -np.inf], np.float32)
    x = values[rng.integers(0, len(values), size=shape)]
    x[0, :, :4, :4] = -np.inf
    x[1, 8:, 5:, 5:] = -0.0
    x[1, 8:, 6, 6] = 0.0
    x[1, 3, 4, 5] = x[1, 12, 0, 0] = x[0, 20, 8, 10] = np.nan
    return x


def _gy(shape, seed=2):
    rng = np.random.default_rng(seed)
    g = np.array([-0.0, 0.0, 0.5, -2.0, 3.0, np.inf, -np.inf, np.nan], np.float32)
    return np.where(rng.random(shape) < 0.6, rng.standard_normal(shape).astype(np.float32),
                    g[rng.integers(0, len(g), size=shape)])


def _bf16(a, sliced=False):
    """Channels-last bfloat16 of float32 ``a``; ``sliced``: channels 8.. of a buffer 16 wider (the pitch)."""
    b = channels_last(a.astype(BF16))
    if not sliced:
        return b
    n, c, h, w = a.shape
    wide = channels_last(np.zeros((n, c + 16, h, w), BF16))
    wide[:, 8:8 + c] = b
    return wide[:, 8:8 + c]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8 if a.dtype == np.uint8 else np.uint16)


def _same_gradients(got, want):
    """Bit for bit, but that two NaNs are the same: a NaN made by the sums (inf - inf,
    a NaN gradient) carries the host's payload on the emulator (x86: sign set), picked
    by the operand order g++ gives each addition; the GPU's are all the canonical NaN."""
    g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    np.testing.assert_array_equal(np.where(np.isnan(g), 0, _bits(got)), np.where(np.isnan(w), 0, _bits(want)))


def _names(emu, before):
    return [r["name"] for r in emu.raw_launches[before:]]


@needs_gxx
@pytest.mark.parametrize("sliced", [False, True], ids=["dense", "slice"])
@pytest.mark.parametrize("tile", SCAN_TILES, ids=list(SCAN_TILES))
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_the_tile_scan_equals_the_pair_scan_and_the_oracle(emu, geometry, tile, sliced):
    """Unmarked and with the ReLU mark: every index byte the pair kernel's and the
    float64 oracle's (first maximum in row-major order, NaN wins, padding never)."""
    x = _bf16(_hard_x(), sliced)
    g = _geometry(geometry)
    for relu in (False, True):
        before = len(emu.raw_launches)
        got = pool_vector.max_pool2d_argmax(np, x, g, relu, tile=SCAN_TILES[tile])
        assert all("pool_tile_arg" in n for n in _names(emu, before)), _names(emu, before)
        want = pool_vector.max_pool2d_argmax(np, x, g, relu)
        np.testing.assert_array_equal(_bits(got), _bits(want))
        _, oracle = ref_idx.max_pool2d_with_indices(np, np.asarray(x, np.float64), g, relu)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(oracle))
        assert (np.asarray(got) >= MASKED).any() == relu


@needs_gxx
@pytest.mark.parametrize("sliced", [False, True], ids=["dense", "slice"])
@pytest.mark.parametrize("tile", GATHER_TILES, ids=list(GATHER_TILES))
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_the_tile_gather_equals_the_pair_gather_and_the_oracle(emu, geometry, tile, sliced):
    """Masked and not, from the oracle's marked winners with some bytes the scan never
    writes (a cell past the window, marked ones): gy of -0.0, +-inf and NaN among
    normal values, read at its pitch; the pair gather's bits, the oracle's values."""
    x = _hard_x()
    g = _geometry(geometry)
    _, idx = ref_idx.max_pool2d_with_indices(np, x.astype(np.float64), g, relu=True)
    idx = np.array(idx)
    rng = np.random.default_rng(3)
    odd = rng.random(idx.shape) < 0.1
    idx[odd] = rng.integers(0, g.kernel[0] * g.kernel[1] + 3, size=odd.sum()) + MASKED * rng.integers(0, 2, odd.sum())
    idx = channels_last(idx.astype(np.uint8))
    gy32 = _gy(idx.shape)
    gy = _bf16(gy32, sliced)
    for masked in (False, True):
        before = len(emu.raw_launches)
        got = pool_vector.max_pool2d_backward_indices(np, idx, gy, g, SHAPE, masked, tile=GATHER_TILES[tile])
        assert all("pool_tile_bwd" in n for n in _names(emu, before)), _names(emu, before)
        want = pool_vector.max_pool2d_backward_indices(np, idx, gy, g, SHAPE, masked)
        _same_gradients(got, want)
        with np.errstate(invalid="ignore"):  # inf - inf in the oracle's sums: NaN, as in the kernels'
            oracle = ref_idx.max_pool2d_backward_indices(np, np.asarray(idx), np.asarray(gy, np.float64), g, SHAPE,
                                                         masked=masked)
        np.testing.assert_allclose(np.asarray(got, np.float64), oracle, rtol=1e-2, atol=1e-6)


def _with_signalling_nans(x):
    """``x`` (bfloat16, possibly a view) with signalling NaNs (0x7f81, 0xffa0: the
    quiet bit 0x0040 clear) in single lanes, some alone in their windows, one beside
    a quiet NaN; the take quiets them (0x7fc1, 0xffe0)."""
    b = x.view(np.uint16)
    b[0, 5, 2, 3] = b[1, 17, 6, 7] = b[0, 3, 8, 10] = 0x7f81
    b[1, 9, 0, 0] = b[0, 21, 4, 4] = b[1, 3, 4, 6] = 0xffa0
    return x


@needs_gxx
@pytest.mark.parametrize("sliced", [False, True], ids=["dense", "slice"])
@pytest.mark.parametrize("tile", SCAN_TILES, ids=list(SCAN_TILES))
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_the_tile_take_equals_the_bits_take_and_the_oracle(emu, geometry, tile, sliced):
    """Masked and not: x of -0.0/+0.0 ties, -inf windows, quiet and signalling NaN
    lanes, read at its pitch; the oracle's marked winners with some bytes the scan
    never writes (a cell past the window, a padding cell, marked ones): bit for bit
    ``_take_bits``' y, signalling NaNs quieted as there, and the float64 oracle's
    values (its NaNs unquieted, so compared as NaN). The winners are unmarked (a
    NaN winner is taken when masked too), 10 % of the bytes replaced by any
    cell of the window or past it, marked or not."""
    x = _with_signalling_nans(_bf16(_hard_x(), sliced))
    g = _geometry(geometry)
    with np.errstate(invalid="ignore"):  # the signalling NaNs' cast
        _, idx = ref_idx.max_pool2d_with_indices(np, np.asarray(x, np.float64), g)  # unmarked: NaN winners taken
    idx = np.array(idx)
    rng = np.random.default_rng(9)
    odd = rng.random(idx.shape) < 0.1
    idx[odd] = rng.integers(0, g.kernel[0] * g.kernel[1] + 3, size=odd.sum()) + MASKED * rng.integers(0, 2, odd.sum())
    idx = channels_last(idx.astype(np.uint8))
    for masked in (False, True):
        before = len(emu.raw_launches)
        got = pool_vector.max_pool2d_take(np, x, idx, g, masked, tile=SCAN_TILES[tile])
        assert all("pool_tile_take" in n for n in _names(emu, before)), _names(emu, before)
        before = len(emu.raw_launches)
        want = pool_vector.max_pool2d_take(np, x, idx, g, masked)
        assert all("pool_vec_take" in n for n in _names(emu, before)), _names(emu, before)
        np.testing.assert_array_equal(_bits(got), _bits(want))
        taken = set(np.unique(_bits(got)).tolist())
        assert {0x7fc1, 0xffe0} <= taken and not {0x7f81, 0xffa0} & taken  # quieted, as _take_bits does
        assert {0x8000, 0x0000, 0xff80} <= taken  # -0.0 and +0.0 winners, -inf (padding, past the window)
        _same_gradients(got, ref_idx.max_pool2d_take(np, x, idx, g, masked=masked))


@needs_gxx
@pytest.mark.parametrize("geometry", GEOMETRIES[:3], ids=IDS[:3])
@pytest.mark.parametrize("kind", [ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu, ops.MaxPool2dArgmax,
                                  ops.MaxPool2dTake, ops.MaxPool2dBackwardIndices], ids=lambda k: k.__name__)
def test_the_node_kernels_take_the_tile_option(emu, kind, geometry):
    """The ``tile`` option of the ``cuda`` rules runs the tile kernels (the
    recomputing backward both, the saved-winner ops one each): the ``vector``
    variant's bits, and the float64 reference's values."""
    x = _with_signalling_nans(_bf16(_hard_x(seed=4)))
    k, s, p, ceil = geometry
    params = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    pooled = ops.MaxPool2d(**params).output_shape(x.shape)
    gy = _bf16(_gy(pooled, seed=5), sliced=True)
    if kind is ops.MaxPool2dArgmax:
        op, arrays = kind(relu=True, **params), [x]
    elif kind is ops.MaxPool2dBackwardIndices:
        idx = pool_vector.max_pool2d_argmax(np, x, _geometry(geometry), relu=True)
        op, arrays = kind(masked=True, input_shape=x.shape, **params), [idx, gy]
    elif kind is ops.MaxPool2dTake:
        idx = pool_vector.max_pool2d_argmax(np, x, _geometry(geometry), relu=True)
        op, arrays = kind(masked=True, **params), [x, idx]
    else:
        op, arrays = kind(**params), [x, gy]
    t = op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays))
    run = {}
    for name, options in (("tile", {"vector": True, "tile": True}), ("vector", {"vector": True})):
        before = len(emu.raw_launches)
        ctx = KernelContext(np, "cuda", options, TensorType(t.shape, t.dtype, "NHWC"))
        run[name] = rules.POOL_KERNELS[type(op)](ctx, op, *arrays)
        assert any("pool_tile" in n for n in _names(emu, before)) == (name == "tile"), _names(emu, before)
    if kind in (ops.MaxPool2dArgmax, ops.MaxPool2dTake):
        np.testing.assert_array_equal(_bits(run["tile"]), _bits(run["vector"]))
    else:
        _same_gradients(run["tile"], run["vector"])
    if kind in (ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu):
        ref = ref_pool.max_pool2d_backward if kind is ops.MaxPool2dBackward else ref_pool.max_pool2d_backward_relu
        with np.errstate(invalid="ignore"):
            want = ref(np, *(np.asarray(a, np.float64) for a in arrays), **params)
        np.testing.assert_allclose(np.asarray(run["tile"], np.float64), want, rtol=1e-2, atol=1e-6)


@needs_gxx
def test_the_gather_sums_in_window_order(emu):
    """A pixel winning all nine windows of a 3x3/1 pool gets 1.0, 2^-24, -1.0, ...
    in window order (``oh``, then ``ow``): float32 addition in that order gives
    0 + 1 + 2^-24 = 1 (rounded to even), then 0, then 2^-24; any other order of
    the first three gives another sum. Both gathers give the ordered sum."""
    x = np.full((1, 8, 5, 5), -1.0, np.float32)
    x[0, :, 2, 2] = 5.0  # wins windows (1..3, 1..3) of the 5x5 output
    g = _geometry(GEOMETRIES[1], x.shape)
    gy32 = np.zeros((1, 8, 5, 5), np.float32)
    order = [1.0, 2.0 ** -24, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0 ** -24]
    for i, (oh, ow) in enumerate((a, b) for a in (1, 2, 3) for b in (1, 2, 3)):
        gy32[0, :, oh, ow] = order[i]
    idx = pool_vector.max_pool2d_argmax(np, _bf16(x), g)
    acc = np.float32(0)
    for v in order:
        acc = np.float32(acc + np.float32(v))
    assert acc == np.float32(2.0 ** -24) and sum(order) == 2.0 ** -23
    for tile in (True, pool_vector.TileShape(2, 2, 1)):
        got = pool_vector.max_pool2d_backward_indices(np, idx, _bf16(gy32), g, x.shape, tile=tile)
        assert (np.asarray(got, np.float32)[0, :, 2, 2] == acc).all()
        want = pool_vector.max_pool2d_backward_indices(np, idx, _bf16(gy32), g, x.shape)
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_the_variant_is_offered_for_bfloat16_windows_it_takes():
    """Offered beside the other ``vector`` variants for the bfloat16 scan, take and
    gather of windows and strides up to ``TILE_WINDOW``; not for float32, for the
    forward max pooling or average pooling, nor a 5x5 window."""
    nhwc = TensorType((8, 64, 28, 28), "bfloat16", "NHWC")
    pooled = TensorType((8, 64, 14, 14), "bfloat16", "NHWC")
    index = TensorType((8, 64, 14, 14), "uint8", "NHWC")
    k3 = dict(kernel_size=(3, 3), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=True)
    tile = {"vector": True, "tile": True}
    cases = [(ops.MaxPool2dBackward(**k3), [nhwc, pooled]), (ops.MaxPool2dBackwardRelu(**k3), [nhwc, pooled]),
             (ops.MaxPool2dArgmax(relu=True, **k3), [nhwc]), (ops.MaxPool2dTake(masked=True, **k3), [nhwc, index]),
             (ops.MaxPool2dBackwardIndices(input_shape=nhwc.shape, **k3), [index, pooled])]
    for op, types in cases:
        variants = rules.vector_pool_variants(op, types, "cuda")
        assert tile in variants and {"vector": True} in variants
        assert "tile" in rules.OPTIONS[type(op)][0]
        f32 = [TensorType(t.shape, "float32" if t.dtype == "bfloat16" else t.dtype, "NHWC") for t in types]
        assert tile not in rules.vector_pool_variants(op, f32, "cuda")
    for op, types in ((ops.MaxPool2d(**k3), [nhwc]), (ops.AvgPool2d(**k3), [nhwc])):
        assert tile not in rules.vector_pool_variants(op, types, "cuda")
    big = dict(kernel_size=(5, 5), stride=(1, 1), padding=((2, 2), (2, 2)))
    assert tile not in rules.vector_pool_variants(ops.MaxPool2dBackward(**big), [nhwc, nhwc], "cuda")
    assert tile not in rules.vector_pool_variants(ops.MaxPool2dTake(**big), [nhwc, TensorType(nhwc.shape, "uint8",
                                                                                            "NHWC")], "cuda")
    assert pool_vector.tile_declines("bfloat16", (5, 5), (1, 1)) is not None
    assert pool_vector.tile_declines("bfloat16", (3, 3), (2, 2)) is None


@needs_gxx
def test_windows_the_tiles_decline_and_grids_too_tall_take_the_pair_kernels(emu, monkeypatch):
    """A 5x5 window, or (a smaller grid limit standing in for) more tile rows or
    images than a grid's y and z extents: ``tile`` launches the pair kernels."""
    x = _bf16(_hard_x(seed=6))
    big = ref_pool.node_geometry(ops.MaxPool2d(kernel_size=5, stride=1, padding=2), SHAPE[2:], SHAPE[2:])
    before = len(emu.raw_launches)
    got = pool_vector.max_pool2d_argmax(np, x, big, tile=True)
    assert _names(emu, before) and not any("pool_tile" in n for n in _names(emu, before))
    np.testing.assert_array_equal(_bits(got), _bits(pool_vector.max_pool2d_argmax(np, x, big)))
    monkeypatch.setattr(pool_vector, "GRID_YZ_LIMIT", 1)
    g = _geometry(GEOMETRIES[1])
    before = len(emu.raw_launches)
    got = pool_vector.max_pool2d_argmax(np, x, g, tile=True)
    assert not any("pool_tile" in n for n in _names(emu, before))
    np.testing.assert_array_equal(_bits(got), _bits(pool_vector.max_pool2d_argmax(np, x, g)))


@needs_gxx
def test_64_bit_offsets_give_the_same_bits(emu, monkeypatch):
    """Operands of 2^31 elements or more take the kernels with 64-bit offsets
    (``IDX`` long long; forced here by a smaller threshold): the same bits."""
    x = _bf16(_hard_x(seed=7), sliced=True)
    g = _geometry(GEOMETRIES[3])
    # the existing (pair / bits) kernels are the reference, not the 32-bit tile build
    want_idx = pool_vector.max_pool2d_argmax(np, x, g, relu=True)
    gy = _bf16(_gy(want_idx.shape, seed=8), sliced=True)
    want_gx = pool_vector.max_pool2d_backward_indices(np, want_idx, gy, g, SHAPE, True)
    want_y = pool_vector.max_pool2d_take(np, x, want_idx, g, True)
    monkeypatch.setattr(pool_vector, "TILE_WIDE_SPAN", 1)
    before = len(emu.raw_launches)
    got_idx = pool_vector.max_pool2d_argmax(np, x, g, relu=True, tile=True)
    got_gx = pool_vector.max_pool2d_backward_indices(np, got_idx, gy, g, SHAPE, True, tile=True)
    got_y = pool_vector.max_pool2d_take(np, x, got_idx, g, True, tile=True)
    names = _names(emu, before)
    assert len(names) == 3 and all("pool_tile" in n and "_i64_" in n for n in names), names
    np.testing.assert_array_equal(_bits(got_idx), _bits(want_idx))
    _same_gradients(got_gx, want_gx)
    np.testing.assert_array_equal(_bits(got_y), _bits(want_y))


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
@pytest.mark.parametrize("window", [(3, 3, 1, 1), (3, 3, 2, 2), (2, 2, 2, 2)], ids=["3x3s1", "3x3s2", "2x2s2"])
def test_the_tile_kernels_compile_for_sm90_with_the_pair_instructions(window):
    """nvcc (PTX for sm_90, as NVRTC compiles them on the H200) takes the tile
    kernels' text, and they use the bf16x2 instructions, the byte permute and
    the launch bound: the paths the CPU emulator replaces with C."""
    for kind, relu, masked in (("arg", True, True), ("arg", False, True), ("bwd", False, True), ("bwd", False, False),
                               ("take", False, True), ("take", False, False)):
        t = pool_vector.tile_shape(kind, window, (28, 28), 24)
        name, source = pool_vector._tile_source(kind, False, window, t, relu, masked)
        ptx = nvcc_check([source])
        assert f".entry {name}__0(" in ptx and f".maxntid {t.cols * t.groups}, 1, 1" in ptx
        if kind == "take":
            assert "ld.shared.u16" in ptx and "ld.global.nc.v4" in ptx
        elif kind == "arg":
            assert "max.NaN.bf16x2" in ptx and "set.gt.u32.bf16x2" in ptx and "prmt.b32" in ptx
        else:
            assert "set.eq.u32.bf16x2" in ptx and "cvt.rn.bf16x2.f32" in ptx and "prmt.b32" in ptx
