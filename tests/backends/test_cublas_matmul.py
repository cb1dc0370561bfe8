"""The cuBLAS matrix-product rules (backends/cublas_matmul.py) on the CPU.

What can go wrong without a GPU is the mapping of row-major operands onto
column-major ``cublasGemmEx`` arguments. ``colmajor_gemm`` below does what
the cuBLAS documentation says ``gemmEx`` does with those arguments, on flat
NumPy buffers read in column-major order, so every transpose combination is
checked against ``op(a) @ op(b)``.
"""

from __future__ import annotations

import numpy as np
import pytest

from opgraph import ops
from opgraph.backends import cublas_matmul as cm
from opgraph.backends.reference.linear import matmul_dims
from opgraph.backends.registry import rules_for
from opgraph.errors import ShapeError
from opgraph.types import TensorType


def colmajor(buf, rows, cols, ld):
    """The column-major ``(rows, cols)`` matrix with leading dimension ``ld`` in ``buf``."""
    assert ld >= rows and buf.size >= ld * (cols - 1) + rows
    return np.lib.stride_tricks.as_strided(buf, (rows, cols), (buf.itemsize, ld * buf.itemsize))


def colmajor_gemm(args, a_buf, b_buf):
    """cuBLAS ``C = op(A) op(B)`` (alpha 1, beta 0): A is the first operand."""
    m, n, k = args["m"], args["n"], args["k"]
    a_rows, a_cols = (k, m) if args["transa"] == cm.CUBLAS_OP_T else (m, k)
    b_rows, b_cols = (n, k) if args["transb"] == cm.CUBLAS_OP_T else (k, n)
    A = colmajor(a_buf, a_rows, a_cols, args["lda"])
    B = colmajor(b_buf, b_rows, b_cols, args["ldb"])
    opA = A.T if args["transa"] == cm.CUBLAS_OP_T else A
    opB = B.T if args["transb"] == cm.CUBLAS_OP_T else B
    c = np.zeros(args["ldc"] * n)
    colmajor(c, m, n, args["ldc"])[...] = opA @ opB
    return c


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m,k,p", [(3, 5, 4), (1, 7, 1), (128, 64, 10)])
def test_gemm_ex_arguments_compute_the_row_major_product(transpose_a, transpose_b, m, k, p):
    rng = np.random.default_rng(m * 100 + k * 10 + p)
    a = rng.standard_normal((k, m) if transpose_a else (m, k))
    b = rng.standard_normal((p, k) if transpose_b else (k, p))
    args = cm.gemm_ex_args(a.shape, b.shape, transpose_a, transpose_b)
    # cuBLAS's first operand is b, its second a, both as their C-order buffers
    c = colmajor_gemm(args, np.ascontiguousarray(b).ravel(), np.ascontiguousarray(a).ravel())
    got = c.reshape(m, p)  # column-major (P, M) with ldc = P is row-major (M, P)
    want = (a.T if transpose_a else a) @ (b.T if transpose_b else b)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_shapes_that_do_not_fit_are_refused():
    with pytest.raises(ShapeError, match="inner extents differ"):
        cm.gemm_ex_args((2, 3), (4, 5), False, False)
    with pytest.raises(ShapeError, match="2-D"):
        matmul_dims((2, 3, 4), (4, 5), False, False)
    assert matmul_dims((3, 2), (5, 3), True, True) == (2, 3, 5)


def test_rules_are_registered_for_cuda_only_and_take_the_precision():
    for op_type in (ops.Linear, ops.MatMul):
        rule = rules_for(op_type)["cublas"]
        assert rule.devices == frozenset({"cuda"}) and "option:precision" in rule.tags
    f32 = TensorType((4, 3), "float32")
    lin = ops.Linear()
    assert cm.check(lin, [f32, TensorType((5, 3), "float32"), TensorType((5,), "float32")], "cuda") is None
    assert "float64" in cm.check(lin, [TensorType((4, 3), "float64"), TensorType((5, 3), "float64")], "cuda")
    assert "2-D" in cm.check(lin, [TensorType((4, 3, 2), "float32"), f32], "cuda")


def test_gemm_types_are_the_cublas_enums_of_each_precision():
    # library_types.h: CUDA_R_32F 0, CUDA_R_16F 2, CUDA_R_16BF 14; cublas_api.h:
    # CUBLAS_COMPUTE_32F 68, CUBLAS_COMPUTE_32F_FAST_TF32 77
    assert cm.GEMM_TYPES == {"fp32": (0, 68), "tf32": (0, 77), "bf16": (14, 68), "fp16": (2, 68)}
