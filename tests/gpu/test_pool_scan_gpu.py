"""The one-scan max pooling (``MaxPool2dScan`` filling a ``MaxPool2dArgmaxSlot``)
on the GPU: its kernels (``pool_vector.max_pool2d_scan``: lanes, bfloat16 pairs
with ``max.NaN.bf16x2`` / ``set.gt.u32.bf16x2``, 1, 2 or 4 columns per thread,
and the shared-memory ``tile``) against the existing kernels on the device,
bit for bit: y the ``fwd`` max pool's and the take of the argmax, the slot the
``arg`` kernel's bytes, on GoogLeNet's and VGG-A's windows with ties of -0.0
and +0.0 (where ``max.NaN`` may order them, the stored maximum is the first
one's bits), -inf windows and NaN lanes; and the node kernels inside a
CUDA-graph replay on new input. Nothing is timed here."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

#: (x shape, kernel_size, stride, padding, ceil_mode): GoogLeNet's 3x3/2 ceil_mode and
#: inception 3x3/1 pools, VGG-A's 2x2/2
CASES = [((32, 192, 56, 56), (3, 3), (2, 2), ((0, 0), (0, 0)), True),
         ((32, 480, 28, 28), (3, 3), (1, 1), ((1, 1), (1, 1)), False),
         ((16, 128, 112, 112), (2, 2), (2, 2), ((0, 0), (0, 0)), False)]
IDS = ["3x3s2-ceil", "3x3s1p1", "2x2s2"]


def _device(cp, a, dtype):
    """Host float32 NCHW ``a`` as a channels-last device array of ``dtype`` (bfloat16 through its bits)."""
    import ml_dtypes
    host = np.ascontiguousarray(a.transpose(0, 2, 3, 1))
    if dtype == "bfloat16":
        d = cp.asarray(host.astype(ml_dtypes.bfloat16).view(np.uint16)).view(ml_dtypes.bfloat16)
    else:
        d = cp.asarray(host)
    return d.transpose(0, 3, 1, 2)


def _raw(cp, a):
    return a.view(cp.uint8 if a.itemsize == 1 else cp.uint16 if a.itemsize == 2 else cp.uint32)


def _bits(cp, a):
    return cp.asnumpy(cp.ascontiguousarray(_raw(cp, a).transpose(0, 2, 3, 1)))


def _hard_values(shape, rng):
    """Ties of -0.0 and +0.0, small integers, infinities, an all -inf corner and NaN lanes."""
    values = np.array([-0.0, 0.0, -1.0, 1.0, 2.0, np.inf, -np.inf], np.float32)
    x = values[rng.integers(0, len(values), size=shape)]
    x[0, :, :4, :4] = -np.inf
    x[1, 3, 5, 7] = x[2, 100, 0, 0] = np.nan
    return x


def _slot(cp, shape):
    """A channels-last uint8 slot of logical ``shape``, every byte 0xAB (an unwritten byte shows)."""
    n, c, h, w = shape
    return cp.full((n, h, w, c), 0xAB, dtype=cp.uint8).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_scan_kernels_match_fwd_arg_and_take_on_the_device(cp, case, dtype):
    from opgraph import ops
    from opgraph.backends.cuda import pool_vector
    from opgraph.backends.reference.pool import node_geometry
    shape, k, s, p, ceil = case
    x = _device(cp, _hard_values(shape, np.random.default_rng(0)), dtype)
    op = ops.MaxPool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    out = op.output_shape(shape)
    g = node_geometry(op, shape[2:], out[2:])
    want_y = _bits(cp, pool_vector.max_pool2d(cp, x, g))
    tiles = (False, True) if pool_vector.tile_declines(dtype, k, s) is None else (False,)
    for relu in (False, True):
        want_idx = pool_vector.max_pool2d_argmax(cp, x, g, relu)
        np.testing.assert_array_equal(_bits(cp, pool_vector.max_pool2d_take(cp, x, want_idx, g)), want_y)
        for pixels, tile in [(n, False) for n in pool_vector.PIXELS] + [(1, True)] * (True in tiles):
            slot = _slot(cp, out)
            y = pool_vector.max_pool2d_scan(cp, x, slot, g, relu, pixels, tile)
            what = f"{dtype} relu={relu} pixels={pixels} tile={tile}"
            np.testing.assert_array_equal(_bits(cp, y), want_y, err_msg=what)
            np.testing.assert_array_equal(_bits(cp, slot), _bits(cp, want_idx), err_msg=what)


@pytest.mark.parametrize("options", [{"vector": True}, {"vector": True, "pixels": 2}, {"vector": True, "tile": True},
                                     {}], ids=["vector", "vector-p2", "tile", "scalar"])
def test_the_node_kernels_replay_in_a_cuda_graph(cp, options, captured_replay):
    """The slot's allocation and the scan captured together; replayed on new x,
    y and the slot equal the argmax and take nodes' results on that x."""
    from opgraph import ops
    from opgraph.backends.cuda import rules
    from opgraph.backends.registry import KernelContext
    from opgraph.types import TensorType
    shape, k, s, p, ceil = CASES[0]
    shape = (8, *shape[1:])
    rng = np.random.default_rng(1)
    x = _device(cp, _hard_values(shape, rng), "bfloat16")
    params = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    slot_op, scan_op = ops.MaxPool2dArgmaxSlot(relu=True, **params), ops.MaxPool2dScan(relu=True, **params)
    xt = TensorType(shape, "bfloat16", "NHWC")
    st = slot_op.infer(xt)
    st = TensorType(st.shape, st.dtype, "NHWC")
    yt = TensorType(scan_op.infer(xt, st).shape, "bfloat16", "NHWC")

    def scan():
        slot = rules.NODE_KERNELS[ops.MaxPool2dArgmaxSlot](KernelContext(cp, "cuda", {}, st), slot_op, x)
        return rules.POOL_KERNELS[ops.MaxPool2dScan](KernelContext(cp, "cuda", options, yt), scan_op, x, slot), slot

    def pair():
        argmax, take = ops.MaxPool2dArgmax(relu=True, **params), ops.MaxPool2dTake(**params)
        idx = rules.POOL_KERNELS[ops.MaxPool2dArgmax](KernelContext(cp, "cuda", {}, st), argmax, x)
        return rules.POOL_KERNELS[ops.MaxPool2dTake](KernelContext(cp, "cuda", {}, yt), take, x, idx), idx

    fresh = _device(cp, _hard_values(shape, rng), "bfloat16")

    def change():
        _raw(cp, x)[...] = _raw(cp, fresh)
    (y, slot), keep = captured_replay(scan, change)
    want_y, want_idx = pair()
    np.testing.assert_array_equal(_bits(cp, y), _bits(cp, want_y))
    np.testing.assert_array_equal(_bits(cp, slot), _bits(cp, want_idx))
