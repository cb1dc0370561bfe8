"""The one-scan max pooling that writes the pooled value and its winners
(``MaxPool2dScan`` into a ``MaxPool2dArgmaxSlot``) on the CPU, through the g++
emulator of its CUDA text: the vector kernels (``pool_vector.max_pool2d_scan``:
lane by lane for float32, bfloat16 pairs, 1, 2 or 4 output columns per
thread, and the bfloat16 shared-memory ``tile``) give ``y`` bit for bit as the
existing ``fwd`` max pool and the indices byte for byte as the existing ``arg``
kernels (relu: marked where the winner is not > 0, ``y`` still the plain
maximum), on SEMANTICS.md's hard cases (ties of -0.0 and +0.0, windows of
-inf, NaN and signalling NaN lanes, padding, the ceil_mode overhang); the
``cuda`` node kernels (scan and slot) on NCHW and NHWC, float32, float16 and
bfloat16, against the reference rules, and the scalar fallback where the slot
is not what the vector path writes."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from codegen_cases import channels_last
from cuda_cpu_emulator import GXX, EmulatedCupy
from cupy_standin import cupy_replaced
from opgraph import ops
from opgraph.backends.cuda import pool, pool_vector, rules
from opgraph.backends.cuda.storage import empty_in_layout
from opgraph.backends.cuda.codegen import launch
from opgraph.backends.reference import pool as ref_pool, pool_indices as ref_idx
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.ops.pool_indices import MASKED
from opgraph.types import TensorType, is_channels_last, numpy_dtype

pytestmark = pytest.mark.skipif(GXX is None, reason="no g++: the kernels' CUDA text cannot run on the CPU")

BF16 = numpy_dtype("bfloat16")
#: (kernel_size, stride, padding, ceil_mode): GoogLeNet's inception 3x3/1 padded and its
#: 3x3/2 ceil_mode, VGG's 2x2/2, a 7x7/2 padded window (beyond the tiles' 4x4)
GEOMETRIES = {"3x3s1p1": ((3, 3), (1, 1), ((1, 1), (1, 1)), False),
              "3x3s2-ceil": ((3, 3), (2, 2), ((0, 0), (0, 0)), True),
              "2x2s2": ((2, 2), (2, 2), ((0, 0), (0, 0)), False),
              "7x7s2p3": ((7, 7), (2, 2), ((3, 3), (3, 3)), False)}
SHAPE = (2, 16, 9, 11)


@pytest.fixture
def emu(monkeypatch):
    with cupy_replaced(monkeypatch, EmulatedCupy(), launch.compiled, pool._compiled) as e:
        yield e


def _params(name):
    k, s, p, ceil = GEOMETRIES[name]
    return dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)


def _geometry(name, shape=SHAPE):
    op = ops.MaxPool2d(**_params(name))
    return ref_pool.node_geometry(op, shape[2:], op.output_shape(shape)[2:])


def _hard_x(dtype, shape=SHAPE, seed=1, layout="NHWC"):
    """Ties of -0.0 and +0.0 and of small integers, a corner of -inf (whole
    windows), NaN in single lanes; bfloat16 also signalling NaNs (0x7f81, 0xffa0),
    which the pooled value quiets (0x7fc1, 0xffe0)."""
    rng = np.random.default_rng(seed)
    values = np.array([-0.0, 0.0, -1.0, 1.0, 2.0, np.inf, -np.inf], np.float32)
    x = values[rng.integers(0, len(values), size=shape)]
    x[0, :, :4, :4] = -np.inf
    x[1, 8:, 5:, 5:] = -0.0
    x[1, 8:, 6, 6] = 0.0
    x[1, 3, 4, 5] = x[1, 12, 0, 0] = x[0, 10, 8, 10] = np.nan
    x = x.astype(numpy_dtype(dtype))
    if dtype == "bfloat16":
        b = x.view(np.uint16)
        b[0, 5, 2, 3] = b[1, 15, 6, 7] = 0x7f81
        b[1, 9, 0, 0] = 0xffa0
    return channels_last(x) if layout == "NHWC" else x


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _slot(shape, fill=0xAB):
    """A channels-last uint8 slot of logical ``shape``, every byte ``fill`` (so a byte left unwritten shows)."""
    n, c, h, w = shape
    return np.full((n, h, w, c), fill, np.uint8).transpose(0, 3, 1, 2)


def _names(emu, before):
    return [r["name"] for r in emu.raw_launches[before:]]


@pytest.mark.parametrize("pixels", [1, 2, 4])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_lanes_scan_equals_the_fwd_and_arg_kernels(emu, dtype, geometry, pixels):
    """y: the ``fwd`` max pool's bits (signalling NaNs quieted as there); the slot:
    the ``arg`` kernel's bytes, marked with relu (and y unmasked), every byte written."""
    x = _hard_x(dtype)
    g = _geometry(geometry)
    want_y = pool_vector.max_pool2d(np, x, g)
    for relu in (False, True):
        slot = _slot((*SHAPE[:2], *g.out))
        before = len(emu.raw_launches)
        y = pool_vector.max_pool2d_scan(np, x, slot, g, relu, pixels)
        names = _names(emu, before)
        assert len(names) == 1 and names[0].startswith("opgraph_pool_vec_scan"), names
        assert ("_relu_" in names[0]) == relu and (f"_p{pixels}" in names[0]) == (pixels != 1)
        assert y.dtype == x.dtype and y.shape == (*SHAPE[:2], *g.out) and is_channels_last(y)
        np.testing.assert_array_equal(_bits(y), _bits(want_y))
        np.testing.assert_array_equal(_bits(slot), _bits(pool_vector.max_pool2d_argmax(np, x, g, relu)))
        assert (np.asarray(slot) >= MASKED).any() == relu
    if dtype == "bfloat16":
        taken = set(np.unique(_bits(y)).tolist())
        assert 0x7fc1 in taken and 0x7f81 not in taken
        if geometry != "7x7s2p3":  # small windows: -0.0 and +0.0 winners, windows of -inf
            assert {0x8000, 0x0000, 0xff80} <= taken


