"""Matrix products on cuBLAS (``cublasGemmEx``) in the policy's precision: the
``cublas`` rules of ``Linear`` and ``MatMul`` (device ``cuda``).

Why: CuPy's ``matmul`` multiplies float32 with the plain fp32 compute type
whatever ``--precision`` asks, so our linear layers stayed fp32 in tf32 and
bf16 runs (1.1 ms of AlexNet's 5.1 ms tf32 step on the H200, where a TF32 GEMM
would take about a tenth: docs/performance.md). ``cublasGemmEx`` takes the
operand type and the compute type per call:

==========  ====================  ==========================================
precision   operands              compute type
==========  ====================  ==========================================
fp32        float32               ``CUBLAS_COMPUTE_32F`` (no TF32)
tf32        float32               ``CUBLAS_COMPUTE_32F_FAST_TF32``
bf16        bfloat16 (rounded)    ``CUBLAS_COMPUTE_32F``
fp16        float16               ``CUBLAS_COMPUTE_32F``
==========  ====================  ==========================================

The output is float32 (cast back to the input's dtype), accumulation fp32
(SEMANTICS.md, "Numbers": half precision accumulates in fp32). bf16 operands
are rounded to nearest even by :func:`cuda_elementwise.float_to_bf16_bits`
and passed as their bit patterns (CuPy has no bfloat16 dtype).

Row-major arrays through column-major cuBLAS (:func:`gemm_ex_args`): a
C-contiguous ``(R, S)`` array is the column-major ``(S, R)`` matrix with
leading dimension ``S``, so the row-major ``C = op(A) @ op(B)`` is the
column-major ``C^T = op(B)^T op(A)^T``: cuBLAS gets ``B`` first, ``m = P``,
``n = M``, and each operand's transpose flag as asked.

Not capturable into a CUDA graph through CuPy (its cuBLAS wrapper refuses
calls during stream capture). The argument mapping is tested on the CPU
against a NumPy column-major GEMM (tests/backends/test_cublas_matmul.py); the
GPU tests (tests/gpu/test_cublas_matmul_gpu.py, passed on the H200 on
2026-11-30) check the products against the float64 reference. The benchmark's
matrix-multiply peak (``benchmarks/peak.py``) times the same call
(:func:`gemm_ex_into`).
"""

from __future__ import annotations

import numpy as np

from opgraph import ops

from .reference.linear import check_linear, matmul_dims
from .reference.rules import params_kernel
from .registry import Rule, register

#: cuBLAS enums (cublas_api.h / library_types.h), stable across CUDA 11-13.
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 77
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_POINTER_MODE_HOST = 0
#: precision -> (operand type, compute type).
GEMM_TYPES = {
    "fp32": (CUDA_R_32F, CUBLAS_COMPUTE_32F),
    "tf32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32),
    "bf16": (CUDA_R_16BF, CUBLAS_COMPUTE_32F),
    "fp16": (CUDA_R_16F, CUBLAS_COMPUTE_32F),
}
_DTYPES = ("float32", "float16")


def cublas_module():
    """CuPy's low-level cuBLAS bindings (``cupy_backends.cuda.libs.cublas``).

    Raises:
        ImportError: CuPy is not installed.
    """
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:  # older layouts
        from cupy.cuda import cublas
    return cublas


def gemm_ex_args(a_shape, b_shape, transpose_a: bool, transpose_b: bool) -> dict:
    """The column-major ``cublasGemmEx`` arguments computing the row-major
    ``(M, P)`` product ``op(a) @ op(b)`` of C-contiguous ``a`` and ``b``
    (module docstring): cuBLAS's first operand is ``b``, its second ``a``."""
    m, k, p = matmul_dims(a_shape, b_shape, transpose_a, transpose_b)
    return {"transa": CUBLAS_OP_T if transpose_b else CUBLAS_OP_N,
            "transb": CUBLAS_OP_T if transpose_a else CUBLAS_OP_N,
            "m": p, "n": m, "k": k, "lda": b_shape[1], "ldb": a_shape[1], "ldc": p}


def _operand(xp, a, precision: str):
    """``a`` C-contiguous in the operand storage of ``precision``."""
    if precision == "bf16":
        from .cuda_elementwise import float_to_bf16_bits
        return xp.ascontiguousarray(float_to_bf16_bits(xp, a.astype(xp.float32, copy=False)))
    want = xp.float16 if precision == "fp16" else xp.float32
    return xp.ascontiguousarray(a.astype(want, copy=False))


