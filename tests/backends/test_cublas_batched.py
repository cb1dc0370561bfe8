"""The capturable batched GEMM of the ``gemm`` convolution on CuPy
(backends/cuda/cublas_batched.py), on the CPU.

What can go wrong without a GPU is the plan: the column-major
``cublasGemmStridedBatchedEx`` arguments, offsets and batch strides that
compute ``numpy.matmul`` of strided, transposed and broadcast views.
``strided_batched_gemm`` below does what the cuBLAS documentation says that
call does, on the flat NumPy buffers the views live in, and the result is
compared with ``numpy.matmul`` of the views.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from opgraph.backends.cuda import cublas as cm
from opgraph.backends.cuda.cublas_batched import BATCHED_TYPES, matrix_layout, plan_batched


def colmajor(buf, offset, rows, cols, ld):
    """The column-major ``(rows, cols)`` matrix with leading dimension ``ld`` at ``buf[offset:]``."""
    assert ld >= max(rows, 1) and offset >= 0
    return np.lib.stride_tricks.as_strided(buf[offset:], (rows, cols), (buf.itemsize, ld * buf.itemsize))


def strided_batched_gemm(c, a_buf, b_buf, c_buf):
    """cuBLAS ``C_t = op(A_t) op(B_t)`` for ``t < batch`` (alpha 1, beta 0),
    ``A_t`` at ``offset_a + t * stride_a`` of ``a_buf``, and so on."""
    a_rows, a_cols = (c.k, c.m) if c.transa == cm.CUBLAS_OP_T else (c.m, c.k)
    b_rows, b_cols = (c.n, c.k) if c.transb == cm.CUBLAS_OP_T else (c.k, c.n)
    for t in range(c.batch):
        A = colmajor(a_buf, c.offset_a + t * c.stride_a, a_rows, a_cols, c.lda)
        B = colmajor(b_buf, c.offset_b + t * c.stride_b, b_rows, b_cols, c.ldb)
        opA = A.T if c.transa == cm.CUBLAS_OP_T else A
        opB = B.T if c.transb == cm.CUBLAS_OP_T else B
        colmajor(c_buf, c.offset_c + t * c.stride_c, c.m, c.n, c.ldc)[...] = opA @ opB


def _elements(view, base):
    """``(offset of view's first element in base, element strides)``."""
    size = base.itemsize
    offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // size
    return offset, tuple(s // size for s in view.strides)


def _run(a, a_base, b, b_base):
    """The plan executed by the emulator on the views' own buffers."""
    a_off, a_st = _elements(a, a_base)
    b_off, b_st = _elements(b, b_base)
    shape, calls = plan_batched(a.shape, a_st, b.shape, b_st)
    out = np.full(int(np.prod(shape)), np.nan)
    for c in calls:  # the kernel adds each view's own offset to the call's (pointer + offset)
        c = attrs.evolve(c, offset_a=c.offset_a + b_off, offset_b=c.offset_b + a_off)
        strided_batched_gemm(c, b_base, a_base, out)
    return out.reshape(shape)


def _grouped_conv_operands(rng, n, G, og, K, L):
    """The three products of ``gemm.py`` on views as it makes them."""
    wbuf = rng.standard_normal(G * og * K)
    wm = wbuf.reshape(G, og, K)
    cbuf = rng.standard_normal(n * G * K * L)
    cols = cbuf.reshape(n, G, K, L)
    ybuf = rng.standard_normal(n * G * og * L)
    gy = ybuf.reshape(n, G, og, L)
    return wbuf, wm, cbuf, cols, ybuf, gy


@pytest.mark.parametrize("n,G,og,K,L", [(3, 1, 4, 5, 6), (2, 3, 2, 4, 5), (1, 4, 1, 3, 1), (5, 2, 3, 1, 2)])
def test_the_three_gemm_products_are_planned_right(n, G, og, K, L):
    rng = np.random.default_rng(n * 1000 + G * 100 + og * 10 + K)
    wbuf, wm, cbuf, cols, ybuf, gy = _grouped_conv_operands(rng, n, G, og, K, L)
    # forward: (G, Og, K) @ (n, G, K, L), the weights broadcast over the images
    np.testing.assert_allclose(_run(wm, wbuf, cols, cbuf), np.matmul(wm, cols), rtol=1e-12)
    # backward-data: the transposed weights (columns contiguous: the T flag)
    wt = np.swapaxes(wm, 1, 2)
    np.testing.assert_allclose(_run(wt, wbuf, gy, ybuf), np.matmul(wt, gy), rtol=1e-12)
    # backward-filter: (G, Og, n*L) @ swapaxes((G, K, n*L), 1, 2)
    gyc = gy.transpose(1, 2, 0, 3).reshape(G, og, n * L).copy()
    c3 = cols.transpose(1, 2, 0, 3).reshape(G, K, n * L).copy()
    colsT = np.swapaxes(c3, 1, 2)
    got = _run(gyc, gyc.reshape(-1), colsT, c3.reshape(-1))
    np.testing.assert_allclose(got, np.matmul(gyc, colsT), rtol=1e-12)


def test_a_sliced_operand_and_a_two_d_product():
    rng = np.random.default_rng(7)
    buf = rng.standard_normal(6 * 10)
    a = buf.reshape(6, 10)[1:5, 2:9]  # rows contiguous, ld 10, offset 12
    bbuf = rng.standard_normal(7 * 3)
    b = bbuf.reshape(3, 7).T  # columns contiguous
    np.testing.assert_allclose(_run(a, buf, b, bbuf), a @ b, rtol=1e-12)


def test_layouts_that_cublas_cannot_read_are_refused():
    assert matrix_layout((4, 5), (5, 1)) == (cm.CUBLAS_OP_N, 5)
    assert matrix_layout((4, 5), (1, 4)) == (cm.CUBLAS_OP_T, 4)
    assert matrix_layout((4, 5), (10, 2)) is None  # neither axis contiguous: copy first
    assert matrix_layout((4, 5), (-5, 1)) is None
    assert matrix_layout((1, 5), (123, 1)) == (cm.CUBLAS_OP_N, 5)  # a free stride of a unit extent
    with pytest.raises(ValueError, match="inner extents"):
        plan_batched((2, 3), (3, 1), (4, 5), (5, 1))
    with pytest.raises(ValueError, match="2-D to 4-D"):
        plan_batched((1, 1, 1, 2, 3), (6, 6, 6, 3, 1), (3, 4), (4, 1))
    with pytest.raises(ValueError, match="neither contiguous"):
        plan_batched((2, 3), (6, 2), (3, 4), (4, 1))


def test_empty_products_make_no_call():
    assert plan_batched((0, 2, 3), (6, 3, 1), (3, 4), (4, 1)) == ((0, 2, 4), [])
    assert plan_batched((2, 0), (0, 1), (0, 4), (4, 1)) == ((2, 4), [])


def test_data_types_are_the_cublas_enums():
    # library_types.h: CUDA_R_32F 0, CUDA_R_64F 1, CUDA_C_32F 4; cublas_api.h: COMPUTE_32F 68, 64F 70
    assert {k: v[:2] for k, v in BATCHED_TYPES.items()} == {"float32": (0, 68), "float64": (1, 70),
                                                             "complex64": (4, 68)}


@pytest.mark.parametrize("G", [1, 2])
def test_the_1x1_products_are_planned_without_a_copy(G):
    """``gemm_pointwise``'s operands as it makes them: NHWC pixel matrices (rows
    contiguous) against the weights or their transpose, and the backward-filter's
    transposed pixel matrix; NCHW with groups, the images folded into the
    contracted axis. Each must be planned as it is (no copy) and compute matmul."""
    from opgraph.backends.algorithms.gemm_pointwise import _pixels
    from opgraph.types import to_layout
    rng = np.random.default_rng(G)
    n, c, h, w, o = 2, 4, 3, 5, 6
    x = to_layout(np, rng.standard_normal((n, c, h, w)), "NHWC")
    gy = to_layout(np, rng.standard_normal((n, o, h, w)), "NHWC")
    xbuf, gbuf = x.transpose(0, 2, 3, 1).reshape(-1), gy.transpose(0, 2, 3, 1).reshape(-1)
    wbuf = rng.standard_normal(o * (c // G))
    wm = wbuf.reshape(G, o // G, c // G)
    if G == 1:
        px, pg = _pixels(np, x), _pixels(np, gy)
        for a, abuf, b, bbuf in [(px, xbuf, wm[0].T, wbuf), (pg, gbuf, wm[0], wbuf), (pg.T, gbuf, px, xbuf)]:
            assert matrix_layout(a.shape, tuple(s // 8 for s in a.strides)) is not None
            np.testing.assert_allclose(_run(a, abuf, b, bbuf), a @ b, rtol=1e-12)
    else:  # NCHW: the folded operands gemm_pointwise copies contiguous
        L = h * w
        xc, gc = np.ascontiguousarray(x), np.ascontiguousarray(gy)
        a = np.ascontiguousarray(gc.reshape(n, G, o // G, L).transpose(1, 2, 0, 3)).reshape(G, o // G, n * L)
        b = np.ascontiguousarray(xc.reshape(n, G, c // G, L).transpose(1, 0, 3, 2)).reshape(G, n * L, c // G)
        np.testing.assert_allclose(_run(a, a.reshape(-1), b, b.reshape(-1)), a @ b, rtol=1e-12)
