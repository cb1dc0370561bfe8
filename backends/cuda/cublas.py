"""Matrix products on cuBLAS (``cublasGemmEx``) in the policy's precision: the
kernels of the ``cublas`` rules of ``Linear`` and ``MatMul`` (device ``cuda``,
registered by :mod:`.cublas_rules`).

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

Accumulation is fp32 (SEMANTICS.md, "Numbers": half precision accumulates in
fp32). The output is float32, cast back to the input's dtype, except where
the storage is the precision's own operand type (bf16 storage computed in
bf16, fp16 in fp16): there cuBLAS rounds the fp32 accumulator straight into
the storage, with a bias added before that rounding (beta = 1). float32
operands of a bf16 product are rounded to nearest even by
:func:`.storage.float_to_bf16_bits`; bfloat16 storage (CuPy arrays of
``ml_dtypes.bfloat16``) is passed as is, through its uint16 bit view.

Row-major arrays through column-major cuBLAS (:func:`gemm_ex_args`): a
C-contiguous ``(R, S)`` array is the column-major ``(S, R)`` matrix with
leading dimension ``S``, so the row-major ``C = op(A) @ op(B)`` is the
column-major ``C^T = op(B)^T op(A)^T``: cuBLAS gets ``B`` first, ``m = P``,
``n = M``, and each operand's transpose flag as asked.

Which cuBLAS bindings (:func:`blas`): CuPy's wrapper refuses every cuBLAS
call while a stream captures a CUDA graph (its ``setStream`` checks), so when
nvmath-python is installed the call goes through its low-level bindings
(``nvmath.bindings.cublas``) on a handle of our own per device, with a fixed
workspace (:data:`CUBLAS_WORKSPACE_BYTES`) so that cuBLAS allocates nothing
during a call: captured, replayed and checked on the H200 on 2026-11-30
(``scripts/gpu_probe.py``). Without nvmath-python, CuPy's handle is used and
the step stays out of CUDA graphs (``opgraph/graph_replay.py`` finds that by a
trial capture). The argument mapping is tested on the CPU
against a NumPy column-major GEMM (tests/backends/test_cublas_matmul.py); the
GPU tests (tests/gpu/test_cublas_matmul_gpu.py, passed on the H200 on
2026-11-30) check the products against the float64 reference. The benchmark's
matrix-multiply peak (:mod:`.matmul_peak`) times the same call
(:func:`gemm_ex_into`).
"""

from __future__ import annotations

import numpy as np

from opgraph import precision as precisions
from opgraph.errors import ShapeError

from ..reference.linear import check_linear, matmul_dims
from .storage import like

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
#: Workspace of our own cuBLAS handle (bytes), cuBLAS's recommendation for
#: Hopper: a handle with its workspace set allocates nothing during a call,
#: which CUDA-graph capture needs.
CUBLAS_WORKSPACE_BYTES = 32 * 2 ** 20


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
    """``a`` C-contiguous in the operand storage of ``precision``
    (:data:`opgraph.precision.IO_DTYPE`; bf16: uint16 bits), converted as our
    kernels convert storage (:func:`.storage.like`)."""
    return xp.ascontiguousarray(like(xp, a, precisions.IO_DTYPE[precision]))


def gemm_ex(xp, a, b, *, transpose_a: bool = False, transpose_b: bool = False,
            precision: str = "fp32"):
    """``op(a) @ op(b)`` for 2-D CuPy arrays through ``cublasGemmEx``, computed in
    ``precision`` (module docstring), returned float32.

    Args:
        a: ``(M, K)``, or ``(K, M)`` with ``transpose_a``; b: ``(K, P)``, or
            ``(P, K)`` with ``transpose_b``; float32, float16 or bfloat16.

    Returns:
        ``(M, P)`` float32 (zeros when ``K == 0``).

    Raises:
        ShapeError: the shapes do not fit; ParameterError: an unknown precision.
    """
    precisions.check(precision)
    m, k, p = matmul_dims(a.shape, b.shape, transpose_a, transpose_b)
    out = xp.zeros((m, p), dtype=xp.float32)
    if out.size == 0 or k == 0:  # cuBLAS need not write C for an empty product
        return out
    gemm_ex_into(xp, _operand(xp, a, precision), _operand(xp, b, precision), out, precision,
                 transpose_a=transpose_a, transpose_b=transpose_b)
    return out


