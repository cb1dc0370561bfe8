"""The ReLU gradient that writes its per-channel sums (``backends/cuda/colsum_relu.py``) on the GPU:
``g`` bit for bit ``relu.relu_backward``'s on the device, the sums within the bias gradient's
tolerance of float64 sums on the host and bit for bit the same over two runs (a fixed order of
additions, whatever the scheduling) and as ``colsum_vector.column_sums(g)``'s; bfloat16 and float32,
NHWC on GoogLeNet-like shapes (C of one vector, C=1000, C over one column tile), a pitched gy (a
channel slice of a concatenated gradient), 2-D ``(N, C)``, NaN and -0.0 in y and gy; the node
kernels against the reference rules (the NCHW fallback included) and inside a CUDA-graph replay on
new input; in place into gy (``out=gy``) bit for bit the out-of-place call. Nothing is timed here."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

SHAPES = [(16, 8, 28, 28), (32, 64, 56, 56), (8, 1000, 7, 7), (4, 2080, 3, 3)]
IDS = ["C8", "C64-56x56", "C1000", "C2080"]


def _storage(dtype):
    import ml_dtypes
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def _host(shape, dtype, rng, special=False):
    """Host values in ``dtype``; with ``special`` about 1 in 8 are -0.0, +0.0, NaN or +-inf."""
    a = rng.standard_normal(shape).astype(np.float32)
    if special:
        picks = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, -0.0], np.float32)
        where = rng.random(shape) < 0.125
        a[where] = picks[rng.integers(0, len(picks), size=int(where.sum()))]
    return a.astype(_storage(dtype))


def _device(cp, a, layout="NHWC"):
    """Host ``a`` (2-D, or 4-D logical NCHW) on the device: 4-D stored ``layout``; bfloat16 through its bits."""
    bits = a.view(np.uint16) if a.dtype.itemsize == 2 else a
    if a.ndim == 4 and layout == "NHWC":
        return cp.asarray(np.ascontiguousarray(bits.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2).view(a.dtype)
    return cp.asarray(np.ascontiguousarray(bits)).view(a.dtype)


def _bits(cp, a):
    """Device ``a`` as host bits in logical order."""
    raw = a.view(cp.uint16 if a.itemsize == 2 else cp.uint32 if a.itemsize == 4 else cp.uint64)
    return cp.asnumpy(cp.ascontiguousarray(raw))


def _values(cp, a):
    return _bits(cp, a).view(_storage(a.dtype.name)).astype(np.float64)


def _check_sums(got, g):
    """Host float64 ``got`` against the float64 sums of host ``g`` (float64, logical (N, C, ...)):
    float32 accumulation of M terms (M * 2^-24 of the sum of magnitudes) then one rounding (half a
    bfloat16 ulp when ``bf16``); NaN and infinities exactly."""
    axes = (0, *range(2, g.ndim))
    with np.errstate(invalid="ignore"):
        exact = g.sum(axis=axes)
    scale = np.abs(g).sum(axis=axes)
    m = g.size // g.shape[1]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    finite = np.isfinite(exact)
    np.testing.assert_array_equal(got[~finite], exact[~finite])
    return finite, exact, scale, m


def _assert_sums(got, g, bf16):
    finite, exact, scale, m = _check_sums(got, g)
    tol = scale[finite] * m * 2.0 ** -24 + np.abs(exact[finite]) * (2.0 ** -8 if bf16 else 0.0) + 1e-30
    assert (np.abs(got[finite] - exact[finite]) <= tol).all()


def _fused(cp, y, gy):
    """Both results of the fused path, checked against the device's relu_backward and column sums,
    and run twice: ``(g, sums)``."""
    from opgraph.backends.cuda import colsum_relu, colsum_vector, relu
    assert colsum_relu.declines(y, gy) is None
    g, sums = colsum_relu.relu_backward_sums(cp, y, gy)
    np.testing.assert_array_equal(_bits(cp, g), _bits(cp, relu.relu_backward(cp, y, gy)))
    if g.ndim == 4:
        assert g.transpose(0, 2, 3, 1).flags.c_contiguous
    rows = colsum_relu.rows(g)
    np.testing.assert_array_equal(_bits(cp, sums), _bits(cp, colsum_vector.column_sums(cp, rows)))
    g2, sums2 = colsum_relu.relu_backward_sums(cp, y, gy)
    np.testing.assert_array_equal(_bits(cp, sums2), _bits(cp, sums))
    np.testing.assert_array_equal(_bits(cp, g2), _bits(cp, g))
    _assert_sums(_values(cp, sums), _values(cp, g), g.dtype.name == "bfloat16")
    return g, sums


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_fused_nhwc(cp, rng, dtype, shape):
    _fused(cp, _device(cp, _host(shape, dtype, rng)), _device(cp, _host(shape, dtype, rng)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_nan_inf_and_signed_zeros(cp, rng, dtype):
    shape = (8, 64, 14, 14)
    _fused(cp, _device(cp, _host(shape, dtype, rng, True)), _device(cp, _host(shape, dtype, rng, True)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_pitched_gy_and_two_dimensional_rows(cp, rng, dtype):
    """gy channels 64..191 of a 256-channel concatenated gradient; then ``(N, C)`` rows."""
    wide = _device(cp, _host((8, 256, 28, 28), dtype, rng))
    gy = wide[:, 64:192]
    _fused(cp, _device(cp, _host(gy.shape, dtype, rng)), gy)
    _fused(cp, _device(cp, _host((512, 1000), dtype, rng, True)), _device(cp, _host((512, 1000), dtype, rng, True)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_in_place_into_gy(cp, rng, dtype, shape):
    """``out=gy`` (the memory pass's in-place step): pass 1 without ``__restrict__`` overwrites gy,
    g and the sums bit for bit those of the same call out of place (every thread reads its
    vectors before it stores to the same address, whatever the scheduling); then a pitched gy."""
    from opgraph.backends.cuda import colsum_relu
    for y, gy in ((_device(cp, _host(shape, dtype, rng, True)), _device(cp, _host(shape, dtype, rng, True))),
                  (_device(cp, _host((8, 128, 28, 28), dtype, rng)),
                   _device(cp, _host((8, 256, 28, 28), dtype, rng))[:, 64:192])):
        want_g, want_sums = colsum_relu.relu_backward_sums(cp, y, gy.copy(order="K"))
        g, sums = colsum_relu.relu_backward_sums(cp, y, gy, out=gy)
        assert g is gy
        np.testing.assert_array_equal(_bits(cp, g), _bits(cp, want_g))
        np.testing.assert_array_equal(_bits(cp, sums), _bits(cp, want_sums))


def _node_pair(cp, y, gy, layout):
    from opgraph import ops
    from opgraph.backends.cuda import rules
    from opgraph.backends.registry import KernelContext
    from opgraph.types import TensorType
    slot_op, op = ops.ReluBackwardSumsSlot(), ops.ReluBackwardSums()
    yt = TensorType(y.shape, gy.dtype.name, layout)
    st = slot_op.infer(yt, yt)
    sums = rules.NODE_KERNELS[ops.ReluBackwardSumsSlot](KernelContext(cp, "cuda", {}, st), slot_op, y, gy)
    g = rules.NODE_KERNELS[ops.ReluBackwardSums](KernelContext(cp, "cuda", {}, op.infer(yt, yt, st)), op, y, gy,
                                                  sums)
    return g, sums


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_node_kernels_against_the_reference_rules(cp, rng, dtype, layout):
    """g bit for bit the reference's (on the host), the sums within tolerance of float64 as the
    reference's are: the fused path (NHWC bfloat16 / float32) and the fallback (NCHW, float16)."""
    from opgraph import ops
    from opgraph.backends.registry import KernelContext, rules_for
    shape = (4, 96, 14, 14)
    hy, hgy = _host(shape, dtype, rng, True), _host(shape, dtype, rng, True)
    g, sums = _node_pair(cp, _device(cp, hy, layout), _device(cp, hgy, layout), layout)
    ref = KernelContext(np, "cpu", {}, None)
    with np.errstate(invalid="ignore"):  # inf - inf in the host sums
        want = rules_for(ops.ReluBackwardSums)["reference"].kernel(ref, ops.ReluBackwardSums(), hy, hgy,
                                                                    np.zeros(shape[1], hgy.dtype))
    np.testing.assert_array_equal(_bits(cp, g), np.ascontiguousarray(want).view(_bits(cp, g).dtype))
    got = _values(cp, sums)
    if dtype == "float16":  # float32 sums rounded once to float16: half an ulp beyond the accumulation
        finite, exact, scale, m = _check_sums(got, want.astype(np.float64))
        tol = scale[finite] * m * 2.0 ** -24 + np.abs(exact[finite]) * 2.0 ** -11 + 1e-30
        assert (np.abs(got[finite] - exact[finite]) <= tol).all()
    else:
        _assert_sums(got, want.astype(np.float64), dtype == "bfloat16")


def test_node_kernels_in_a_cuda_graph(cp, rng, captured_replay):
    """Captured (slot and filler), then gy doubled in place and the graph replayed: g and the sums
    follow the new gy."""
    shape = (8, 64, 28, 28)
    hy, hgy = _host(shape, "bfloat16", rng), _host(shape, "bfloat16", rng)
    y, gy = _device(cp, hy), _device(cp, hgy)
    doubled = _device(cp, (2 * hgy.astype(np.float32)).astype(hgy.dtype))
    (g, sums), keep = captured_replay(lambda: _node_pair(cp, y, gy, "NHWC"),
                                      lambda: gy.view(cp.uint16).__setitem__(Ellipsis, doubled.view(cp.uint16)))
    want_g = np.where(hy.astype(np.float32) > 0, 2 * hgy.astype(np.float32), 0).astype(np.float64)
    np.testing.assert_array_equal(_values(cp, g), want_g)
    _assert_sums(_values(cp, sums), want_g, True)
    del g, sums, keep
