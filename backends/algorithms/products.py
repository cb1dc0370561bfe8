"""The matrix products of the convolution algorithms (im2col + GEMM, FFT), on
NumPy or CuPy.

On CuPy they go through our own cuBLAS handle
(:func:`..cuda.cublas_batched.batched_matmul`), because ``cupy.matmul`` calls
cuBLAS on CuPy's handle, which refuses every call while a stream captures a
CUDA graph: on the H200 (2026-12-02, fp32 ResNet-50) the 13 FFT backward-data
steps the tuner picked failed their trial capture with "calling cuBLAS API
during stream capture is currently unsupported" and ran eagerly between the
graphs of the replay. The dtypes our handle takes are
:data:`~..cuda.cublas_batched.BATCHED_TYPES` (float32, float64, complex64);
another (complex128, the FFT of float64) stays on CuPy's handle: correct, not
capturable.
"""

from __future__ import annotations

import numpy as np

#: the largest matrix dimension a 32-bit BLAS interface (cuBLAS's) takes
INT32_LIMIT = 2**31 - 1


def matmul(xp, a, b, *, out=None, accumulate: bool = False):
    """``a @ b`` (``numpy.matmul`` broadcasting, at most two batch axes on CuPy)
    into ``out`` (a C-contiguous array of the product's shape; added to it with
    ``accumulate``) or a new array.

    Raises:
        ValueError: operand shapes that do not multiply (NumPy's or
            :func:`..cuda.cublas_batched.plan_batched`'s message).
    """
    if xp is np:
        if accumulate:
            out += np.matmul(a, b)
            return out
        return np.matmul(a, b, out=out)
    from ..cuda.cublas_batched import BATCHED_TYPES, batched_matmul, cupy_matmul
    if a.dtype == b.dtype and a.dtype.name in BATCHED_TYPES:
        return batched_matmul(xp, a, b, out=out, accumulate=accumulate)
    return cupy_matmul(xp, a, b, out=out, accumulate=accumulate)


__all__ = ["INT32_LIMIT", "matmul"]
