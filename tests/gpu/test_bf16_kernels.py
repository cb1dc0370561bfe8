"""bfloat16 storage in our CuPy kernels (backends/cuda: relu, colsum, lrn,
pool, loss) on the GPU, against the NumPy reference in float64 on the same
bfloat16 values.

Every kernel takes bfloat16 (``ml_dtypes.bfloat16``) and returns bfloat16 in
the input's layout (NCHW and channels-last NHWC views), computing in float32
with the load and store inside the kernel. What is checked:

* selects and masks exactly: ReLU / threshold (fwd/bwd), max pooling's output,
  its argmax (``max_pool2d_select`` of cell codes), NaN, -inf, ties (first
  maximum), signed zeros, and the fused pool + ReLU backward's routing;
* computed outputs within one bfloat16 ulp of the float64 reference (one
  round-to-nearest-even of a float32 result), backward passes whose terms
  cancel (LRN, softmax family, cross-entropy) within SEMANTICS.md's 1e-2;
* a tie rounds to even (the store is the kernels' own);
* no whole-tensor cast: the bf16 <-> f32 conversion functions are spied on
  and must not run (only cross-entropy's scalar and the 'gemv' bias variant
  convert);
* the bias gradient's column / row kernels (NHWC, NCHW, matrices, two
  passes) and their capture in a CUDA graph.

Device arrays are built from and read back as uint16 bit patterns, so the
tests need no CuPy bfloat16 arithmetic. Quick: small shapes, ~30 kernels to
compile once (CuPy caches them on disk).
"""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status
from opgraph.backends.reference import loss as ref_loss
from opgraph.backends.reference import lrn as ref_lrn
from opgraph.backends.reference import pool as ref_pool

from bf16_asserts import (BF16, assert_same_values, assert_within_ulp, bf16, cell_codes, f64,
                          pool_input, pool_kwargs, rel_err, spy_casts)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]



# ------------------------------------------------------------------ helpers

