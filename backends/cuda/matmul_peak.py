"""The GPU's measured matrix-multiply peak, through the cuBLAS call of our
``cublas`` rules (:func:`.cublas.gemm_ex_into`).

The fraction of peak a layer reaches is only meaningful against a ceiling
measured on the same machine in the same run, so the benchmark
(``benchmarks/peak.py``) times one large product per precision here:
``C = A @ B`` with ``n = 8192`` (``2 n^3`` FLOPs, a multiply-add counted as
2) through ``cublasGemmEx`` on CuPy buffers, fp32 with ``CUBLAS_COMPUTE_32F``
(TF32 off), tf32 with ``CUBLAS_COMPUTE_32F_FAST_TF32``, bf16 / fp16 inputs
with fp32 accumulation (``CUBLAS_COMPUTE_32F``); 3 warm-up calls, then
``repeat`` calls timed with CUDA events, the best call kept (a ceiling). The
result of a small call is checked against a float32 product first, so a
wrong binding cannot report a fast garbage figure.
"""

from __future__ import annotations

from .cublas import GEMM_TYPES, gemm_ex_into

#: Side of the timed square product.
PEAK_N = 8192


def _operands(cupy, n: int, precision: str, seed: int = 0):
    """Device operands ``a``, ``b`` of ``precision``'s storage type, and their
    float32 values (for the correctness check). bf16 is stored as the top 16
    bits of float32 (truncation), so no bfloat16 dtype is needed in CuPy."""
    rs = cupy.random.RandomState(seed)
    a32 = rs.standard_normal((n, n), dtype=cupy.float32)
    b32 = rs.standard_normal((n, n), dtype=cupy.float32)
    if precision == "bf16":
        a, b = [(x.view(cupy.uint32) >> 16).astype(cupy.uint16) for x in (a32, b32)]
        a32, b32 = [(x.astype(cupy.uint32) << 16).view(cupy.float32) for x in (a, b)]
        return a, b, a32, b32
    if precision == "fp16":
        a, b = a32.astype(cupy.float16), b32.astype(cupy.float16)
        return a, b, a.astype(cupy.float32), b.astype(cupy.float32)
    return a32, b32, a32, b32


def _gemm(cupy, a, b, c, n: int, precision: str) -> None:
    """``c = b @ a`` (row-major, ``(n, n)``), fp32 output: the call the
    ``cublas`` matrix-product rules make."""
    gemm_ex_into(cupy, b, a, c, precision)


def measure_matmul_peak(precision: str, n: int = PEAK_N, repeat: int = 10) -> dict:
    """The current GPU's measured matrix-multiply throughput in ``precision``
    (module docstring for the method).

    Args:
        precision: ``'fp32'``, ``'tf32'``, ``'bf16'`` or ``'fp16'``.
        n: side of the square product (default :data:`PEAK_N`).
        repeat: timed calls; the best is kept.

    Returns:
        ``{'tflops', 'best_ms', 'check_rel_error', 'method'}``: TFLOP/s of the
        best call, its time in ms, the relative error of the check product
        (n = 256) against float32, and a sentence naming the method.

    Raises:
        ValueError: an unknown precision; RuntimeError: the check product's
            relative error is 2e-2 or more; ImportError: no CuPy.
    """
    import cupy

    if precision not in GEMM_TYPES:
        raise ValueError(f"precision {precision!r}: must be one of {sorted(GEMM_TYPES)}")
    m = 256  # correctness first
    a, b, a32, b32 = _operands(cupy, m, precision)
    c = cupy.empty((m, m), cupy.float32)
    _gemm(cupy, a, b, c, m, precision)
    want = b32 @ a32
    err = float(cupy.linalg.norm(c - want) / cupy.linalg.norm(want))
    if not err < 2e-2:
        raise RuntimeError(f"cublasGemmEx check failed: relative error {err:.2e}")
    a, b, _, _ = _operands(cupy, n, precision)
    c = cupy.empty((n, n), cupy.float32)
    for _ in range(3):
        _gemm(cupy, a, b, c, n, precision)
    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(repeat)]
    for start, end in events:
        start.record()
        _gemm(cupy, a, b, c, n, precision)
        end.record()
    events[-1][1].synchronize()
    best_ms = min(cupy.cuda.get_elapsed_time(s, e) for s, e in events)
    del a, b, c
    cupy.get_default_memory_pool().free_all_blocks()
    return {"tflops": 2 * n**3 / (best_ms * 1e9), "best_ms": best_ms, "check_rel_error": err,
            "method": f"cublasGemmEx {n}x{n}x{n}, {precision} "
                      f"(compute type {GEMM_TYPES[precision][1]}), best of {repeat} after 3 warm-ups, "
                      "CUDA events"}


__all__ = ["PEAK_N", "measure_matmul_peak"]