@pytest.mark.parametrize("tile", [True, pool_vector.TileShape(3, 4, 1), pool_vector.TileShape(2, 3, 2)],
                         ids=["default", "small", "groups"])
@pytest.mark.parametrize("geometry", ["3x3s1p1", "3x3s2-ceil", "2x2s2"])
def test_the_tile_scan_equals_the_fwd_and_arg_kernels(emu, geometry, tile):
    """bfloat16 from shared-memory tiles (partial tiles at the edges, channel blocks):
    the 16-byte store of the maxima and its NaN slow path (windows holding a
    quiet or a signalling NaN lane) give the ``fwd`` bits and the ``arg`` bytes;
    with relu the bytes are marked, the maxima not."""
    x = _hard_x("bfloat16", (2, 32, 9, 11), seed=3)
    g = _geometry(geometry, x.shape)
    want_y = pool_vector.max_pool2d(np, x, g)
    for relu in (False, True):
        slot = _slot((*x.shape[:2], *g.out))
        before = len(emu.raw_launches)
        y = pool_vector.max_pool2d_scan(np, x, slot, g, relu, tile=tile)
        names = _names(emu, before)
        assert len(names) == 1 and names[0].startswith("opgraph_pool_tile_scan"), names
        np.testing.assert_array_equal(_bits(y), _bits(want_y))
        np.testing.assert_array_equal(_bits(slot), _bits(pool_vector.max_pool2d_argmax(np, x, g, relu)))


def test_a_window_the_tiles_decline_takes_the_pair_scan(emu):
    x = _hard_x("bfloat16")
    g = _geometry("7x7s2p3")
    slot = _slot((*SHAPE[:2], *g.out))
    before = len(emu.raw_launches)
    y = pool_vector.max_pool2d_scan(np, x, slot, g, relu=True, tile=True)
    assert [n.startswith("opgraph_pool_vec_scan_relu_bfloat16") for n in _names(emu, before)] == [True]
    np.testing.assert_array_equal(_bits(y), _bits(pool_vector.max_pool2d(np, x, g)))
    np.testing.assert_array_equal(_bits(slot), _bits(pool_vector.max_pool2d_argmax(np, x, g, True)))


def test_the_scan_kernels_are_new_names_beside_the_old_ones():
    """The existing kernels' names (and so their autotune decisions and text) stay."""
    from opgraph.backends.cuda.pool_vector_lanes import _source
    from opgraph.backends.cuda.pool_vector_tile_kernels import _tile_source
    window = (3, 3, 1, 1, 3, 3)
    names = {kind: _source(kind, "bfloat16", False, window, True, 2)[0] for kind in ("fwd", "arg", "scan")}
    assert len(set(names.values())) == 3 and "opgraph_pool_vec_scan_relu_" in names["scan"]
    t = pool_vector.TileShape(4, 8, 2)
    scan, text = _tile_source("scan", False, window[:4], t, True)
    assert scan.startswith("opgraph_pool_tile_scan_relu_")
    assert scan != _tile_source("arg", False, window[:4], t, True)[0]
    assert "unsigned short* __restrict__ y, unsigned char* __restrict__ arg" in text


