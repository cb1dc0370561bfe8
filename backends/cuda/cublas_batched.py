"""Batched matrix products on our own cuBLAS handle, capturable into CUDA graphs:
the products of the ``gemm`` convolution (im2col + GEMM) on CuPy.

Why: ``cupy.matmul`` of 3-D and 4-D operands calls cuBLAS on CuPy's handle,
which refuses every call while a stream captures a CUDA graph, and for
operands whose batch is not one uniform stride (the grouped weights broadcast
over the images of ``gemm.forward``) it builds ``cublasGemmBatchedEx``'s
arrays of device pointers on the host and uploads them on every call: a
host-to-device copy per step. On the H200 that kept 64 of ResNet-50's 364
steps out of its CUDA graphs (issue 16). Here each product is
``cublasGemmStridedBatchedEx`` calls on the handle of :func:`.cublas.own_handle`
(nvmath-python's bindings, a fixed workspace, host pointer mode): one call per
index of the outer batch axis, the inner batch axis as cuBLAS's strided batch
(stride 0 for a broadcast operand). Nothing is uploaded, nothing is
synchronised, and the only allocation is the output (CuPy's current allocator:
a replay's private pool during capture).

The mapping of row-major operands onto column-major cuBLAS is
:func:`.cublas.gemm_ex_args`' (``C^T = op(B)^T op(A)^T``), extended to
operands given by strides (:func:`plan_batched`): a matrix whose rows are
contiguous is passed as is, one whose columns are contiguous (a transposed
view such as ``swapaxes(w, 1, 2)``) with the transpose flag, anything else is
copied contiguous first. Operands and output have one dtype: float32 (fp32
compute, no TF32, as ``cupy.matmul`` computes it), float64 or complex64.
Without nvmath-python the product falls back to ``cupy.matmul`` (correct,
not capturable: :func:`.cublas.capture_requirement` says so before a replay
tries). The plan is tested on the CPU against a NumPy emulation of
``cublasGemmStridedBatchedEx`` on flat buffers (tests/backends/test_cublas_batched.py).
"""

from __future__ import annotations

import functools

import attrs
import numpy as np

from .cublas import (CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_32F,
                     capture_requirement, own_handle)

CUDA_R_64F, CUDA_C_32F = 1, 4  # library_types.h
CUBLAS_COMPUTE_64F = 70  # cublas_api.h
#: dtype name -> (cuBLAS data type, compute type, host scalar type of alpha and beta).
BATCHED_TYPES = {
    "float32": (CUDA_R_32F, CUBLAS_COMPUTE_32F, np.float32),
    "float64": (CUDA_R_64F, CUBLAS_COMPUTE_64F, np.float64),
    "complex64": (CUDA_C_32F, CUBLAS_COMPUTE_32F, np.complex64),
}


