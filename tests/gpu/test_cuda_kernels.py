"""Our CuPy kernels (pooling, ReLU/threshold, LRN, softmax family, cross-entropy,
bias gradient) against the NumPy reference kernels, including the SEMANTICS.md
edge cases: ceil_mode drop rule, count_include_pad divisor, padding as -inf,
NaN propagation, first-max tie rule, all -inf windows, NHWC views, float16,
and tensors over 2^31 elements (64-bit indexing); the channels-last bias
gradient's column-sum kernel against a float64 NumPy sum, both methods, and
captured into a CUDA graph."""

from __future__ import annotations

import numpy as np
import pytest

from opgraph.backends.device import cuda_status
from opgraph.backends.reference import elementwise as ref_ew
from opgraph.backends.reference import loss as ref_loss
from opgraph.backends.reference import lrn as ref_lrn
from opgraph.backends.reference import pool as ref_pool
from opgraph.errors import ExecutionError, ParameterError, ShapeError

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no GPU: {cuda_status()[1]}")]

#: (x shape, kernel_size, stride, padding, ceil_mode)
POOL_CASES = [
    ((2, 3, 7, 9), (3, 3), (2, 2), ((0, 0), (0, 0)), False),   # overlapping, AlexNet style
    ((2, 3, 5, 5), (2, 2), (2, 2), ((1, 1), (1, 1)), True),    # ceil_mode drops the last window
    ((2, 3, 8, 7), (3, 2), (2, 3), ((1, 0), (1, 1)), True),    # asymmetric padding, overhang
    ((1, 2, 6, 6), (3, 3), (1, 1), ((1, 1), (1, 1)), False),   # same-size output
    ((2, 4, 9, 10), (3, 3), (3, 3), ((0, 1), (1, 0)), True),
]


