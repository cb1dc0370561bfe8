"""The channels-last vector max pooling (``backends/cuda/pool_vector.py``) on the
GPU, on the winners' shapes (GoogLeNet's 3x3/2 ceil_mode and inception 3x3/1
pools, VGG-A's 2x2/2): bit for bit the scalar ``cuda`` kernels' results,
forward, backward and the ReLU-masked backward, with ``gy`` a 16-byte-aligned
channel slice of a wider buffer, and the same inside a CUDA-graph replay on
new input. Nothing is timed here (``opgraph-bench --profile`` measures)."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

#: (x shape, kernel_size, stride, padding, ceil_mode)
CASES = [((32, 192, 56, 56), (3, 3), (2, 2), ((0, 0), (0, 0)), True),
         ((32, 480, 28, 28), (3, 3), (1, 1), ((1, 1), (1, 1)), False),
         ((16, 128, 112, 112), (2, 2), (2, 2), ((0, 0), (0, 0)), False)]


def _device(cp, a, dtype):
    """Host float32 ``a`` as a channels-last device array of ``dtype`` (bfloat16 through its bits)."""
    import ml_dtypes
    host = np.ascontiguousarray(a.transpose(0, 2, 3, 1))
    if dtype == "bfloat16":
        d = cp.asarray(host.astype(ml_dtypes.bfloat16).view(np.uint16)).view(ml_dtypes.bfloat16)
    else:
        d = cp.asarray(host)
    return d.transpose(0, 3, 1, 2)


def _raw(cp, a):
    """``a``'s bits (CuPy copies uint16 and uint32, not bfloat16)."""
    return a.view(cp.uint16 if a.itemsize == 2 else cp.uint32)


def _bits(cp, a):
    return cp.asnumpy(cp.ascontiguousarray(_raw(cp, a).transpose(0, 2, 3, 1)))


@pytest.mark.parametrize("pixels", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", CASES, ids=["3x3s2-ceil", "3x3s1p1", "2x2s2"])
def test_vector_pooling_matches_the_scalar_kernels_and_replays(cp, case, dtype, pixels, captured_replay):
    from opgraph import ops
    from opgraph.backends.cuda import rules
    from opgraph.backends.registry import KernelContext
    from opgraph.types import TensorType
    shape, k, s, p, ceil = case
    rng = np.random.default_rng(0)
    x_host = rng.integers(-4, 5, shape).astype(np.float32)  # ties
    x_host[0, :, :4, :4] = -np.inf
    x_host[1, 3, 5, 7] = np.nan
    x = _device(cp, x_host, dtype)
    for kind in (ops.MaxPool2d, ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu):
        op = kind(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
        arrays = [x]
        if kind is not ops.MaxPool2d:
            out = ops.MaxPool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil).output_shape(shape)
            wide = _device(cp, rng.standard_normal((out[0], out[1] + 16, *out[2:])).astype(np.float32), dtype)
            arrays.append(wide[:, 8:8 + out[1]])
        t = op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays))
        t = TensorType(t.shape, t.dtype, "NHWC")

        def call(vector):
            options = {"vector": True, "pixels": pixels} if vector else {"vector": False}
            return rules.POOL_KERNELS[kind](KernelContext(cp, "cuda", options, t), op, *arrays)
        got, want = call(True), call(False)
        np.testing.assert_array_equal(_bits(cp, got), _bits(cp, want), err_msg=f"{kind.__name__} {dtype} {case}")
        fresh = _device(cp, rng.integers(-4, 5, shape).astype(np.float32), dtype)

        def change():
            _raw(cp, x)[...] = _raw(cp, fresh)
        replayed, keep = captured_replay(lambda: call(True), change)
        np.testing.assert_array_equal(_bits(cp, replayed), _bits(cp, call(False)))
        _raw(cp, x)[...] = _raw(cp, _device(cp, x_host, dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", [((64, 256, 56, 56), (2, 2), (2, 2), ((0, 0), (0, 0)), False),
                                  ((32, 96, 28, 28), (3, 3), (2, 2), ((1, 0), (0, 1)), True)],
                         ids=["densenet-transition", "3x3s2-asym-ceil"])