@attrs.frozen
class GemmCall:
    """One ``cublasGemmStridedBatchedEx`` call. cuBLAS's ``A`` is our right
    operand ``b`` and its ``B`` our left operand ``a``; offsets and strides
    count elements from each array's first element (``out`` for ``C``)."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    offset_a: int
    offset_b: int
    offset_c: int
    stride_a: int
    stride_b: int
    stride_c: int
    batch: int


def matrix_layout(shape, strides) -> tuple[int, int] | None:
    """``(transpose flag, ld)`` passing the last two axes of an operand, the
    row-major ``(rows, cols)`` matrix with element strides ``(s_row, s_col)``,
    to column-major cuBLAS: rows contiguous, it is read as its own transpose
    (flag N, ``ld = s_row``), the product's convention; columns contiguous (a
    transposed view), as the matrix itself, transposed back by flag T (``ld =
    s_col``). None when neither (or a stride is negative): copy it
    contiguous first. An extent of 1 leaves its stride free (CuPy reports any
    value there), so its ``ld`` is the smallest cuBLAS accepts."""
    if any(s < 0 for s in strides):
        return None
    (rows, cols), (s_row, s_col) = shape[-2:], strides[-2:]
    if (cols <= 1 or s_col == 1) and (rows <= 1 or s_row >= cols):
        return CUBLAS_OP_N, (s_row if rows > 1 else max(cols, 1))
    if (rows <= 1 or s_row == 1) and (cols <= 1 or s_col >= rows):
        return CUBLAS_OP_T, (s_col if cols > 1 else max(rows, 1))
    return None


def _batch_strides(shape, strides, batch_shape) -> list[int]:
    """Element strides of an operand over the (two) batch axes, 0 where it is broadcast."""
    pad = len(batch_shape) - (len(shape) - 2)
    ext = [1] * pad + list(shape[:-2])
    st = [0] * pad + list(strides[:-2])
    return [s if e > 1 else 0 for e, s in zip(ext, st)]


def plan_batched(a_shape, a_strides, b_shape, b_strides) -> tuple[tuple[int, ...], list[GemmCall]]:
    """``(output shape, calls)`` computing ``a @ b`` (``numpy.matmul``
    broadcasting over at most two batch axes) into a C-contiguous output.

    Args:
        a_shape, a_strides: ``(..., M, K)`` and its strides in elements.
        b_shape, b_strides: ``(..., K, P)`` and its strides in elements.

    Returns:
        The output shape ``(*batch, M, P)`` and the calls (none for an empty
        output or an empty sum, which the caller fills).

    Raises:
        ValueError: fewer than 2 or more than 4 dimensions, inner extents that
            differ, batch shapes that do not broadcast, or an operand neither
            of whose last two axes is contiguous (:func:`matrix_layout`: copy it).
    """
    if not (2 <= len(a_shape) <= 4 and 2 <= len(b_shape) <= 4):
        raise ValueError(f"batched GEMM takes 2-D to 4-D operands, got {tuple(a_shape)} and {tuple(b_shape)}")
    (m, k), (kb, p) = a_shape[-2:], b_shape[-2:]
    if k != kb:
        raise ValueError(f"batched GEMM: inner extents differ: {tuple(a_shape)} @ {tuple(b_shape)}")
    batch = tuple(np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))
    out_shape = (*batch, m, p)
    la, lb = matrix_layout(a_shape, a_strides), matrix_layout(b_shape, b_strides)
    if la is None or lb is None:
        raise ValueError("batched GEMM: an operand has neither contiguous rows nor contiguous columns")
    if not m or not p or not k or 0 in batch:
        return out_shape, []
    outer_ext, inner_ext = ([1] * (2 - len(batch)) + list(batch))
    sa = _batch_strides(a_shape, a_strides, (outer_ext, inner_ext))
    sb = _batch_strides(b_shape, b_strides, (outer_ext, inner_ext))
    sc = [inner_ext * m * p, m * p]
    inner, outer = (1, 0) if inner_ext >= outer_ext else (0, 1)
    count = (outer_ext, inner_ext)
    calls = [GemmCall(transa=lb[0], transb=la[0], m=p, n=m, k=k, lda=lb[1], ldb=la[1], ldc=max(p, 1),
                      offset_a=j * sb[outer], offset_b=j * sa[outer], offset_c=j * sc[outer],
                      stride_a=sb[inner], stride_b=sa[inner], stride_c=sc[inner], batch=count[inner])
             for j in range(count[outer])]
    return out_shape, calls


def _element_strides(a) -> tuple[int, ...] | None:
    if any(s % a.itemsize for s in a.strides):
        return None
    return tuple(s // a.itemsize for s in a.strides)


def _prepared(xp, a):
    """``a`` itself when :func:`matrix_layout` takes its strides, else a C-contiguous copy."""
    strides = _element_strides(a)
    if strides is None or matrix_layout(a.shape, strides) is None:
        return xp.ascontiguousarray(a)
    return a


#: :func:`plan_batched` once per (shapes, strides): it is pure, and a training
#: step calls :func:`batched_matmul` with the same operands every iteration.
_cached_plan = functools.lru_cache(maxsize=1024)(plan_batched)


def cupy_matmul(xp, a, b, *, out=None, accumulate: bool = False):
    """``a @ b`` by ``cupy.matmul`` (CuPy's cuBLAS handle: any dtype, never
    capturable), into ``out`` (added to it with ``accumulate``) or a new array."""
    product = xp.matmul(a, b)
    if out is None:
        return product
    if accumulate:
        out += product
    else:
        out[...] = product
    return out


def batched_matmul(xp, a, b, *, out=None, accumulate: bool = False):
    """``a @ b`` (``numpy.matmul``: ``(..., M, K) @ (..., K, P)``, at most two
    batch axes, broadcast) of CuPy arrays of one dtype (:data:`BATCHED_TYPES`)
    through ``cublasGemmStridedBatchedEx`` on our own handle (module docstring).

    Args:
        out: a C-contiguous array of the output shape and dtype to write into
            (e.g. a slice of the first axis of a larger one), or None for a new one.
        accumulate: add the product to ``out`` (cuBLAS's beta = 1).

    Returns:
        ``out``, or the new ``(*batch, M, P)`` array.

    Raises:
        ValueError: shapes as :func:`plan_batched`, an unsupported dtype, or
            an ``out`` of another shape or dtype or not C-contiguous.
    """
    if a.dtype != b.dtype or a.dtype.name not in BATCHED_TYPES:
        raise ValueError(f"batched GEMM takes two operands of one of {', '.join(BATCHED_TYPES)}; "
                         f"got {a.dtype} and {b.dtype}")
    own = own_handle(xp)
    if own is None:  # CuPy's cuBLAS: correct, not capturable (capture_requirement says so)
        if xp.cuda.get_current_stream().is_capturing():
            raise RuntimeError(f"cuBLAS inside a CUDA-graph capture: {capture_requirement()}")
        return cupy_matmul(xp, a, b, out=out, accumulate=accumulate)
    a, b = _prepared(xp, a), _prepared(xp, b)
    shape, calls = _cached_plan(tuple(a.shape), _element_strides(a), tuple(b.shape), _element_strides(b))
    if out is None:
        out = (xp.zeros if accumulate or not calls else xp.empty)(shape, dtype=a.dtype)
    elif tuple(out.shape) != shape or out.dtype != a.dtype or not out.flags.c_contiguous:
        raise ValueError(f"batched GEMM: out is {out.dtype}{tuple(out.shape)}; it must be a C-contiguous "
                         f"{a.dtype}{shape}")
    elif not calls and not accumulate:
        out.fill(0)
    data_type, compute_type, scalar = BATCHED_TYPES[a.dtype.name]
    one, beta = np.ones(1, scalar), np.full(1, 1 if accumulate else 0, scalar)  # host, kept alive
    bindings, handle = own
    bindings.set_stream(handle, xp.cuda.get_current_stream().ptr)
    size = a.itemsize
    for c in calls:
        bindings.gemm_strided_batched_ex(
            handle, c.transa, c.transb, c.m, c.n, c.k, one.ctypes.data,
            b.data.ptr + c.offset_a * size, data_type, c.lda, c.stride_a,
            a.data.ptr + c.offset_b * size, data_type, c.ldb, c.stride_b,
            beta.ctypes.data, out.data.ptr + c.offset_c * size, data_type, c.ldc, c.stride_c,
            c.batch, compute_type, CUBLAS_GEMM_DEFAULT)
    return out


__all__ = ["BATCHED_TYPES", "GemmCall", "matrix_layout", "plan_batched", "cupy_matmul", "batched_matmul"]