# ---- the node kernels, emulated, against the reference rules

def _ctx(options, out_type):
    return KernelContext(np, "cuda", options, out_type)


def _run_pair(params, x, options, layout, relu):
    """The slot's and the scan's ``cuda`` node kernels: ``(y, slot)``."""
    slot_op, scan_op = ops.MaxPool2dArgmaxSlot(relu=relu, **params), ops.MaxPool2dScan(relu=relu, **params)
    xt = TensorType(x.shape, x.dtype.name, layout)
    st = slot_op.infer(xt)
    slot = rules.NODE_KERNELS[ops.MaxPool2dArgmaxSlot](_ctx({}, TensorType(st.shape, st.dtype, layout)), slot_op, x)
    assert slot.dtype == np.uint8 and slot.shape == st.shape and is_channels_last(slot) == (layout == "NHWC")
    yt = scan_op.infer(xt, st)
    y = rules.POOL_KERNELS[ops.MaxPool2dScan](_ctx(options, TensorType(yt.shape, yt.dtype, layout)), scan_op, x, slot)
    return y, slot


def _reference_pair(params, x, relu):
    """The reference rules of the slot and the scan (on a copy of the slot): ``(y, slot)``."""
    slot_op, scan_op = ops.MaxPool2dArgmaxSlot(relu=relu, **params), ops.MaxPool2dScan(relu=relu, **params)
    ref_ctx = KernelContext(np, "cpu", {}, None)
    value = rules_for(ops.MaxPool2dArgmaxSlot)["reference"].kernel(ref_ctx, slot_op, x)
    slot = np.full_like(value, 0xAB)
    y = rules_for(ops.MaxPool2dScan)["reference"].kernel(ref_ctx, scan_op, x, slot)
    np.testing.assert_array_equal(slot, value)  # the scan writes the slot's own value
    return y, slot


VARIANTS = {"scalar": {}, "vector": {"vector": True}, "vector-p4": {"vector": True, "pixels": 4},
            "tile": {"vector": True, "tile": True}}


@pytest.mark.parametrize("options", list(VARIANTS))
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_node_kernels_equal_the_reference_rules(emu, dtype, layout, options):
    """y bit for bit the reference's (``MaxPool2d``), the slot's bytes the reference
    argmax's, in the slot's layout; the vector kernels ran exactly where x is
    bfloat16 or float32 channels-last (the tile one where the option asks)."""
    params = _params("3x3s2-ceil")
    x = _hard_x(dtype, layout=layout)
    for relu in (False, True):
        before = len(emu.raw_launches) + len(emu.launches)
        y, slot = _run_pair(params, x, VARIANTS[options], layout, relu)
        names = [c["name"] for c in (emu.raw_launches + emu.launches)][before:]
        with np.errstate(invalid="ignore"):  # the signalling NaNs' casts in the reference
            want_y, want_slot = _reference_pair(params, x, relu)
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(slot), np.asarray(want_slot))
        got, want = np.asarray(y, np.float32), np.asarray(want_y, np.float32)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.where(np.isnan(got), 0, _bits(y)), np.where(np.isnan(want), 0, _bits(want_y)))
        vectored = options != "scalar" and layout == "NHWC" and dtype != "float16"
        assert names and all(("pool_vec_scan" in n or "pool_tile_scan" in n) == vectored for n in names), names
        assert any("pool_tile_scan" in n for n in names) == (vectored and options == "tile" and dtype == "bfloat16")


