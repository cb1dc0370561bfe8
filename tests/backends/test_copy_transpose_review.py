"""Adversarial copies for the tiled transpose (review): broadcast (stride-0) sources, overlapping
(self-aliasing) sources, extent-1 axes with odd strides, random permutations and offsets, and the
64-bit threshold of the planning function near 2^31."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codegen_emulated import emu, needs_gxx, seeded  # noqa: F401
from opgraph.backends.cuda.codegen import copies, plan

DT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _vals(shape, item, seed):
    rng = seeded(seed, shape, item)
    return rng.integers(0, 2 ** (8 * item) - 1, size=shape, dtype=DT[item])


def _tiled(emu):
    return emu.raw_launches[-1]["name"].startswith("opgraph_gen_copy_t_")


def _check(dst, src, base=None, index=None):
    want_base = None if base is None else base.copy()
    if base is not None:
        want_base[index] = src
    copies.copy_into(np, dst, src)
    np.testing.assert_array_equal(dst, np.asarray(src))
    if base is not None:
        np.testing.assert_array_equal(base, want_base)   # nothing outside dst written


@needs_gxx
@pytest.mark.parametrize("item", [1, 2, 4, 8])
def test_broadcast_sources(emu, item):
    col = _vals((70,), item, 1)
    src = np.broadcast_to(col[:, None], (70, 45))    # strides (1, 0): A has source stride 0
    dst = np.empty((70, 45), DT[item])
    _check(dst, src)
    assert _tiled(emu)
    row = _vals((45,), item, 2)
    src = np.broadcast_to(row[None, :], (70, 45))    # strides (0, 1)
    dst = np.empty((45, 70), DT[item]).T             # F-order destination: a transpose
    _check(dst, src)
    assert _tiled(emu)
    one = _vals((1, 33, 49), item, 3)                 # a batch axis broadcast
    src = np.broadcast_to(one, (3, 33, 49)).transpose(0, 2, 1)
    dst = np.empty((3, 49, 33), DT[item])
    _check(dst, src)
    assert _tiled(emu)


@needs_gxx
def test_an_overlapping_source(emu):
    """A source whose rows overlap (sliding windows): reading it is well defined."""
    buf = _vals((4000,), 4, 4)
    src = np.ndarray((40, 50), np.uint32, buffer=buf, offset=0, strides=(4 * 1, 4 * 37))
    dst = np.empty((40, 50), np.uint32)
    _check(dst, src)                                  # A: source stride 37, B: stride 1
    assert _tiled(emu)
    src = np.ndarray((3, 40, 50), np.uint32, buffer=buf, offset=8, strides=(4 * 1, 4 * 1, 4 * 60))
    dst = np.empty((3, 40, 50), np.uint32)
    _check(dst, src)                                  # a batch axis of source stride 1 too


@needs_gxx
def test_extent_one_axes_with_any_strides(emu):
    x = _vals((9, 40), 2, 5)
    src = np.ndarray((1, 9, 1, 40), np.uint16, buffer=x, strides=(0, 80, 123456, 2))
    dst = np.empty((40, 1, 1, 9), np.uint16).transpose(1, 3, 2, 0)
    _check(dst, src)
    assert _tiled(emu)


@needs_gxx
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_random_permuted_views(emu, monkeypatch, seed, wide):
    if wide:  # 64-bit indices and a grid-stride loop over the tiles
        monkeypatch.setattr(plan, "INT32_LIMIT", 64)
        monkeypatch.setattr(copies, "COPY_BLOCKS", 3)
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(2, 6))
    shape = [int(rng.choice([1, 2, 3, 8, 9, 17, 33, 64, 65, 70])) for _ in range(nd)]
    item = int(rng.choice([1, 2, 4, 8]))
    # source: a slice of a larger buffer in a random memory order, maybe reversed on some axis
    pad = [int(rng.integers(0, 3)) for _ in range(nd)]
    perm_s = rng.permutation(nd)
    big = _vals(tuple(shape[p] + pad[p] for p in perm_s), item, seed)
    big = big.transpose(np.argsort(perm_s))
    lo = [int(rng.integers(0, p + 1)) for p in pad]
    src = big[tuple(slice(l, l + s) for l, s in zip(lo, shape))]
    if rng.random() < 0.2:
        a = int(rng.integers(nd))
        src = np.flip(src, a)
    perm_d = rng.permutation(nd)
    dpad = [int(rng.integers(0, 3)) for _ in range(nd)]
    base = np.full(tuple(shape[p] + dpad[p] for p in perm_d), 0xAB, DT[item]).transpose(np.argsort(perm_d))
    dlo = [int(rng.integers(0, p + 1)) for p in dpad]
    index = tuple(slice(l, l + s) for l, s in zip(dlo, shape))
    dst = base[index]
    form = copies.transpose_form(tuple(shape), copies._element_strides(dst), copies._element_strides(src),
                                 (False,) * nd)
    if form is None or np.prod(shape) > 300_000:  # the element kernel (unchanged); or slow on the emulator
        return
    _check(dst, src, base, index)
    assert _tiled(emu)


def test_64_bit_threshold_of_the_plan():
    """reach just below and at 2^31: 32-bit below, 64-bit at (dst, src, tiles)."""
    lim = plan.INT32_LIMIT
    # (B, A) = (rows, cols) transposed: src (A, B) contiguous, dst (B, A) contiguous
    for rows, cols in ((32768, 65535), (32768, 65536), (2 ** 16, 2 ** 15 + 1)):
        form = copies.transpose_form((rows, cols), (cols, 1), (1, rows), (False, False))
        assert form is not None
        params = copies._tiled_plan(*form, 2)[2]
        assert params.wide == (rows * cols >= lim), (rows, cols)
    # a huge source stride on A with few elements: the source's reach decides
    form = copies.transpose_form((8, 8), (8, 1), (1, 2 ** 28), (False, False))
    assert not copies._tiled_plan(*form, 2)[2].wide      # 7 * 2^28 + 7 + 1 < 2^31
    form = copies.transpose_form((8, 9), (9, 1), (1, 2 ** 28), (False, False))
    assert copies._tiled_plan(*form, 2)[2].wide          # 8 * 2^28 + 8 >= 2^31


def test_no_tiles_for_bounded_or_negative_or_zero_extent():
    assert copies.transpose_form((8, 9), (9, 1), (1, 8), (True, False)) is None
    assert copies.transpose_form((8, 9), (-9, 1), (1, 8), (False, False)) is None
    assert copies.transpose_form((8, 9), (9, 1), (1, -8), (False, False)) is None


@needs_gxx
@pytest.mark.parametrize("shape", [(3, 40, 1, 1), (3, 1, 5, 7)])
def test_a_reshape_into_nhwc_of_one_pixel_or_one_channel_stays_a_view(emu, shape):
    """(N, C) -> (N, C, 1, 1), the gradient of the Flatten after a global average pool (every
    ResNet, DenseNet, MobileNet): C order and channels-last are the same memory there, so the
    reshape was a view the executor kept (``to_layout`` copies nothing); it must not become a
    copy kernel and a new buffer each step."""
    from opgraph import ops
    from opgraph.backends.registry import KernelContext, rules_for
    from opgraph.executable import _stored_channels_last
    from opgraph.types import TensorType
    flat = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape[0], -1)
    kernel = _stored_channels_last(rules_for(ops.Reshape)["codegen"].kernel, np)
    out = kernel(KernelContext(np, "cuda", {}, TensorType(shape, "float32", "NHWC")), ops.Reshape(shape=shape), flat)
    np.testing.assert_array_equal(out, flat.reshape(shape))
    assert np.shares_memory(out, flat) and not emu.raw_launches


@needs_gxx
def test_a_reshape_of_an_nhwc_value_to_its_own_shape_is_that_value(emu):
    """Asked for NHWC, a 4-D value already stored NHWC at that shape was copied into a new
    NHWC buffer (the same bytes, one launch); it is returned as it is."""
    from opgraph.backends.cuda.codegen import movement
    x = np.ascontiguousarray(np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 4, 5, 3)).transpose(0, 3, 1, 2)
    out = movement.reshape(np, x, shape=(2, 3, 4, 5), layout="NHWC")
    assert out is x and not emu.raw_launches
    flat = np.ascontiguousarray(x).reshape(2, -1)  # another shape: the tiled copy into NHWC, as before
    out = movement.reshape(np, flat, shape=(2, 3, 4, 5), layout="NHWC")
    np.testing.assert_array_equal(out, x)
    assert out.strides == x.strides and emu.raw_launches