def gemm_ex_into(xp, a, b, out, precision: str, *, transpose_a: bool = False,
                 transpose_b: bool = False, accumulate: bool = False) -> None:
    """One ``cublasGemmEx`` call writing the row-major ``op(a) @ op(b)`` into
    ``out`` on CuPy's current stream, computed as ``precision`` says.

    Args:
        a, b: C-contiguous, already in ``precision``'s operand storage
            (float32; float16; bf16 bits as uint16), shapes as :func:`gemm_ex`.
        precision: a key of :data:`GEMM_TYPES`.

    Through our own handle when nvmath-python is installed (capturable into
    a CUDA graph), else CuPy's (:func:`own_handle`).
        out: C-contiguous ``(M, P)``: float32, or the operands' own storage
            (bf16 bits as uint16 for bf16, float16 for fp16: the product is
            rounded once, from the fp32 accumulator, into it).
        accumulate: add the product to ``out`` (cuBLAS's beta = 1, before the
            one rounding) instead of overwriting it.

    Raises:
        ShapeError: the shapes do not fit, or ``out`` is neither float32 nor
            the operands' storage type; KeyError: an unknown precision.
    """
    args = gemm_ex_args(a.shape, b.shape, transpose_a, transpose_b)
    operand_type, compute_type = GEMM_TYPES[precision]
    out_type = CUDA_R_32F if out.dtype == xp.float32 else operand_type
    if out.dtype != xp.float32 and out.dtype != a.dtype:
        raise ShapeError(f"gemm_ex_into: out is {out.dtype}; it must be float32 or the operands' "
                         f"storage ({a.dtype})")
    one, beta = np.ones(1, np.float32), np.full(1, 1.0 if accumulate else 0.0, np.float32)  # host, kept alive
    call = (args["transa"], args["transb"], args["m"], args["n"], args["k"],
            one.ctypes.data, b.data.ptr, operand_type, args["lda"],
            a.data.ptr, operand_type, args["ldb"],
            beta.ctypes.data, out.data.ptr, out_type, args["ldc"],
            compute_type, CUBLAS_GEMM_DEFAULT)
    own = own_handle(xp)
    if own is not None:
        bindings, handle = own
        bindings.set_stream(handle, xp.cuda.get_current_stream().ptr)
        bindings.gemm_ex(handle, *call)
        return
    cublas = cublas_module()
    handle = xp.cuda.device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
    try:
        cublas.gemmEx(handle, *call)
    finally:
        cublas.setPointerMode(handle, mode)


def own_handle(xp):
    """``(nvmath.bindings.cublas, handle)`` of the current device, or None when
    nvmath-python is not installed (module docstring: why a handle of our own).

    The handle is made on first use, with a workspace of
    :data:`CUBLAS_WORKSPACE_BYTES` from CuPy's pool (kept for the process) and
    host pointer mode, and reused; it is not made while the current stream
    captures (a first allocation inside a graph's capture would belong to the
    graph): that raises RuntimeError, so the trial capture keeps the step eager.
    """
    try:
        from nvmath.bindings import cublas as bindings
    except ImportError:
        return None
    device = xp.cuda.runtime.getDevice()
    if device not in _OWN_HANDLES:
        if xp.cuda.get_current_stream().is_capturing():
            raise RuntimeError("the first cuBLAS call of this device is inside a CUDA-graph capture; "
                               "run the step once eagerly first")
        handle = bindings.create()
        workspace = xp.empty(CUBLAS_WORKSPACE_BYTES, dtype=xp.uint8)
        bindings.set_workspace(handle, workspace.data.ptr, workspace.nbytes)
        bindings.set_pointer_mode(handle, CUBLAS_POINTER_MODE_HOST)
        _OWN_HANDLES[device] = (handle, workspace)
    return bindings, _OWN_HANDLES[device][0]


