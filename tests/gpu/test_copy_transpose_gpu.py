"""The tiled transpose of the generated copies (``backends/cuda/codegen/copies.py``) on the GPU,
bit for bit against the same copy on the host: NVRTC compiles it for every element size, the
classifier's ``Flatten`` of an NHWC activation and its gradient's ``Reshape`` at the models'
shapes (AlexNet, OverFeat, VGG-A) and small ones with edge tiles, views with offsets, 64-bit
indices, and a capture replayed in a CUDA graph. Nothing is timed here (``scripts/copy_bench.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

#: (N, C, H, W) of the classifiers' flatten (bf16 in the profile), and small ones with edge tiles
SHAPES = [(128, 256, 6, 6), (128, 1024, 6, 6), (64, 512, 7, 7), (2, 40, 3, 5), (3, 33, 7, 7)]
BITS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _nhwc(cp, host):
    """Host (N, C, H, W) values as a device array stored channels-last."""
    return cp.ascontiguousarray(cp.asarray(host).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _tiled_names(copies, dst, src):
    lo = (0,) * dst.ndim
    return copies._plan(tuple(dst.shape), copies._element_strides(dst), tuple(src.shape),
                        copies._element_strides(src), lo, dst.itemsize, 0, True, True)[0]


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_flatten_and_reshape_back_bit_for_bit(cp, rng, shape, itemsize):
    from opgraph.backends.cuda.codegen import copies
    dt = BITS[itemsize]
    host = rng.integers(0, 2 ** min(8 * itemsize, 63), size=shape, dtype=np.uint64).astype(dt)
    x = _nhwc(cp, host)
    flat = cp.empty(shape, dt)
    assert _tiled_names(copies, flat, x).startswith("opgraph_gen_copy_t_")
    copies.copy_into(cp, flat, x)
    np.testing.assert_array_equal(cp.asnumpy(flat), host)
    n, c, h, w = shape
    back = cp.empty((n, h, w, c), dt).transpose(0, 3, 1, 2)
    copies.copy_into(cp, back, flat)
    np.testing.assert_array_equal(cp.asnumpy(back), host)


def test_views_with_offsets_and_64_bit_indices(cp, rng, monkeypatch):
    from opgraph.backends.cuda.codegen import copies, plan
    host = rng.integers(0, 2 ** 16, size=(4, 50, 7, 7), dtype=np.uint64).astype(np.uint16)
    wide = _nhwc(cp, host)
    src = wide[:, 3:43]                               # a channel slice of an NHWC buffer
    out = cp.full((4, 45, 7, 7), 7, cp.uint16)
    copies.copy_into(cp, out[:, 5:45], src)           # into a channel slice of a C-ordered one
    want = np.full((4, 45, 7, 7), 7, np.uint16)
    want[:, 5:45] = host[:, 3:43]
    np.testing.assert_array_equal(cp.asnumpy(out), want)
    monkeypatch.setattr(plan, "INT32_LIMIT", 1000)
    copies._plan.cache_clear()
    try:
        again = cp.empty((4, 40, 7, 7), cp.uint16)
        copies.copy_into(cp, again, src)
        np.testing.assert_array_equal(cp.asnumpy(again), host[:, 3:43])
    finally:
        copies._plan.cache_clear()


def test_the_tiled_copy_replays_in_a_cuda_graph(cp, rng, captured_replay):
    """No host work on the launch path: captured once, replayed on new input."""
    from opgraph.backends.cuda.codegen import copies
    shape = (128, 256, 6, 6)
    first = rng.integers(0, 2 ** 16, size=shape, dtype=np.uint64).astype(np.uint16)
    fresh = rng.integers(0, 2 ** 16, size=shape, dtype=np.uint64).astype(np.uint16)
    x = _nhwc(cp, first)
    out = cp.empty(shape, cp.uint16)
    def change():
        x[...] = cp.asarray(fresh)
    got, keep = captured_replay(lambda: copies.copy_into(cp, out, x), change)
    np.testing.assert_array_equal(cp.asnumpy(got), fresh)
    del keep