def _pool_data(rng, shape, kind):
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "ties":  # many equal maxima: the first-max rule decides
        x = rng.integers(0, 3, shape).astype(np.float32)
    elif kind == "nan":
        x.flat[rng.choice(x.size, max(1, x.size // 20), replace=False)] = np.nan
    elif kind == "neg_inf":  # whole rows of -inf: all -inf windows next to padding
        x[:, :, : shape[2] // 2] = -np.inf
    elif kind == "signed_zero":  # 0.0 == -0.0: the first of them wins, whichever sign
        x = rng.choice(np.array([0.0, -0.0, -1.0], np.float32), shape)
    return x


def _dev(cp, a, layout):
    d = cp.asarray(a)
    return cp.ascontiguousarray(d.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if layout == "NHWC" else d


def _pool_kwargs(case):
    _, k, s, p, ceil = case
    return dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kind", ["normal", "ties", "nan", "neg_inf", "signed_zero"])
@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("specialize", [False, True])  # geometry as arguments / compiled in
def test_max_pool(cp, rng, case, kind, layout, specialize):
    from opgraph.backends.cuda import pool as cuda_pool
    kw = dict(_pool_kwargs(case), specialize=specialize)
    ref_kw = _pool_kwargs(case)
    x = _pool_data(rng, case[0], kind)
    y_ref = ref_pool.max_pool2d(np, x, **ref_kw)
    y = cuda_pool.max_pool2d(cp, _dev(cp, x, layout), **kw)
    np.testing.assert_array_equal(cp.asnumpy(y), y_ref)  # exact, NaN where the reference has NaN
    gy = rng.standard_normal(y_ref.shape).astype(np.float32)
    gx_ref = ref_pool.max_pool2d_backward(np, x, gy, **ref_kw)
    gx = cuda_pool.max_pool2d_backward(cp, _dev(cp, x, layout), _dev(cp, gy, layout), **kw)
    np.testing.assert_allclose(cp.asnumpy(gx), gx_ref, rtol=1e-6, atol=1e-6)
    assert np.isfinite(cp.asnumpy(gx)).all()
    # through a ReLU (x its output): ReLU's mask folded into the argmax kernel
    gxr = cuda_pool.max_pool2d_backward_relu(cp, _dev(cp, x, layout), _dev(cp, gy, layout), **kw)
    np.testing.assert_allclose(cp.asnumpy(gxr), ref_pool.max_pool2d_backward_relu(np, x, gy, **ref_kw),
                               rtol=1e-6, atol=1e-6)
    v = rng.standard_normal(x.shape).astype(np.float32)
    sel = cuda_pool.max_pool2d_select(cp, _dev(cp, x, layout), _dev(cp, v, layout), **kw)
    np.testing.assert_array_equal(cp.asnumpy(sel), ref_pool.max_pool2d_select(np, x, v, **ref_kw))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("specialize", [False, True])
def test_avg_pool(cp, rng, relerr, case, include_pad, layout, specialize):
    from opgraph.backends.cuda import pool as cuda_pool
    kw = dict(_pool_kwargs(case), count_include_pad=include_pad)
    spec = dict(specialize=specialize)
    x = rng.standard_normal(case[0]).astype(np.float32)
    y_ref = ref_pool.avg_pool2d(np, x.astype(np.float64), **kw)
    y = cuda_pool.avg_pool2d(cp, _dev(cp, x, layout), **kw, **spec)
    assert relerr(cp.asnumpy(y), y_ref) < 1e-6
    gy = rng.standard_normal(y_ref.shape)
    gx_ref = ref_pool.avg_pool2d_backward(np, gy, **kw, input_shape=x.shape)
    gx = cuda_pool.avg_pool2d_backward(cp, _dev(cp, gy.astype(np.float32), layout), **kw,
                                       input_shape=x.shape, **spec)
    assert gx.shape == x.shape and relerr(cp.asnumpy(gx), gx_ref) < 1e-6


def test_pool_float16_and_errors(cp, rng):
    from opgraph.backends.cuda import pool as cuda_pool
    kw = _pool_kwargs(POOL_CASES[2])
    x = rng.standard_normal(POOL_CASES[2][0]).astype(np.float16)
    y = cuda_pool.max_pool2d(cp, cp.asarray(x), **kw)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(cp.asnumpy(y), ref_pool.max_pool2d(np, x, **kw))
    a = cuda_pool.avg_pool2d(cp, cp.asarray(x), **kw, count_include_pad=False)
    np.testing.assert_allclose(cp.asnumpy(a).astype(np.float32),
                               ref_pool.avg_pool2d(np, x, **kw, count_include_pad=False).astype(np.float32),
                               rtol=2e-3, atol=2e-3)
    with pytest.raises(ParameterError):
        cuda_pool.max_pool2d(cp, cp.asarray(x), kernel_size=2, stride=2, padding=2, ceil_mode=False)
    with pytest.raises(ShapeError):
        cuda_pool.max_pool2d(cp, cp.asarray(x[0]), **kw)


def test_max_pool_over_2_31_elements(cp):
    """64-bit indexing: the last planes of a 2^31 + 2^21-element tensor."""
    from opgraph.backends.cuda import pool as cuda_pool
    shape = (2056, 4, 512, 512)
    assert np.prod(shape) > 2 ** 31
    kw = dict(kernel_size=(3, 3), stride=(2, 2), padding=((1, 1), (1, 1)), ceil_mode=True)
    x = cp.random.standard_normal(shape, dtype=cp.float32)
    y = cuda_pool.max_pool2d(cp, x, **kw)
    tail = cp.asnumpy(x[-2:])
    np.testing.assert_array_equal(cp.asnumpy(y[-2:]), ref_pool.max_pool2d(np, tail, **kw))
    gy = cp.random.standard_normal(y.shape, dtype=cp.float32)
    del y
    gx = cuda_pool.max_pool2d_backward(cp, x, gy, **kw)
    want = ref_pool.max_pool2d_backward(np, tail, cp.asnumpy(gy[-2:]), **kw)
    np.testing.assert_allclose(cp.asnumpy(gx[-2:]), want, rtol=1e-6, atol=1e-6)
    del gx
    gx = cuda_pool.max_pool2d_backward(cp, x, gy, **kw, specialize=True)  # 64-bit, geometry compiled in
    np.testing.assert_allclose(cp.asnumpy(gx[-2:]), want, rtol=1e-6, atol=1e-6)
    del x, gy, gx
    cp.get_default_memory_pool().free_all_blocks()


def _special(rng, shape, dtype=np.float32):
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5]
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_relu_threshold(cp, rng, dtype, layout):
    from opgraph.backends.cuda import relu as cuda_relu
    x = _special(rng, (2, 3, 4, 5), dtype)
    gy = _special(rng, x.shape, dtype)
    dx, dgy = _dev(cp, x, layout), _dev(cp, gy, layout)
    checks = [(cuda_relu.relu(cp, dx), ref_ew.relu(np, x)),
              (cuda_relu.relu_backward(cp, dx, dgy), ref_ew.relu_backward(np, x, gy)),
              (cuda_relu.threshold(cp, dx, threshold=0.5, value=1e-6),
               ref_ew.threshold(np, x, threshold=0.5, value=1e-6)),
              (cuda_relu.threshold_backward(cp, dx, dgy, threshold=0.5),
               ref_ew.threshold_backward(np, x, gy, threshold=0.5))]
    for got, want in checks:
        assert got.dtype == dtype and got.strides == dx.strides
        np.testing.assert_array_equal(cp.asnumpy(got), want)


@pytest.mark.parametrize("shape,layout", [((2, 7, 5, 6), "NCHW"), ((2, 7, 5, 6), "NHWC"), ((3, 6, 5), "NCHW")])
@pytest.mark.parametrize("size", [1, 4, 5])
def test_lrn(cp, rng, relerr, shape, layout, size):
    from opgraph.backends.cuda import lrn as cuda_lrn
    kw = dict(size=size, alpha=1e-2, beta=0.75, k=2.0)
    x = rng.standard_normal(shape) * 3
    gy = rng.standard_normal(shape)
    dev = (lambda a: _dev(cp, a.astype(np.float32), layout)) if len(shape) == 4 else \
        (lambda a: cp.asarray(a.astype(np.float32)))
    y = cuda_lrn.local_response_norm(cp, dev(x), **kw)
    assert relerr(cp.asnumpy(y), ref_lrn.local_response_norm(np, x, **kw)) < 1e-5
    gx = cuda_lrn.local_response_norm_backward(cp, dev(x), dev(gy), **kw)
    assert relerr(cp.asnumpy(gx), ref_lrn.local_response_norm_backward(np, x, gy, **kw)) < 1e-5
    x16 = x.astype(np.float16)
    y16 = cuda_lrn.local_response_norm(cp, cp.asarray(x16), **kw)
    assert y16.dtype == np.float16
    np.testing.assert_allclose(cp.asnumpy(y16).astype(np.float32),
                               ref_lrn.local_response_norm(np, x16, **kw).astype(np.float32),
                               rtol=2e-3, atol=2e-3)


SOFTMAX_CASES = [((8, 10), 1), ((2, 5, 3, 4), 1), ((2, 5, 3, 4), -1), ((3, 4, 6), 0)]


@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES)
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_family(cp, rng, relerr, fn, shape, axis):
    from opgraph.backends.cuda import loss as cuda_loss
    x = rng.standard_normal(shape) * 4
    gy = rng.standard_normal(shape)
    fwd, bwd = getattr(cuda_loss, fn), getattr(cuda_loss, fn + "_backward")
    rfwd, rbwd = getattr(ref_loss, fn), getattr(ref_loss, fn + "_backward")
    y = fwd(cp, cp.asarray(x, dtype=cp.float32), axis=axis)
    y_ref = rfwd(np, x, axis=axis)
    assert relerr(cp.asnumpy(y), y_ref) < 1e-5
    gx = bwd(cp, cp.asarray(y_ref, dtype=cp.float32), cp.asarray(gy, dtype=cp.float32), axis=axis)
    assert relerr(cp.asnumpy(gx), rbwd(np, y_ref, gy, axis=axis)) < 1e-5


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_edges(cp, fn):
    from opgraph.backends.cuda import loss as cuda_loss
    x = np.array([[1e30, -1e30, 0.0], [-np.inf, -np.inf, -np.inf], [1.0, np.nan, 2.0], [3.0, 3.0, 3.0]],
                 dtype=np.float32)
    got = cp.asnumpy(getattr(cuda_loss, fn)(cp, cp.asarray(x), axis=1))
    want = getattr(ref_loss, fn)(np, x, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    assert np.isfinite(got[0]).all() and np.isnan(got[1]).all() and np.isnan(got[2]).all()
    h = getattr(cuda_loss, fn)(cp, cp.asarray(x[3:], dtype=cp.float16), axis=1)
    assert h.dtype == np.float16


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cross_entropy(cp, rng, relerr, reduction, dtype):
    from opgraph.backends.cuda import loss as cuda_loss
    n, c = 16, 10
    logits = (rng.standard_normal((n, c)) * 5).astype(dtype)
    logits[0, 0] = 1e4 if dtype == np.float32 else 6e4  # huge logit stays finite
    target = rng.integers(0, c, n).astype(np.int64)
    gy = np.asarray(rng.standard_normal(), dtype=dtype).reshape(())
    tol = 1e-5 if dtype == np.float32 else 2e-3
    loss = cuda_loss.cross_entropy(cp, cp.asarray(logits), cp.asarray(target), reduction=reduction)
    assert loss.shape == () and loss.dtype == dtype
    assert relerr(cp.asnumpy(loss), ref_loss.cross_entropy(np, logits.astype(np.float64), target,
                                                           reduction=reduction)) < tol
    g = cuda_loss.cross_entropy_backward(cp, cp.asarray(logits), cp.asarray(target), cp.asarray(gy),
                                         reduction=reduction)
    want = ref_loss.cross_entropy_backward(np, logits.astype(np.float64), target, gy.astype(np.float64),
                                           reduction=reduction)
    assert g.dtype == dtype and relerr(cp.asnumpy(g), want) < tol


def test_cross_entropy_errors_and_empty(cp):
    from opgraph.backends.cuda import loss as cuda_loss
    logits = cp.zeros((3, 4), dtype=cp.float32)
    with pytest.raises(ExecutionError):
        cuda_loss.cross_entropy(cp, logits, cp.asarray([0, 4, 1]), reduction="mean")
    with pytest.raises(ParameterError):
        cuda_loss.cross_entropy(cp, logits, cp.asarray([0, 1, 1]), reduction="max")
    empty = cuda_loss.cross_entropy(cp, cp.zeros((0, 4), cp.float32), cp.zeros((0,), cp.int64),
                                    reduction="mean")
    assert float(empty) == 0.0


def test_cuda_rules_registered(cp, rng):
    from opgraph import ops
    from opgraph.backends.cuda import rules as cuda_rules
    from opgraph.backends.registry import KernelContext, rules_for
    from opgraph.types import TensorType
    for op_type in (*cuda_rules.NODE_KERNELS, *cuda_rules.CUDA_KERNELS):
        rule = rules_for(op_type)["cuda"]
        assert rule.devices == {"cuda"}
    op = ops.MaxPool2d(kernel_size=3, stride=2, padding=1, ceil_mode=True)
    rule = rules_for(ops.MaxPool2d)["cuda"]
    assert rule.decline_reason(op, (TensorType((2, 3, 9, 9)),), "cuda") is None
    assert rule.decline_reason(op, (TensorType((2, 3, 9, 9), "bfloat16"),), "cuda") is None  # test_bf16_kernels.py
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    y = rule.kernel(KernelContext(cp, "cuda"), op, cp.asarray(x))
    np.testing.assert_array_equal(cp.asnumpy(y), ref_pool.max_pool2d(np, x, **op.params()))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("shape,layout", [((3, 5, 4, 6), "NCHW"), ((3, 5, 4, 6), "NHWC"),
                                          ((0, 5, 4, 6), "NHWC"), ((7, 5), "NCHW")])
def test_bias_add_backward(cp, rng, relerr, dtype, shape, layout):
    from opgraph.backends.cuda import colsum as cuda_colsum
    gy = rng.standard_normal(shape).astype(dtype)
    dgy = _dev(cp, gy, layout) if len(shape) == 4 else cp.asarray(gy)
    got = cuda_colsum.bias_add_backward(cp, dgy)
    want = ref_ew.bias_add_backward(np, gy.astype(np.float64))
    assert got.dtype == dtype and got.shape == (shape[1],)
    if shape[0] == 0:
        assert not cp.asnumpy(got).any()
    else:
        assert relerr(cp.asnumpy(got), want) < (2e-3 if dtype == np.float16 else 1e-6)


#: channel counts of the column-sum tests: 1, under, at and over one 32-column
#: tile, GoogLeNet's 384, and many tiles.
BIAS_CHANNELS = [1, 3, 31, 32, 33, 384, 1000]


def _bias_check(cp, relerr, got, want, dtype, tol):
    assert got.dtype == dtype and got.shape == want.shape
    assert relerr(cp.asnumpy(got), want) < tol


@pytest.mark.parametrize("method", ["columns", "gemv"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("c", BIAS_CHANNELS)
@pytest.mark.parametrize("nhw", [(2, 3, 5), (3, 20, 21)])  # M = 30: one pass; 1260: two passes
def test_bias_add_backward_channels_last(cp, rng, relerr, nhw, c, dtype, method):
    from opgraph.backends.cuda import colsum as cuda_colsum
    n, h, w = nhw
    gy = rng.standard_normal((n, c, h, w)).astype(dtype)
    want = gy.astype(np.float64).sum(axis=(0, 2, 3))
    tol = 2e-3 if dtype == np.float16 else 1e-6
    dgy = _dev(cp, gy, "NHWC")
    got = cuda_colsum.bias_add_backward(cp, dgy, method=method)
    _bias_check(cp, relerr, got, want, dtype, tol)
    if method == "columns":  # deterministic; the kernel itself for any C (C = 1 is NCHW above)
        assert cp.array_equal(cuda_colsum.bias_add_backward(cp, dgy), got)
        rows = dgy.transpose(0, 2, 3, 1).reshape(-1, c)
        _bias_check(cp, relerr, cuda_colsum.column_sums(cp, rows), want, dtype, tol)


@pytest.mark.parametrize("method", ["columns", "gemv"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("c", [1, 3, 33])
def test_bias_add_backward_channels_last_over_2_20_rows(cp, rng, relerr, c, dtype, method):
    """M = N*H*W = 1,052,672 rows: pass 1 runs 512-1024 chunks. float32 sums
    of 2^20 zero-mean terms lose more than the small cases: the column
    kernel's order of additions, replayed in NumPy on these inputs, stays
    below 4e-7; cuBLAS has its own order, hence 1e-5."""
    from opgraph.backends.cuda import colsum as cuda_colsum
    shape = (16, c, 256, 257)
    gy = rng.standard_normal(shape).astype(dtype)
    want = gy.astype(np.float64).sum(axis=(0, 2, 3))
    tol = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    dgy = _dev(cp, gy, "NHWC")
    _bias_check(cp, relerr, cuda_colsum.bias_add_backward(cp, dgy, method=method), want, dtype, tol)
    if method == "columns":
        _bias_check(cp, relerr, cuda_colsum.column_sums(cp, dgy.transpose(0, 2, 3, 1).reshape(-1, c)), want, dtype, tol)


@pytest.mark.parametrize("method", ["columns", "gemv"])
def test_bias_add_backward_channels_last_empty_and_bad_method(cp, method):
    from opgraph.backends.cuda import colsum as cuda_colsum
    gy = _dev(cp, cp.zeros((0, 5, 4, 6), cp.float32), "NHWC")
    got = cuda_colsum.bias_add_backward(cp, gy, method=method)
    assert got.shape == (5,) and got.dtype == np.float32 and not cp.asnumpy(got).any()
    assert not cp.asnumpy(cuda_colsum.column_sums(cp, cp.zeros((0, 5), cp.float16))).any()
    with pytest.raises(ParameterError, match="method"):
        cuda_colsum.bias_add_backward(cp, _dev(cp, cp.ones((2, 5, 4, 6), cp.float32), "NHWC"), method=method + "x")


@pytest.mark.parametrize("method", ["columns", "gemv"])
def test_bias_add_backward_over_2_31_elements(cp, rng, method):
    """64-bit indexing: a channels-last float32 gradient of 2^31 + 2^24
    elements, zero but for the first row, the rows around element 2^31 and
    the last row (of the (N*H*W, C) matrix)."""
    from opgraph.backends.cuda import colsum as cuda_colsum
    n, c, h, w = 2048, 384, 53, 52
    m = n * h * w
    assert m * c > 2 ** 31
    picked = [0, 2 ** 31 // c - 1, 2 ** 31 // c, 2 ** 31 // c + 1, m - 1]  # row 2^31 // c straddles
    vals = rng.standard_normal((len(picked), c)).astype(np.float32)
    rows = cp.zeros((m, c), cp.float32)
    rows[cp.asarray(picked)] = cp.asarray(vals)
    got = cuda_colsum.bias_add_backward(cp, rows.reshape(n, h, w, c).transpose(0, 3, 1, 2), method=method)
    np.testing.assert_allclose(cp.asnumpy(got), vals.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    del rows
    cp.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_large_nchw_bias_add_backward(cp, rng, relerr, dtype):
    """From BIAS_GRAD_SUM_BELOW elements an NCHW gradient takes the row and
    column kernels (no cuBLAS); float32 tolerance as for 2^20 rows above."""
    from opgraph.backends.cuda import colsum as cuda_colsum
    shape = (4, 33, 360, 360)
    assert np.prod(shape) >= cuda_colsum.BIAS_GRAD_SUM_BELOW
    gy = rng.standard_normal(shape).astype(dtype)
    want = gy.astype(np.float64).sum(axis=(0, 2, 3))
    tol = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    _bias_check(cp, relerr, cuda_colsum.bias_add_backward(cp, cp.asarray(gy)), want, dtype, tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape,layout", [((4, 40, 20, 21), "NHWC"), ((8, 64, 182, 182), "NCHW")])
def test_column_kernel_replays_in_a_cuda_graph(cp, rng, relerr, captured_replay, dtype, shape, layout):
    """The point of the column kernel: CuPy refuses cuBLAS during stream
    capture; our two passes capture, and a replay reads gy's memory anew. So
    do the row and column kernels of an NCHW gradient of BIAS_GRAD_SUM_BELOW
    elements or more (the cuda rule declares itself capturable)."""
    from opgraph.backends.cuda import colsum as cuda_colsum
    assert layout == "NHWC" or np.prod(shape) >= cuda_colsum.BIAS_GRAD_SUM_BELOW
    gy = rng.standard_normal(shape).astype(dtype)
    dgy = _dev(cp, gy, layout)
    # gy doubled in place after the capture: the replay must see it
    out, keep = captured_replay(lambda: cuda_colsum.bias_add_backward(cp, dgy), lambda: dgy.__imul__(2))
    tol = 2e-3 if dtype == np.float16 else 1e-6
    assert relerr(cp.asnumpy(out), 2 * gy.astype(np.float64).sum(axis=(0, 2, 3))) < tol
    del out, keep