#: device id -> (our cuBLAS handle, its workspace array, kept alive with it).
_OWN_HANDLES: dict = {}


#: (storage dtype name, precision) pairs whose product cuBLAS writes straight
#: into the storage (operands and output of one type, fp32 accumulation).
_DIRECT = {("bfloat16", "bf16"), ("float16", "fp16")}


def _product(xp, a, b, *, transpose_a, transpose_b, precision, bias=None):
    """``op(a) @ op(b) (+ bias)`` in a's dtype. When a's storage is the
    precision's operand type (bf16 storage in bf16, fp16 in fp16) cuBLAS writes
    the result into that storage directly, the bias broadcast into the output
    first and accumulated (beta = 1), so it is rounded once and no float32
    temporary is made; otherwise through :func:`gemm_ex` (float32) and a cast.

    Raises:
        ParameterError: ``precision`` is not one of :data:`opgraph.precision.PRECISIONS`.
    """
    precisions.check(precision)
    if (a.dtype.name, precision) not in _DIRECT:
        y = gemm_ex(xp, a, b, transpose_a=transpose_a, transpose_b=transpose_b, precision=precision)
        if bias is not None:
            y += bias.astype(xp.float32, copy=False)
        return y.astype(a.dtype, copy=False)
    m, k, p = matmul_dims(a.shape, b.shape, transpose_a, transpose_b)
    out = xp.empty((m, p), dtype=a.dtype)
    if bias is not None:
        out[...] = bias.astype(a.dtype, copy=False)
    elif not k:  # an empty sum: cuBLAS is not called (with beta = 0 it reads nothing)
        out.view(xp.uint16 if a.dtype.name == "bfloat16" else out.dtype).fill(0)
    if out.size and k:
        store = out.view(xp.uint16) if a.dtype.name == "bfloat16" else out
        gemm_ex_into(xp, _operand(xp, a, precision), _operand(xp, b, precision), store, precision,
                     transpose_a=transpose_a, transpose_b=transpose_b, accumulate=bias is not None)
    return out


def linear(xp, x, w, b=None, *, precision):
    """``x @ w.T + b`` (``torch.nn.functional.linear``) through cuBLAS
    (:func:`_product`) in ``precision`` (one of :data:`opgraph.precision.PRECISIONS`;
    the rule passes the one the lower pass resolved): x ``(N, in)``, w
    ``(out, in)``, b ``(out,)`` or None; returns ``(N, out)`` in x's dtype.
    Raises ShapeError when the shapes do not fit, ParameterError for an
    unknown precision."""
    check_linear(x.shape, w.shape, None if b is None else b.shape)
    return _product(xp, x, w, transpose_a=False, transpose_b=True, precision=precision, bias=b)


def matmul(xp, a, b, *, transpose_a, transpose_b, precision):
    """``op(a) @ op(b)`` (the ``MatMul`` op) through cuBLAS (:func:`_product`) in
    ``precision`` (as :func:`linear`):
    a ``(M, K)`` (``(K, M)`` with ``transpose_a``), b ``(K, P)`` (``(P, K)``
    with ``transpose_b``); returns ``(M, P)`` in a's dtype. Raises ShapeError
    when the shapes do not fit (:func:`reference.linear.matmul_dims`)."""
    return _product(xp, a, b, transpose_a=transpose_a, transpose_b=transpose_b, precision=precision)


__all__ = ["CUBLAS_WORKSPACE_BYTES", "GEMM_TYPES", "cublas_module", "own_handle", "gemm_ex_args", "gemm_ex",
           "gemm_ex_into", "linear", "matmul"]