def test_vector_average_pooling_matches_the_scalar_kernels(cp, case, dtype):
    """DenseNet-121's transition pool and an asymmetric, ceil_mode one, with
    count_include_pad both ways; gy a channel slice of a wider buffer."""
    from opgraph import ops
    from opgraph.backends.cuda import rules
    from opgraph.backends.registry import KernelContext
    from opgraph.types import TensorType
    shape, k, s, p, ceil = case
    rng = np.random.default_rng(1)
    x = _device(cp, rng.standard_normal(shape).astype(np.float32), dtype)
    for include_pad in (True, False):
        fwd = ops.AvgPool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=include_pad)
        out = fwd.output_shape(shape)
        wide = _device(cp, rng.standard_normal((out[0], out[1] + 16, *out[2:])).astype(np.float32), dtype)
        bwd = ops.AvgPool2dBackward(kernel_size=k, stride=s, padding=p, ceil_mode=ceil,
                                    count_include_pad=include_pad, input_shape=shape)
        for op, arrays in ((fwd, [x]), (bwd, [wide[:, 8:8 + out[1]]])):
            t = op.infer(*(TensorType(a.shape, a.dtype.name) for a in arrays))
            t = TensorType(t.shape, t.dtype, "NHWC")
            got, want = (rules.POOL_KERNELS[type(op)](KernelContext(cp, "cuda", {"vector": v}, t), op, *arrays)
                         for v in (True, False))
            np.testing.assert_array_equal(_bits(cp, got), _bits(cp, want), err_msg=f"{op} {dtype}")