def gemm_ex(xp, a, b, *, transpose_a: bool = False, transpose_b: bool = False,
            precision: str | None = None):
    """``op(a) @ op(b)`` for 2-D CuPy arrays through ``cublasGemmEx``, computed in
    ``precision`` (module docstring; None: fp32), returned float32.

    Args:
        a: ``(M, K)``, or ``(K, M)`` with ``transpose_a``; b: ``(K, P)``, or
            ``(P, K)`` with ``transpose_b``; float32 or float16.

    Returns:
        ``(M, P)`` float32 (zeros when ``K == 0``).

    Raises:
        ShapeError: the shapes do not fit; ParameterError: an unknown precision.
    """
    precision = precision or "fp32"
    if precision not in GEMM_TYPES:
        from opgraph.errors import ParameterError
        raise ParameterError("precision", precision, f"must be one of {', '.join(GEMM_TYPES)}")
    m, k, p = matmul_dims(a.shape, b.shape, transpose_a, transpose_b)
    out = xp.zeros((m, p), dtype=xp.float32)
    if out.size == 0 or k == 0:  # cuBLAS need not write C for an empty product
        return out
    gemm_ex_into(xp, _operand(xp, a, precision), _operand(xp, b, precision), out, precision,
                 transpose_a=transpose_a, transpose_b=transpose_b)
    return out


def gemm_ex_into(xp, a, b, out, precision: str, *, transpose_a: bool = False,
                 transpose_b: bool = False) -> None:
    """One ``cublasGemmEx`` call writing the row-major ``op(a) @ op(b)`` into
    ``out`` on CuPy's current stream, computed as ``precision`` says.

    Args:
        a, b: C-contiguous, already in ``precision``'s operand storage
            (float32; float16; bf16 bits as uint16), shapes as :func:`gemm_ex`.
        out: C-contiguous ``(M, P)`` float32, overwritten.

    Raises:
        ShapeError: the shapes do not fit; KeyError: an unknown precision.
    """
    args = gemm_ex_args(a.shape, b.shape, transpose_a, transpose_b)
    operand_type, compute_type = GEMM_TYPES[precision]
    cublas = cublas_module()
    handle = xp.cuda.device.get_cublas_handle()
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)  # host scalars, kept alive
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
    try:
        cublas.gemmEx(handle, args["transa"], args["transb"], args["m"], args["n"], args["k"],
                      one.ctypes.data, b.data.ptr, operand_type, args["lda"],
                      a.data.ptr, operand_type, args["ldb"],
                      zero.ctypes.data, out.data.ptr, CUDA_R_32F, args["ldc"],
                      compute_type, CUBLAS_GEMM_DEFAULT)
    finally:
        cublas.setPointerMode(handle, mode)


def linear(xp, x, w, b=None, *, precision=None):
    """``x @ w.T + b`` (``torch.nn.functional.linear``) through :func:`gemm_ex`:
    x ``(N, in)``, w ``(out, in)``, b ``(out,)`` or None; returns ``(N, out)``
    in x's dtype. Raises ShapeError when the shapes do not fit."""
    check_linear(x.shape, w.shape, None if b is None else b.shape)
    y = gemm_ex(xp, x, w, transpose_b=True, precision=precision)
    if b is not None:
        y += b.astype(xp.float32, copy=False)
    return y.astype(x.dtype, copy=False)


def matmul(xp, a, b, *, transpose_a, transpose_b, precision=None):
    """``op(a) @ op(b)`` (the ``MatMul`` op) through :func:`gemm_ex`: a ``(M, K)``
    (``(K, M)`` with ``transpose_a``), b ``(K, P)`` (``(P, K)`` with
    ``transpose_b``); returns ``(M, P)`` in a's dtype. Raises ShapeError when
    the shapes do not fit (:func:`reference.linear.matmul_dims`)."""
    return gemm_ex(xp, a, b, transpose_a=transpose_a, transpose_b=transpose_b,
                   precision=precision).astype(a.dtype, copy=False)


def check(op, in_types, device):
    """cuBLAS takes 2-D float32/float16 operands here (float64 stays on the reference)."""
    bad = sorted({t.dtype for t in in_types if t.dtype not in _DTYPES})
    if bad:
        return f"the cublas rule takes {', '.join(_DTYPES)}; got {', '.join(bad)}"
    if any(t.ndim != (1 if i == 2 else 2) for i, t in enumerate(in_types)):
        return "the cublas rule takes 2-D operands (and a 1-D bias)"
    return None


def register_rules() -> None:
    """Register the ``cublas`` rules of ``Linear`` and ``MatMul`` (idempotent).
    Not in the cuda default order: reached through ``prefer``, ``force`` or
    autotune, which checks it against the reference first."""
    for op_type, fn in ((ops.Linear, linear), (ops.MatMul, matmul)):
        register(Rule(op_type, "cublas", params_kernel(fn, "cublas", ("precision",)),
                      devices={"cuda"}, check=check,
                      tags={"cublas", "gpu", "option:precision"}))


register_rules()

__all__ = ["GEMM_TYPES", "cublas_module", "gemm_ex_args", "gemm_ex", "gemm_ex_into", "linear",
           "matmul", "check", "register_rules"]