@pytest.mark.parametrize("geometry", ["3x3s1p1", "2x2s2", "7x7s2p3"])
def test_the_scan_node_equals_the_argmax_and_take_nodes(emu, geometry):
    """The scan node gives what today's pair of nodes gives (argmax, then take), for
    each window, vector and scalar."""
    params = _params(geometry)
    x = _hard_x("bfloat16", seed=5)
    t = TensorType(x.shape, "bfloat16", "NHWC")
    for options in ({}, {"vector": True, "pixels": 2}):
        y, slot = _run_pair(params, x, options, "NHWC", relu=True)
        arg_op = ops.MaxPool2dArgmax(relu=True, **params)
        it = arg_op.infer(t)
        idx = rules.POOL_KERNELS[ops.MaxPool2dArgmax](_ctx(options, it), arg_op, x)
        take_op = ops.MaxPool2dTake(**params)
        taken = rules.POOL_KERNELS[ops.MaxPool2dTake](_ctx(options, take_op.infer(t, it)), take_op, x, idx)
        np.testing.assert_array_equal(_bits(slot), _bits(idx))
        np.testing.assert_array_equal(_bits(y), _bits(taken))


def test_a_slot_the_vector_path_does_not_take_gets_the_scalar_indices(emu):
    """An NCHW slot beside channels-last x (and one whose buffer is not 16-byte
    aligned): the scalar scan runs and its indices are copied into the slot,
    which keeps its layout."""
    params = _params("3x3s1p1")
    x = _hard_x("float32")
    op = ops.MaxPool2dScan(relu=True, **params)
    shape = op.infer(TensorType(x.shape, "float32"), TensorType((*SHAPE[:2], 9, 11), "uint8")).shape
    g = _geometry("3x3s1p1")
    _, want = ref_idx.max_pool2d_with_indices(np, np.asarray(x, np.float64), g, relu=True)
    raw = np.full(int(np.prod(shape)) + 1, 0xAB, np.uint8)
    n, c, h, w = shape
    unaligned = raw[1:].reshape(n, h, w, c).transpose(0, 3, 1, 2)
    for slot in (np.full(shape, 0xAB, np.uint8), unaligned):
        assert not pool_vector.indices_apply(slot)
        before = len(emu.raw_launches) + len(emu.launches)
        y = rules.POOL_KERNELS[ops.MaxPool2dScan](_ctx({"vector": True}, TensorType(shape, "float32", "NHWC")),
                                                 op, x, slot)
        names = [c["name"] for c in (emu.raw_launches + emu.launches)][before:]
        assert names and not any("pool_vec" in n for n in names), names
        np.testing.assert_array_equal(slot, want)
        np.testing.assert_array_equal(_bits(y), _bits(pool_vector.max_pool2d(np, x, g)))


#: Bytes of Python objects the emulator makes per launch (the kernel's text, its argument
#: arrays): well under the temporaries the cases below would show (256 KiB of winners at least)
EMULATOR_BYTES = 64 * 1024
ONE_PIXEL = dict(kernel_size=(2, 2), stride=(1, 1), padding=((1, 1), (1, 1)), ceil_mode=False)
#: case -> (dtype, x's layout, the slot's layout, x's shape, window): the scalar scan (no
#: ``vector`` option) of 256 KiB of winners or more, into a slot its kernel writes itself (the
#: first three, as the slot's step allocates it for x's layout) or through a temporary (an NCHW
#: slot beside channels-last x; a slot of four pixels in the node's NHWC beside a one-pixel x,
#: which the kernels index in NCHW order, the same memory)
SCRATCH_CASES = {
    "float32-NHWC": ("float32", "NHWC", "NHWC", (2, 32, 128, 128), _params("3x3s2-ceil")),
    "bfloat16-NCHW": ("bfloat16", "NCHW", "NCHW", (2, 32, 128, 128), _params("3x3s2-ceil")),
    "float16-NHWC": ("float16", "NHWC", "NHWC", (2, 32, 64, 64), _params("2x2s2")),
    "NCHW-slot": ("float32", "NHWC", "NCHW", (2, 32, 128, 128), _params("3x3s2-ceil")),
    "one-pixel-x": ("float32", "NHWC", "NHWC", (64, 1024, 1, 1), ONE_PIXEL),
}