def dev(cp, a, layout="NCHW"):
    """Host bfloat16 ``a`` on the device as bfloat16, in ``layout`` (NHWC: the
    NCHW-shaped view of a channels-last buffer), through its uint16 bits."""
    u = cp.asarray(np.ascontiguousarray(a).view(np.uint16))
    if layout == "NHWC":
        u = cp.ascontiguousarray(u.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return u.view(BF16)


def host(cp, a):
    """A device bfloat16 result on the host (bfloat16), through its bits."""
    assert a.dtype == BF16, a.dtype
    return cp.asnumpy(a.view(cp.uint16)).view(BF16)


@pytest.fixture
def casts(monkeypatch):
    """Every whole-array bf16 <-> f32 conversion, as ``(function, size)``."""
    return spy_casts(monkeypatch)


# ------------------------------------------------------------------ ReLU, threshold

def _special(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 0.49999, 0.50001]
    return bf16(x)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_relu_threshold_bf16(cp, rng, casts, layout):
    from opgraph.backends.cuda import relu as cuda_relu
    x, gy = _special(rng, (2, 3, 4, 5)), _special(rng, (2, 3, 4, 5))
    x32, gy32 = x.astype(np.float32), gy.astype(np.float32)
    dx, dgy = dev(cp, x, layout), dev(cp, gy, layout)
    zero = np.float32(0)
    checks = [(cuda_relu.relu(cp, dx), np.where((x32 > 0) | np.isnan(x32), x32, zero)),
              (cuda_relu.relu_backward(cp, dx, dgy), np.where(x32 > 0, gy32, zero)),
              (cuda_relu.threshold(cp, dx, threshold=0.5, value=-2.0), np.where(x32 <= 0.5, np.float32(-2.0), x32)),
              (cuda_relu.threshold_backward(cp, dx, dgy, threshold=0.5), np.where(x32 > 0.5, gy32, zero))]
    for got, want in checks:
        assert got.dtype == BF16 and got.strides == dx.strides  # layout kept
        assert_same_values(host(cp, got), want)
    blocked = host(cp, checks[1][0]).view(np.uint16)[x32 <= 0]
    assert not blocked.any()  # +0.0, not -0.0
    assert casts == []


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_relu_in_place_bf16(cp, rng, casts, layout):
    """``out=`` (in-place steps: out is x, or gy) on bfloat16."""
    from opgraph.backends.cuda import relu as cuda_relu
    x, gy = _special(rng, (2, 3, 4, 5)), _special(rng, (2, 3, 4, 5))
    x32, gy32 = x.astype(np.float32), gy.astype(np.float32)
    dx, dgy = dev(cp, x, layout), dev(cp, gy, layout)
    assert cuda_relu.relu_backward(cp, dx, dgy, out=dgy) is dgy
    assert_same_values(host(cp, dgy), np.where(x32 > 0, gy32, np.float32(0)))
    assert cuda_relu.relu(cp, dx, out=dx) is dx
    assert_same_values(host(cp, dx), np.where((x32 > 0) | np.isnan(x32), x32, np.float32(0)))
    assert casts == []


# ------------------------------------------------------------------ pooling

#: (x shape, kernel_size, stride, padding, ceil_mode); H*W <= 256 so the
#: cell codes of the argmax check are exact in bfloat16.
POOL_CASES = [
    ((2, 3, 7, 9), (3, 3), (2, 2), ((0, 0), (0, 0)), False),   # overlapping windows
    ((2, 3, 8, 7), (3, 2), (2, 3), ((1, 0), (1, 1)), True),    # asymmetric padding, ceil overhang
    ((2, 4, 6, 6), (2, 2), (2, 2), ((0, 0), (0, 0)), False),   # tiling windows
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kind", ["normal", "ties", "nan", "neg_inf", "signed_zero"])
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool_bf16(cp, rng, casts, case, kind, layout):
    from opgraph.backends.cuda import pool as cuda_pool
    from opgraph.types import is_channels_last
    kw = pool_kwargs(case)
    x = pool_input(rng, case[0], kind)
    x64 = x.astype(np.float64)
    y = cuda_pool.max_pool2d(cp, dev(cp, x, layout), **kw)
    assert y.dtype == BF16 and is_channels_last(y) == (layout == "NHWC")
    y_ref = ref_pool.max_pool2d(np, x64, **kw)
    assert_same_values(host(cp, y), y_ref)  # exact; NaN and -inf windows included
    codes = cell_codes(x.shape)  # the argmax, exactly
    sel = cuda_pool.max_pool2d_select(cp, dev(cp, x, layout), dev(cp, codes, layout), **kw)
    assert_same_values(host(cp, sel), ref_pool.max_pool2d_select(np, x64, codes.astype(np.float64), **kw))
    gy = bf16(rng.standard_normal(y_ref.shape))
    gx = cuda_pool.max_pool2d_backward(cp, dev(cp, x, layout), dev(cp, gy, layout), **kw)
    assert gx.dtype == BF16 and gx.strides == dev(cp, x, layout).strides
    assert_within_ulp(host(cp, gx), ref_pool.max_pool2d_backward(np, x64, gy.astype(np.float64), **kw))
    gxr = cuda_pool.max_pool2d_backward_relu(cp, dev(cp, x, layout), dev(cp, gy, layout), **kw)
    assert_within_ulp(host(cp, gxr), ref_pool.max_pool2d_backward_relu(np, x64, gy.astype(np.float64), **kw))
    assert casts == []


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("case", POOL_CASES[:2])
def test_avg_pool_bf16(cp, rng, casts, case, include_pad, layout):
    from opgraph.backends.cuda import pool as cuda_pool
    kw = dict(pool_kwargs(case), count_include_pad=include_pad)
    x = bf16(rng.standard_normal(case[0]))
    y = cuda_pool.avg_pool2d(cp, dev(cp, x, layout), **kw)
    y_ref = ref_pool.avg_pool2d(np, x.astype(np.float64), **kw)
    assert_within_ulp(host(cp, y), y_ref)
    gy = bf16(rng.standard_normal(y_ref.shape))
    gx = cuda_pool.avg_pool2d_backward(cp, dev(cp, gy, layout), **kw, input_shape=x.shape)
    assert gx.shape == x.shape and gx.strides == dev(cp, x, layout).strides
    assert_within_ulp(host(cp, gx), ref_pool.avg_pool2d_backward(np, gy.astype(np.float64), **kw,
                                                                 input_shape=x.shape))
    assert casts == []


def test_pool_bf16_specialized(cp, rng, casts):
    """Geometry compiled in: the same bits as the generic kernels."""
    from opgraph.backends.cuda import pool as cuda_pool
    case = POOL_CASES[1]
    kw = pool_kwargs(case)
    x = pool_input(rng, case[0], "nan")
    gy = bf16(rng.standard_normal(ref_pool.max_pool2d(np, x.astype(np.float64), **kw).shape))
    for fn, args in [(cuda_pool.max_pool2d, ()), (cuda_pool.max_pool2d_backward_relu, (gy,))]:
        a = fn(cp, dev(cp, x, "NHWC"), *(dev(cp, g, "NHWC") for g in args), **kw)
        b = fn(cp, dev(cp, x, "NHWC"), *(dev(cp, g, "NHWC") for g in args), **kw, specialize=True)
        np.testing.assert_array_equal(host(cp, a).view(np.uint16), host(cp, b).view(np.uint16))
    assert casts == []


def test_store_rounds_ties_to_even(cp, casts):
    """avg of (1, 1 + 2^-7) = 1 + 2^-8: halfway, rounds to 1 (even); avg of
    (1 + 2^-7, 1 + 2^-6) = 1 + 3*2^-8: halfway, rounds to 1 + 2^-6 (even)."""
    from opgraph.backends.cuda import pool as cuda_pool
    x = bf16([[[[1.0, 1 + 2 ** -7, 1 + 2 ** -7, 1 + 2 ** -6]]]])
    y = cuda_pool.avg_pool2d(cp, dev(cp, x), kernel_size=(1, 2), stride=(1, 2), padding=0, ceil_mode=False,
                             count_include_pad=True)
    np.testing.assert_array_equal(f64(host(cp, y)).ravel(), [1.0, 1 + 2 ** -6])
    assert casts == []


# ------------------------------------------------------------------ LRN

@pytest.mark.parametrize("shape,layout", [((2, 7, 5, 6), "NCHW"), ((2, 7, 5, 6), "NHWC"),
                                          ((3, 6, 5), "NCHW")])
def test_lrn_bf16(cp, rng, casts, shape, layout):
    from opgraph.backends.cuda import lrn as cuda_lrn
    kw = dict(size=5, alpha=1e-2, beta=0.75, k=2.0)
    x, gy = bf16(rng.standard_normal(shape) * 3), bf16(rng.standard_normal(shape))
    put = (lambda a: dev(cp, a, layout)) if len(shape) == 4 else (lambda a: dev(cp, a))
    y = cuda_lrn.local_response_norm(cp, put(x), **kw)
    assert y.dtype == BF16 and y.strides == put(x).strides
    assert_within_ulp(host(cp, y), ref_lrn.local_response_norm(np, x.astype(np.float64), **kw))
    gx = cuda_lrn.local_response_norm_backward(cp, put(x), put(gy), **kw)
    assert gx.dtype == BF16 and gx.strides == put(x).strides
    want = ref_lrn.local_response_norm_backward(np, x.astype(np.float64), gy.astype(np.float64), **kw)
    assert rel_err(host(cp, gx), want) < 1e-2
    assert_within_ulp(host(cp, gx), want, ulps=4)
    assert casts == []


# ------------------------------------------------------------------ softmax family, cross-entropy

@pytest.mark.parametrize("shape,axis", [((8, 10), 1), ((2, 5, 3, 4), 1), ((3, 4, 6), 0)])
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_family_bf16(cp, rng, casts, fn, shape, axis):
    from opgraph.backends.cuda import loss as cuda_loss
    x, gy = bf16(rng.standard_normal(shape) * 4), bf16(rng.standard_normal(shape))
    y = getattr(cuda_loss, fn)(cp, dev(cp, x), axis=axis)
    y_ref = getattr(ref_loss, fn)(np, x.astype(np.float64), axis=axis)
    assert_within_ulp(host(cp, y), y_ref)
    y_in = bf16(y_ref)
    gx = getattr(cuda_loss, fn + "_backward")(cp, dev(cp, y_in), dev(cp, gy), axis=axis)
    want = getattr(ref_loss, fn + "_backward")(np, y_in.astype(np.float64), gy.astype(np.float64), axis=axis)
    assert rel_err(host(cp, gx), want) < 1e-2
    assert casts == []


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_bf16_edges(cp, fn):
    from opgraph.backends.cuda import loss as cuda_loss
    x = bf16([[1e30, -1e30, 0.0], [-np.inf, -np.inf, -np.inf], [1.0, np.nan, 2.0], [3.0, 3.0, 3.0]])
    got = host(cp, getattr(cuda_loss, fn)(cp, dev(cp, x), axis=1))
    with np.errstate(invalid="ignore"):
        assert_within_ulp(got, getattr(ref_loss, fn)(np, x.astype(np.float64), axis=1))
    g = f64(got)
    assert np.isfinite(g[0]).all() and np.isnan(g[1]).all() and np.isnan(g[2]).all()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_bf16(cp, rng, casts, reduction):
    from opgraph.backends.cuda import loss as cuda_loss
    n, c = 16, 10
    logits = bf16(rng.standard_normal((n, c)) * 5)
    logits[0, 0] = 3e38  # a huge logit stays finite
    target = rng.integers(0, c, n).astype(np.int64)
    gy = bf16(np.float32(rng.standard_normal())).reshape(())
    loss = cuda_loss.cross_entropy(cp, dev(cp, logits), cp.asarray(target), reduction=reduction)
    assert loss.shape == () and loss.dtype == BF16
    assert_within_ulp(host(cp, loss), ref_loss.cross_entropy(np, logits.astype(np.float64), target,
                                                            reduction=reduction))
    g = cuda_loss.cross_entropy_backward(cp, dev(cp, logits), cp.asarray(target), dev(cp, gy),
                                         reduction=reduction)
    want = ref_loss.cross_entropy_backward(np, logits.astype(np.float64), target, gy.astype(np.float64),
                                           reduction=reduction)
    assert g.dtype == BF16 and rel_err(host(cp, g), want) < 1e-2
    assert_within_ulp(host(cp, g), want, ulps=2)
    assert casts == [("float_to_bf16_bits", 1)]  # the scalar loss only


# ------------------------------------------------------------------ bias gradient

def _bias_want(gy):
    return gy.astype(np.float64).sum(axis=(0, *range(2, gy.ndim)))


@pytest.mark.parametrize("c", [1, 3, 33, 384])
@pytest.mark.parametrize("nhw", [(2, 3, 5), (3, 20, 21)])  # M = 30: one pass; 1260: two passes
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bias_grad_bf16(cp, rng, casts, layout, nhw, c):
    from opgraph.backends.cuda import colsum as cuda_colsum
    n, h, w = nhw
    gy = bf16(rng.standard_normal((n, c, h, w)))
    got = cuda_colsum.bias_add_backward(cp, dev(cp, gy, layout))
    assert got.dtype == BF16 and got.shape == (c,)
    assert_within_ulp(host(cp, got), _bias_want(gy))
    assert cp.array_equal(cuda_colsum.bias_add_backward(cp, dev(cp, gy, layout)).view(cp.uint16), got.view(cp.uint16))
    assert casts == []


def test_bias_grad_bf16_other_shapes_and_gemv(cp, rng, casts):
    from opgraph.backends.cuda import colsum as cuda_colsum
    for shape in [(7, 5), (6, 40, 1, 1), (2, 7, 1, 257), (3, 6, 9)]:
        gy = bf16(rng.standard_normal(shape))
        assert_within_ulp(host(cp, cuda_colsum.bias_add_backward(cp, dev(cp, gy))), _bias_want(gy))
    empty = cuda_colsum.bias_add_backward(cp, dev(cp, bf16(np.zeros((0, 4, 2, 2))), "NHWC"))
    assert empty.dtype == BF16 and not f64(host(cp, empty)).any()
    assert casts == []
    gy = bf16(rng.standard_normal((3, 33, 20, 21)))
    got = cuda_colsum.bias_add_backward(cp, dev(cp, gy, "NHWC"), method="gemv")  # cuBLAS on a float32 copy
    assert_within_ulp(host(cp, got), _bias_want(gy))
    assert [name for name, _ in casts] == ["bf16_bits_to_float", "float_to_bf16_bits"]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bias_grad_bf16_many_rows(cp, rng, casts, layout):
    """N*H*W = 526,336 rows (pass 1 in 512 chunks for NHWC; 24 rows of
    131,584 elements for NCHW)."""
    from opgraph.backends.cuda import colsum as cuda_colsum
    gy = bf16(rng.standard_normal((8, 3, 256, 257)))
    assert_within_ulp(host(cp, cuda_colsum.bias_add_backward(cp, dev(cp, gy, layout))), _bias_want(gy))
    assert casts == []


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bias_grad_bf16_replays_in_a_cuda_graph(cp, rng, captured_replay, layout):
    """Both bfloat16 paths are our kernels only (no cuBLAS, no CuPy
    reduction), so they capture; a replay reads gy's memory anew."""
    from opgraph.backends.cuda import colsum as cuda_colsum
    gy = bf16(rng.standard_normal((4, 40, 20, 21)))
    dgy = dev(cp, gy, layout)
    doubled = dev(cp, bf16(2 * gy.astype(np.float32)), layout).view(cp.uint16)

    def double_in_place():
        dgy.view(cp.uint16)[...] = doubled

    out, keep = captured_replay(lambda: cuda_colsum.bias_add_backward(cp, dgy), double_in_place)
    assert_within_ulp(host(cp, out), 2 * _bias_want(gy))
    del out, keep


def test_column_sums_bf16(cp, rng, casts):
    from opgraph.backends.cuda import colsum as cuda_colsum
    for m, c in [(30, 7), (40000, 35), (1, 1000)]:
        a = bf16(rng.standard_normal((m, c)))
        got = cuda_colsum.column_sums(cp, dev(cp, a))
        assert got.dtype == BF16 and got.shape == (c,)
        assert_within_ulp(host(cp, got), a.astype(np.float64).sum(0))
    assert casts == []


def test_cuda_rules_take_bfloat16(cp, rng):
    from opgraph import ops
    from opgraph.backends.registry import KernelContext, rules_for
    from opgraph.types import TensorType
    op = ops.MaxPool2d(kernel_size=3, stride=2, padding=1, ceil_mode=True)
    rule = rules_for(ops.MaxPool2d)["cuda"]
    assert rule.decline_reason(op, (TensorType((2, 3, 9, 9), "bfloat16"),), "cuda") is None
    x = bf16(rng.standard_normal((2, 3, 9, 9)))
    y = rule.kernel(KernelContext(cp, "cuda"), op, dev(cp, x))
    assert_same_values(host(cp, y), ref_pool.max_pool2d(np, x.astype(np.float64), **op.params()))


@pytest.mark.parametrize("shape", [(2, 8, 3, 5), (3, 64, 20, 21), (8, 384, 7, 7), (4, 2080, 3, 3), (16, 64, 112, 112)])
def test_bias_grad_vector_method(cp, rng, casts, shape):
    """``method='vector'`` (16-byte loads, ``colsum_vector``; these shapes are ones it takes, so no
    fallback): within one ulp of float64, the same bits on a second call (a fixed order of
    additions), and float32 too."""
    from opgraph.backends.cuda import colsum as cuda_colsum, colsum_vector
    gy = bf16(rng.standard_normal(shape))
    dgy = dev(cp, gy, "NHWC")
    assert colsum_vector.declines(dgy.transpose(0, 2, 3, 1).reshape(-1, shape[1])) is None
    got = cuda_colsum.bias_add_backward(cp, dgy, method="vector")
    assert got.dtype == BF16 and got.shape == (shape[1],)
    assert_within_ulp(host(cp, got), _bias_want(gy))
    again = cuda_colsum.bias_add_backward(cp, dev(cp, gy, "NHWC"), method="vector")
    assert cp.array_equal(again.view(cp.uint16), got.view(cp.uint16))
    assert casts == []
    g32 = rng.standard_normal(shape).astype(np.float32)
    d32 = cp.ascontiguousarray(cp.asarray(g32).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert colsum_vector.declines(d32.transpose(0, 2, 3, 1).reshape(-1, shape[1])) is None
    got32 = cp.asnumpy(cuda_colsum.bias_add_backward(cp, d32, method="vector")).astype(np.float64)
    want32 = g32.astype(np.float64).sum(axis=(0, 2, 3))
    scale = np.abs(g32.astype(np.float64)).sum(axis=(0, 2, 3))
    assert (np.abs(got32 - want32) <= scale * 2.0 ** -20 + 1e-30).all()


def test_vector_column_sums_of_a_channel_slice_and_in_a_cuda_graph(cp, rng, captured_replay):
    """The (N*H*W, 32) rows of channels 32..63 of a 96-channel channels-last buffer, read where they
    lie (rows 192 bytes apart, 64 bytes in); captured into a CUDA graph, a replay reads them anew."""
    from opgraph.backends.cuda import colsum_vector
    wide = bf16(rng.standard_normal((4, 96, 14, 14)))
    dwide = dev(cp, wide, "NHWC")
    rows = dwide.transpose(0, 2, 3, 1)[..., 32:64].reshape(-1, 32)
    assert rows.strides == (192, 2) and colsum_vector.declines(rows) is None
    assert_within_ulp(host(cp, colsum_vector.column_sums(cp, rows)), _bias_want(wide[:, 32:64]))
    doubled = dev(cp, bf16(2 * wide.astype(np.float32)), "NHWC").view(cp.uint16)

    def double_in_place():
        dwide.view(cp.uint16)[...] = doubled

    out, keep = captured_replay(lambda: colsum_vector.column_sums(cp, rows), double_in_place)
    assert_within_ulp(host(cp, out), 2 * _bias_want(wide[:, 32:64]))
    del out, keep
