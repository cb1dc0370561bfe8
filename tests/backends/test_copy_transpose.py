"""The tiled transpose of the generated copies (``codegen/copies.py``): which copies take it,
and its kernel run on the CPU through the g++ emulator (every thread, ``__shared__`` and
``__syncthreads``) against NumPy, bit for bit: the classifier's ``Flatten`` of an NHWC
activation into C order and its gradient's ``Reshape`` back, plain 2-D transposes, a
transpose with two and three batch axes, 1-, 2-, 4- and 8-byte elements, views with offsets on either
side, extent-1 axes, edge tiles, a grid smaller than the tiles, 64-bit indices. Copies that
are no transpose keep the element kernel's text exactly."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from codegen_cases import channels_last
from codegen_emulated import emu, needs_gxx, seeded  # noqa: F401  (emu: fixture)
from cuda_cpu_emulator import NVCC, nvcc_check
from opgraph import ops
from opgraph.backends.cuda.codegen import copies, plan
from opgraph.backends.registry import KernelContext, rules_for
from opgraph.executable import _stored_channels_last
from opgraph.types import TensorType, is_channels_last, numpy_dtype

#: one dtype per element size
DTYPES = {1: "uint8", 2: "bfloat16", 4: "float32", 8: "float64"}


def _values(shape, dtype: str, seed=0):
    """Random values of ``dtype`` (seeded by the arguments)."""
    rng = seeded(seed, shape, dtype)
    if dtype == "uint8":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


def _bits(a):
    return np.asarray(a).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def _tiled(emu) -> list[bool]:
    """Per launch so far: whether it ran the tiled kernel."""
    return [x["name"].startswith("opgraph_gen_copy_t_") for x in emu.raw_launches]


def _copy(dst, src, base=None, region=None):
    """``copies.copy_into(np, dst, src)`` against NumPy's assignment, bit for bit; with
    ``base`` (the buffer ``dst`` is ``region(base)`` of) every element of ``base`` outside
    ``dst`` keeps its value too (the emulator's guard bands only catch writes outside ``base``)."""
    if base is not None:
        want_base = base.copy()
        region(want_base)[...] = src
    assert copies.copy_into(np, dst, src) is dst
    np.testing.assert_array_equal(_bits(dst), _bits(np.asarray(src)))
    if base is not None:
        np.testing.assert_array_equal(_bits(base), _bits(want_base))


def _nhwc_empty(shape, dtype):
    n, c, h, w = shape
    return np.empty((n, h, w, c), numpy_dtype(dtype)).transpose(0, 3, 1, 2)


# ---- which copies take the tiled kernel (plans only: no emulator) ------------------------------

def _plan_of(dst, src, lo=None, fill=0.0, tiled=True):
    lo = (0,) * dst.ndim if lo is None else tuple(lo)
    bits = copies.fill_bits(fill, dst.dtype.name) if any(lo) or src.shape != dst.shape else 0
    return copies._plan(tuple(dst.shape), copies._element_strides(dst), tuple(src.shape),
                        copies._element_strides(src), lo, dst.itemsize, bits, True, tiled)


def _is_tiled(dst, src, **kw) -> bool:
    return _plan_of(dst, src, **kw)[0].startswith("opgraph_gen_copy_t_")


@pytest.mark.parametrize("shape", [(2, 40, 3, 5), (3, 33, 7, 7), (128, 1024, 6, 6), (1, 40, 3, 5), (2, 40, 1, 9)])
def test_the_flatten_of_an_nhwc_activation_and_its_gradient_are_tiled(shape):
    x = channels_last(np.zeros(shape, np.float32))
    c_order = np.zeros(shape, np.float32)
    assert _is_tiled(c_order, x)                     # Flatten: NHWC -> C order
    assert _is_tiled(_nhwc_empty(shape, "float32"), c_order)  # its gradient's Reshape: C order -> NHWC
    assert not _is_tiled(c_order, x, tiled=False)    # copies.TILED = False: the element kernel


def test_a_flatten_merges_h_and_w_into_one_axis_with_n_as_the_batch():
    n, c, h, w = 128, 1024, 6, 6
    form = copies.transpose_form((n, c, h, w), (c * h * w, h * w, w, 1), (h * w * c, 1, w * c, c), (False,) * 4)
    assert form == ((n, c, h * w), (c * h * w, h * w, 1), (h * w * c, 1, c), 1)
    name, text, params, blocks = copies._tiled_plan(*form, 2)
    values = {k: int(v[2]) for k, v in params.items.items() if v[0] == "scalar"}
    # A = H*W = 36 (one run), B = C = 1024 (16 runs of 64), the batch N = 128: 2,048 tiles
    assert (values["TA"], values["TB"], values["NTAV"], values["NTBV"], values["NT"]) == (36, 64, 1, 16, 2048)
    assert blocks == 2048 and "__launch_bounds__(256, 8)" in text and "__syncthreads" in text


def test_copies_that_are_no_transpose_keep_the_element_kernel():
    shape = (2, 8, 5, 6)
    wide = channels_last(np.zeros((2, 24, 5, 6), np.float32))
    part = channels_last(np.zeros(shape, np.float32))
    assert not _is_tiled(wide[:, 8:16], part)        # a concat input into its NHWC channel slice
    assert not _is_tiled(part, wide[:, 8:16])        # a slice of it
    c_order = np.zeros(shape, np.float32)
    assert not _is_tiled(np.zeros((2, 24, 5, 6), np.float32)[:, 8:16], c_order)  # NCHW channel slice
    padded = np.zeros((2, 8, 7, 9), np.float32)
    assert not _is_tiled(padded, c_order, lo=(0, 0, 1, 2), fill=float("-inf"))  # a padded copy
    assert not _is_tiled(channels_last(padded), part, lo=(0, 0, 1, 2))          # NHWC too
    assert not _is_tiled(c_order, padded[:, :, 1:6, 2:8])                         # a crop
    one_pixel = np.zeros((4, 8, 1, 1), np.float32)   # H = W = 1: both orders are the same memory
    assert not _is_tiled(one_pixel, channels_last(one_pixel))
    one_channel = np.zeros((4, 1, 5, 6), np.float32)
    assert not _is_tiled(one_channel, channels_last(one_channel))
    # a negative stride (the element kernel takes none either): no tile
    assert copies.transpose_form((8, 9), (9, 1), (-1, 8), (False, False)) is None
    assert copies.transpose_form((8, 9), (9, 1), (1, 8), (False, False)) is not None


@pytest.mark.parametrize("rows, cols", [(7, 100), (100, 7), (2, 5000)])
def test_a_transposed_axis_shorter_than_min_run_keeps_the_element_kernel(rows, cols):
    """(a warp of the tiled kernel would keep under a quarter of its lanes busy on that side)"""
    a = np.zeros((rows, cols), np.float32)
    assert min(rows, cols) < copies.MIN_RUN
    assert not _is_tiled(np.zeros((cols, rows), np.float32), a.T)
    assert _is_tiled(np.zeros((cols, 8), np.float32), np.zeros((8, cols), np.float32).T) == (cols >= 8)


#: signatures of the element kernel (shape, dst strides, src shape, src strides, lo, itemsize,
#: fill, aligned) -> (kernel name, blocks, sha1 of the arguments), made by the tree before
#: the tiled path (cf72948): their text (named by its hash) and launch must not change
ELEMENT_PLANS = {
    "nhwc_concat_slice": (((2, 8, 5, 6), (720, 1, 144, 24), (2, 8, 5, 6), (240, 1, 48, 8), (0, 0, 0, 0), 2, 0, True),
                          ("opgraph_gen_copy_242501e5aad2", 1, "718952195aac")),
    "nhwc_concat_odd": (((2, 3, 3, 3), (72, 1, 24, 8), (2, 3, 3, 3), (27, 1, 9, 3), (0, 0, 0, 0), 2, 0, True),
                        ("opgraph_gen_copy_154aeed6dcb2", 1, "8fe83976ec97")),
    "nchw_pad": (((2, 3, 7, 8), (168, 56, 8, 1), (2, 3, 4, 5), (60, 20, 5, 1), (0, 0, 1, 0), 4,
                  copies.fill_bits(float("-inf"), "float32"), True),
                 ("opgraph_gen_copy_a24d8c1d8960", 2, "317e30b45af0")),
    "nhwc_crop": (((2, 3, 4, 5), (60, 1, 15, 3), (2, 3, 7, 8), (168, 1, 24, 3), (0, 0, 0, 0), 4, 0, False),
                  ("opgraph_gen_copy_ba527c412205", 1, "5a08c9c8ada4")),
    "nchw_slice": (((2, 16, 5, 6), (480, 30, 6, 1), (2, 16, 5, 6), (1440, 30, 6, 1), (0, 0, 0, 0), 8, 0, True),
                   ("opgraph_gen_copy_242501e5aad2", 2, "f00bdb22fa64")),
}


@pytest.mark.parametrize("case", sorted(ELEMENT_PLANS))
def test_the_element_kernel_text_and_launch_are_unchanged(case):
    signature, (name, blocks, arguments) = ELEMENT_PLANS[case]
    got_name, text, params, got_blocks = copies._plan(*signature)
    got_arguments = repr([(n, c, str(v)) for n, (kind, c, v) in params.items.items()])
    assert (got_name, got_blocks, hashlib.sha1(got_arguments.encode()).hexdigest()[:12]) == (name, blocks, arguments)
    assert f"void {name}(" in text and "__shared__" not in text


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_a_warp_reading_a_column_of_the_tile_hits_every_bank_once(itemsize):
    pitch = copies.tile_pitch(itemsize)
    assert pitch > copies.TILE
    lanes = 16 if itemsize == 8 else 32  # 8-byte accesses are served a half-warp at a time
    for row in range(copies.TILE):
        words = [((lane * pitch + row) * itemsize) // 4 for lane in range(lanes)]
        banks = [(w + k) % 32 for w in words for k in range(max(1, itemsize // 4))]
        assert len(set(banks)) == len(banks), (itemsize, row)


# ---- the tiled kernel on the emulator, against NumPy --------------------------------------------

@needs_gxx
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", [(2, 40, 3, 5), (3, 33, 7, 7)])
def test_flatten_of_nhwc_and_the_reshape_back(emu, shape, itemsize):
    """Edge tiles: 40 channels are one run of 40 (lanes 32-39 in the second column), H*W of
    15 and 49 one run each; every element size."""
    dtype = DTYPES[itemsize]
    x = channels_last(_values(shape, dtype))
    flat = np.empty(shape, x.dtype)
    _copy(flat, x)                                    # Flatten: NHWC -> C order, then a view (N, C*H*W)
    back = _nhwc_empty(shape, dtype)
    _copy(back, flat)                                 # its gradient's Reshape: C order -> NHWC
    assert is_channels_last(back) and _tiled(emu) == [True, True]


@needs_gxx
@pytest.mark.parametrize("rows, cols", [(70, 45), (130, 8), (8, 200), (64, 64), (65, 1 + 64 * 2)])
def test_plain_2d_transposes_with_several_and_partial_tiles(emu, rows, cols):
    a = _values((rows, cols), "float32", 1)
    out = np.empty((cols, rows), np.float32)
    _copy(out, a.T)
    assert _tiled(emu) == [True]


@needs_gxx
def test_a_transpose_with_two_batch_axes(emu):
    """A crop of W of a C-ordered (N, C, H, W) copied to (N, H, W, C) in C order: H and W
    cannot merge in the source, so A = C, B = W and the batch axes are N and H; then a 5-D
    transpose with three batch axes."""
    x = _values((2, 12, 4, 70), "bfloat16", 2)[:, :, :, 5:65]
    src = x.transpose(0, 2, 3, 1)
    dst = np.empty(src.shape, src.dtype)
    form = copies.transpose_form(src.shape, copies._element_strides(dst), copies._element_strides(src), (False,) * 4)
    assert form[0] == (2, 4, 60, 12) and form[3] == 2
    _copy(dst, src)
    y = _values((2, 3, 5, 9, 10), "float32", 3)
    src = y.transpose(0, 2, 1, 4, 3)
    dst = np.empty(src.shape, np.float32)
    assert len(copies.transpose_form(src.shape, copies._element_strides(dst), copies._element_strides(src),
                                     (False,) * 5)[0]) == 5
    _copy(dst, src)
    assert _tiled(emu) == [True, True]


@needs_gxx
def test_views_with_offsets_on_either_side(emu):
    """The source a channel slice of an NHWC concat buffer (a zero-copy concat's input read
    in place); the destination a channel slice of one (the Reshape back into a concat's
    gradient) and a column block of a wider C-ordered matrix; elements around each view kept."""
    n, c, h, w = 2, 36, 3, 5
    wide = channels_last(_values((n, c + 11, h, w), "bfloat16", 4))
    src = wide[:, 3:3 + c]
    _copy(np.empty((n, c, h, w), src.dtype), src)
    base = channels_last(np.full((n, c + 9, h, w), 7.0, src.dtype))

    def region(b):
        return b[:, 5:5 + c]
    flat = _values((n, c, h, w), "bfloat16", 5)
    _copy(region(base), flat, base, region)
    matrix = np.full((50, 130), -1.0, np.float32)

    def block(b):
        return b[7:47, 30:100]
    _copy(block(matrix), _values((70, 40), "float32", 6).T, matrix, block)
    assert _tiled(emu) == [True, True, True]


@needs_gxx
def test_extent_one_axes_are_dropped_before_the_tiles(emu):
    """N = 1 (no batch axis left) and H = 1 (W alone is A) are transposes; C = 1 or
    H = W = 1 are not (both orders are the same memory), nor W = 5 alone (under MIN_RUN):
    the element kernel, same bits."""
    for shape, tiled in (((1, 40, 3, 5), True), ((2, 40, 1, 9), True), ((2, 40, 1, 5), False), ((2, 1, 3, 5), False),
                         ((3, 40, 1, 1), False)):
        x = channels_last(_values(shape, "float32", 7))
        _copy(np.empty(shape, np.float32), x)
        assert _tiled(emu)[-1] == tiled, shape


@needs_gxx
def test_more_tiles_than_blocks_and_64_bit_indices(emu, monkeypatch):
    """The grid-stride loop over the tiles (3 blocks for 24 tiles), then the same copy with
    64-bit index arithmetic (IDX long long, plain divisions)."""
    monkeypatch.setattr(copies, "COPY_BLOCKS", 3)
    x = channels_last(_values((3, 130, 2, 5), "bfloat16", 8))
    _copy(np.empty(x.shape, x.dtype), x)
    assert emu.raw_launches[-1]["grid"] == (3, 1, 1) and "typedef unsigned int IDX;" in emu.raw_launches[-1]["source"]
    copies._plan.cache_clear()
    monkeypatch.setattr(plan, "INT32_LIMIT", 64)
    _copy(np.empty(x.shape, x.dtype), x)
    assert "typedef long long IDX;" in emu.raw_launches[-1]["source"] and _tiled(emu) == [True, True]


@needs_gxx
def test_the_element_kernel_still_transposes_when_the_tiles_are_off(emu, monkeypatch):
    monkeypatch.setattr(copies, "TILED", False)
    x = channels_last(_values((2, 40, 3, 5), "bfloat16", 9))
    _copy(np.empty(x.shape, x.dtype), x)
    assert _tiled(emu) == [False]


# ---- the op kernels: Flatten of NHWC, the Reshape back stored NHWC ------------------------------

def _rule(op, arrays, out_type):
    """``op``'s ``codegen`` kernel as the executor runs it (a 4-D NHWC output through
    ``_stored_channels_last``, which converts a result not stored so)."""
    kernel = rules_for(type(op))["codegen"].kernel
    if out_type.layout == "NHWC":
        kernel = _stored_channels_last(kernel, np)
    return kernel(KernelContext(np, "cuda", {}, out_type), op, *arrays)


@needs_gxx
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_flatten_and_its_gradient_reshape_run_one_tiled_copy_each(emu, dtype):
    shape = (3, 33, 7, 7)
    x = channels_last(_values(shape, dtype, 10))
    flat = _rule(ops.Flatten(start_dim=1), [x], TensorType((3, 33 * 49), dtype))
    assert flat.shape == (3, 33 * 49) and flat.flags.c_contiguous
    np.testing.assert_array_equal(_bits(flat), _bits(np.ascontiguousarray(x).reshape(3, -1)))
    back = _rule(ops.Reshape(shape=shape), [flat], TensorType(shape, dtype, "NHWC"))
    assert is_channels_last(back)
    np.testing.assert_array_equal(_bits(back), _bits(x))
    assert _tiled(emu) == [True, True]  # and nothing else: no conversion after the Reshape
    c_order = _rule(ops.Reshape(shape=shape), [flat], TensorType(shape, dtype))
    assert np.shares_memory(c_order, flat) and len(emu.raw_launches) == 2  # C order: still a view


# ---- the text nvcc takes (no GPU needed) --------------------------------------------------------

@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_the_tiled_kernels_compile_for_sm90():
    """Every element size, 32- and 64-bit indices: the launch bound, the read-only loads, the
    barrier, and a shared tile of the padded pitch."""
    sources = []
    for itemsize in (1, 2, 4, 8):
        form = copies.transpose_form((128, 1024, 6, 6), (36864, 36, 6, 1), (36864, 1, 6144, 1024), (False,) * 4)
        sources.append(copies._tiled_plan(*form, itemsize)[1])
    wide = ((3, 2 ** 20, 1024), (2 ** 30, 1024, 1), (2 ** 30, 1, 2 ** 20), 1)
    sources.append(copies._tiled_plan(*wide, 2)[1])
    assert "typedef long long IDX;" in sources[-1]
    ptx = nvcc_check(sources)
    assert ptx.count(".maxntid 256, 1, 1") == 5
    assert [ptx.count(f".minnctapersm {k}") for k in (8, 6, 4)] == [3, 1, 1]  # 8-byte: 4; 64-bit: 6
    assert "ld.global.nc.u16" in ptx and "bar.sync" in ptx and "st.shared.u64" in ptx


@needs_gxx
def test_a_training_step_flattens_and_reshapes_nhwc_with_tiled_copies(emu, monkeypatch):
    """``fan_out`` (four NHWC branches flattened into a concat) lowered for cuda, NHWC, bf16:
    each Flatten and each gradient Reshape is one tiled copy, and every output and gradient
    has the bits of the same step on the element kernel (a copy moves bits)."""
    from codegen_emulated import emulated_cuda_executable
    from fused_training_steps import MAKERS, training_step
    outs, feeds, n_grads = training_step(MAKERS["fan_out"], np.random.default_rng(0))
    exe = emulated_cuda_executable(outs, {"layout": "NHWC"}, "bfloat16")
    kinds = sorted(st.op.op.name for st in exe.steps if st.op.op.name in ("Flatten", "Reshape"))
    assert kinds == ["Flatten"] * 4 + ["Reshape"] * 4
    got = exe(**feeds)
    assert sum(_tiled(emu)) == 8
    monkeypatch.setattr(copies, "TILED", False)
    del emu.raw_launches[:]
    want = exe(**feeds)
    assert not any(_tiled(emu)) and len(got) == len(want) == 1 + n_grads
    for a, b in zip(got, want):
        assert not np.shares_memory(a, b)
        np.testing.assert_array_equal(_bits(a), _bits(b))