@pytest.mark.parametrize("case", list(SCRATCH_CASES))
def test_the_scalar_scan_allocates_what_its_rule_declares(emu, case):
    """What a ``MaxPool2dScan`` call allocates beside its output (host memory traced through the
    emulated kernels, the slot allocated before: the slot step's) is its rule's workspace
    (``pool_indices.scan_workspace``), within the emulator's own few kilobytes: nothing where the
    scan writes the slot itself, float16's float32 copies, the winners' temporary where the slot
    is not dense in x's storage order. The slot holds the reference argmax either way."""
    dtype, x_layout, slot_layout, shape, params = SCRATCH_CASES[case]
    op = ops.MaxPool2dScan(relu=True, **params)
    x = np.random.default_rng(7).standard_normal(shape).astype(numpy_dtype(dtype))
    x = channels_last(x) if x_layout == "NHWC" else x
    pooled = op.output_shape(shape)
    xt, st = TensorType(shape, dtype, x_layout), TensorType(pooled, "uint8", slot_layout)
    declared = rules_for(ops.MaxPool2dScan)["cuda"].workspace(op, (xt, st), {})
    kernel, ctx = rules.POOL_KERNELS[ops.MaxPool2dScan], _ctx({}, TensorType(pooled, dtype, x_layout))

    def new_slot():
        return empty_in_layout(np, pooled, np.uint8, slot_layout == "NHWC")

    kernel(ctx, op, x, new_slot())  # the kernel text compiled by g++ outside the measurement
    slot = new_slot()
    tracemalloc.start()
    try:
        y = kernel(ctx, op, x, slot)
        scratch = tracemalloc.get_traced_memory()[1] - y.nbytes
    finally:
        tracemalloc.stop()
    assert abs(scratch - declared) <= EMULATOR_BYTES, (scratch, declared)
    assert (declared > 0) == (case in ("float16-NHWC", "NCHW-slot", "one-pixel-x"))
    assert is_channels_last(slot) == (slot_layout == "NHWC")
    assert is_channels_last(x) == (x_layout == "NHWC" and case != "one-pixel-x")  # one pixel: NCHW order
    g = ref_pool.node_geometry(op, shape[2:], pooled[2:])
    _, want = ref_idx.max_pool2d_with_indices(np, np.asarray(x, np.float64), g, relu=True)
    np.testing.assert_array_equal(slot, want)


def test_the_slot_allocates_in_the_nodes_layout_without_a_kernel(emu):
    """NHWC: the (N, C, OH, OW) view of a dense (N, OH, OW, C) buffer that the vector
    scan takes (``indices_apply``); NCHW: C-ordered; no type: x's storage order."""
    x = _hard_x("bfloat16")
    op = ops.MaxPool2dArgmaxSlot(**_params("2x2s2"))
    kernel = rules.NODE_KERNELS[ops.MaxPool2dArgmaxSlot]
    before = len(emu.raw_launches) + len(emu.launches)
    nhwc = kernel(_ctx({}, TensorType((2, 16, 4, 5), "uint8", "NHWC")), op, x)
    nchw = kernel(_ctx({}, TensorType((2, 16, 4, 5), "uint8", "NCHW")), op, x)
    untyped = kernel(_ctx({}, None), op, x)
    assert len(emu.raw_launches) + len(emu.launches) == before
    assert pool_vector.indices_apply(nhwc) and nhwc.base.shape == (2, 4, 5, 16)
    assert nchw.flags.c_contiguous and nchw.shape == (2, 16, 4, 5) and nchw.dtype == np.uint8
    assert pool_vector.indices_apply(untyped)


def test_the_rules_offer_the_argmax_variants_to_the_scan_and_none_to_the_slot():
    nhwc = TensorType((8, 64, 28, 28), "bfloat16", "NHWC")
    k3 = dict(kernel_size=(3, 3), stride=(2, 2), padding=((0, 0), (0, 0)), ceil_mode=True)
    index = TensorType((8, 64, 14, 14), "uint8", "NHWC")
    scan = rules_for(ops.MaxPool2dScan)["cuda"]
    argmax = rules_for(ops.MaxPool2dArgmax)["cuda"]
    want = argmax.variants(ops.MaxPool2dArgmax(relu=True, **k3), [nhwc], "cuda")
    assert scan.variants(ops.MaxPool2dScan(relu=True, **k3), [nhwc, index], "cuda") == want
    assert {"vector": True, "tile": True} in want and {"vector": True, "pixels": 4} in want
    assert rules.OPTIONS[ops.MaxPool2dScan] == rules.OPTIONS[ops.MaxPool2dArgmax]
    slot = rules_for(ops.MaxPool2dArgmaxSlot)["cuda"]
    assert slot.variants(ops.MaxPool2dArgmaxSlot(**k3), [nhwc], "cuda") == [{}]
    assert ops.MaxPool2dArgmaxSlot not in rules.OPTIONS
    for rule in (scan, slot):
        assert rule.capturable is True and rule.fresh_output and rule.inplace == ()