@pytest.mark.parametrize("pixels", [1, 2, 4])
@pytest.mark.parametrize("case", CASES[:2], ids=["3x3s2-ceil", "3x3s1p1"])
def test_bfloat16_pair_kernels_keep_signed_zeros_and_non_finite_values(cp, case, pixels):
    """The bfloat16 scan and gather two lanes at a time (PTX ``max.NaN.bf16x2``,
    ``set.gt.u32.bf16x2``, ``prmt`` byte masks on sm_90): ties of -0.0 and
    +0.0, -inf windows, NaN in some lanes, gradients of -0.0, inf and NaN give
    the scalar kernels' bits, in the recomputing gradients and through the
    saved-winner ops (argmax with and without the ReLU mark, the bits take,
    the gather masked and not)."""
    from opgraph import ops
    from opgraph.backends.cuda import rules
    from opgraph.backends.registry import KernelContext
    from opgraph.types import TensorType
    shape, k, s, p, ceil = case
    rng = np.random.default_rng(3)
    values = np.array([-0.0, 0.0, -1.0, 1.0, np.inf, -np.inf], np.float32)
    x_host = values[rng.integers(0, len(values), size=shape)]
    x_host[0, :, :4, :4] = -np.inf
    x_host[1, 3, 5, 7] = x_host[2, 100, 0, 0] = np.nan
    x = _device(cp, x_host, "bfloat16")
    out = ops.MaxPool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil).output_shape(shape)
    g = np.array([-0.0, 0.0, 0.5, -2.0, np.inf, -np.inf, np.nan], np.float32)
    gy = _device(cp, g[rng.integers(0, len(g), size=out)], "bfloat16")
    for kind in (ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu):
        op = kind(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
        t = TensorType(shape, "bfloat16", "NHWC")

        def call(vector):
            options = {"vector": True, "pixels": pixels} if vector else {"vector": False}
            return rules.POOL_KERNELS[kind](KernelContext(cp, "cuda", options, t), op, x, gy)
        np.testing.assert_array_equal(_bits(cp, call(True)), _bits(cp, call(False)), err_msg=kind.__name__)

    def saved(op, *arrays, vector):
        t = op.infer(*(TensorType(a.shape, "uint8" if a.dtype == cp.uint8 else "bfloat16") for a in arrays))
        options = {"vector": True, "pixels": pixels} if vector else {"vector": False}
        return rules.POOL_KERNELS[type(op)](KernelContext(cp, "cuda", options, TensorType(t.shape, t.dtype, "NHWC")),
                                            op, *arrays)
    geometry = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    for relu in (False, True):
        argmax = ops.MaxPool2dArgmax(**geometry, relu=relu)
        idx = saved(argmax, x, vector=True)
        np.testing.assert_array_equal(cp.asnumpy(idx), cp.asnumpy(saved(argmax, x, vector=False)))
        take = ops.MaxPool2dTake(**geometry, masked=relu)
        np.testing.assert_array_equal(_bits(cp, saved(take, x, idx, vector=True)),
                                      _bits(cp, saved(take, x, idx, vector=False)), err_msg=f"take relu={relu}")
        for masked in ((False, True) if relu else (False,)):
            back = ops.MaxPool2dBackwardIndices(**geometry, masked=masked, input_shape=shape)
            np.testing.assert_array_equal(_bits(cp, saved(back, idx, gy, vector=True)),
                                          _bits(cp, saved(back, idx, gy, vector=False)), err_msg=f"gather {masked}")


def _hard_values(shape, rng):
    """A float32 NCHW input of ties (-0.0 and +0.0), infinities, an all -inf corner
    window and two NaN lanes, drawn from ``rng`` (the tile kernels' hard values;
    the caller draws its gradients and indices from the same generator after)."""
    values = np.array([-0.0, 0.0, -1.0, 1.0, 2.0, np.inf, -np.inf], np.float32)
    x_host = values[rng.integers(0, len(values), size=shape)]
    x_host[0, :, :4, :4] = -np.inf
    x_host[1, 3, 5, 7] = x_host[2, 100, 0, 0] = np.nan
    return x_host


def _tile_launches(monkeypatch) -> list:
    """The results of every ``pool_vector._tile_launch`` from now on (False: the
    tile kernel declined the launch and the pair or bits kernel ran instead), so
    that a tile test knows it compared the tile kernels, not the old ones twice."""
    from opgraph.backends.cuda import pool_vector

    seen, launch = [], pool_vector._tile_launch
    monkeypatch.setattr(pool_vector, "_tile_launch", lambda *a, **k: seen.append(launch(*a, **k)) or seen[-1])
    return seen


@pytest.mark.parametrize("case", CASES, ids=["3x3s2-ceil", "3x3s1p1", "2x2s2"])
def test_bfloat16_tile_kernels_match_the_pair_kernels(cp, case, monkeypatch):
    """The ``tile`` variant (``pool_vector_tile_kernels._scan_tile``, ``_gather_tile``: shared
    memory, PTX ``set.eq.u32.bf16x2`` and ``cvt.rn.bf16x2.f32`` on sm_90) gives
    the pair kernels' bits: ties of -0.0 and +0.0, -inf windows, NaN in some
    lanes, gradients of -0.0, inf and NaN (a channel slice of a wider buffer),
    the recomputing gradients and the saved-winner scan and gather, with and
    without the ReLU mark and the masking."""
    from opgraph import ops
    from opgraph.backends.cuda import rules
    from opgraph.backends.registry import KernelContext
    from opgraph.types import TensorType
    shape, k, s, p, ceil = case
    rng = np.random.default_rng(5)
    x_host = _hard_values(shape, rng)
    x = _device(cp, x_host, "bfloat16")
    geometry = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    out = ops.MaxPool2d(**geometry).output_shape(shape)
    g = np.array([-0.0, 0.0, 0.5, -2.0, np.inf, -np.inf, np.nan], np.float32)
    gy_host = np.where(rng.random(out) < 0.6, rng.standard_normal(out).astype(np.float32),
                       g[rng.integers(0, len(g), size=out)])
    wide = _device(cp, np.concatenate([np.zeros((out[0], 8, *out[2:]), np.float32), gy_host,
                                       np.zeros((out[0], 8, *out[2:]), np.float32)], axis=1), "bfloat16")
    gy = wide[:, 8:8 + out[1]]
    launches = _tile_launches(monkeypatch)

    def run(op, *arrays, tile):
        t = op.infer(*(TensorType(a.shape, "uint8" if a.dtype == cp.uint8 else "bfloat16") for a in arrays))
        options = {"vector": True, "tile": True} if tile else {"vector": True}
        return rules.POOL_KERNELS[type(op)](KernelContext(cp, "cuda", options, TensorType(t.shape, t.dtype, "NHWC")),
                                            op, *arrays)
    for kind in (ops.MaxPool2dBackward, ops.MaxPool2dBackwardRelu):
        op = kind(**geometry)
        np.testing.assert_array_equal(_bits(cp, run(op, x, gy, tile=True)), _bits(cp, run(op, x, gy, tile=False)),
                                      err_msg=kind.__name__)
    for relu in (False, True):
        argmax = ops.MaxPool2dArgmax(**geometry, relu=relu)
        idx = run(argmax, x, tile=True)
        np.testing.assert_array_equal(cp.asnumpy(idx), cp.asnumpy(run(argmax, x, tile=False)), err_msg=f"relu={relu}")
        for masked in (False, True):
            back = ops.MaxPool2dBackwardIndices(**geometry, masked=masked, input_shape=shape)
            np.testing.assert_array_equal(_bits(cp, run(back, idx, gy, tile=True)),
                                          _bits(cp, run(back, idx, gy, tile=False)), err_msg=f"gather {masked}")
    assert len(launches) >= 8 and all(launches), launches  # every tile request ran its tile kernel


@pytest.mark.parametrize("case", CASES, ids=["3x3s2-ceil", "3x3s1p1", "2x2s2"])
def test_bfloat16_tile_take_matches_the_bits_take(cp, case, monkeypatch):
    """The ``tile`` take (``pool_vector_tile_kernels._take_tile``: x staged in shared memory as
    the tile scan stages it) gives ``_take_bits``' bits: x of -0.0/+0.0 ties, -inf
    windows, quiet and signalling NaN lanes (quieted by both), a channel slice of
    a wider buffer; the saved winners with and without the ReLU mark, plus bytes
    the scan never writes (cells past the window, padding cells, marked ones),
    taken masked and not."""
    from opgraph import ops
    from opgraph.backends.cuda import rules
    from opgraph.backends.registry import KernelContext
    from opgraph.types import TensorType
    shape, k, s, p, ceil = case
    rng = np.random.default_rng(6)
    x_host = _hard_values(shape, rng)
    n, c, h, w = shape
    wide = _device(cp, np.concatenate([np.zeros((n, 8, h, w), np.float32), x_host,
                                       np.zeros((n, 8, h, w), np.float32)], axis=1), "bfloat16")
    x = wide[:, 8:8 + c]
    raw = _raw(cp, x)
    raw[0, 5, 2, 3] = raw[3, 17, 6, 7] = raw[1, 40, 0, 1] = 0x7f81  # signalling NaNs, each alone in its windows
    raw[2, 9, 1, 1] = raw[0, 21, 4, 4] = 0xffa0
    geometry = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)
    launches = _tile_launches(monkeypatch)

    def run(op, *arrays, **options):
        t = op.infer(*(TensorType(a.shape, "uint8" if a.dtype == cp.uint8 else "bfloat16") for a in arrays))
        return rules.POOL_KERNELS[type(op)](KernelContext(cp, "cuda", {"vector": True, **options},
                                                          TensorType(t.shape, t.dtype, "NHWC")), op, *arrays)
    for relu in (False, True):
        idx = run(ops.MaxPool2dArgmax(**geometry, relu=relu), x)
        odd = cp.asarray(rng.random(idx.shape) < 0.05)
        noise = cp.asarray(rng.integers(0, k[0] * k[1] + 3, size=idx.shape) + 128 * rng.integers(0, 2, idx.shape))
        idx[...] = cp.where(odd, noise.astype(cp.uint8), idx)
        for masked in (False, True):
            take = ops.MaxPool2dTake(**geometry, masked=masked)
            got, want = _bits(cp, run(take, x, idx, tile=True)), _bits(cp, run(take, x, idx))
            np.testing.assert_array_equal(got, want, err_msg=f"take relu={relu} masked={masked}")
            if not (relu and masked):  # the NaN winners are taken (quieted)
                assert 0x7fc1 in got and 0xffe0 in got and 0x7f81 not in got
    assert len(launches) >= 4 and all(launches), launches  # each tile take ran the tile kernel
