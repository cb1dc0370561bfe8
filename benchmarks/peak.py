"""The device's matrix-multiply peak, measured once per run and precision.

The fraction of peak a layer reaches is only meaningful against a ceiling
measured on the same machine in the same run (shared machines drift), so
``opgraph-bench`` times one large matrix multiply per precision it reports:

* GPU: ``C = A @ B`` with ``n = 8192`` (2 n^3 FLOPs, multiply-add = 2) through
  cuBLAS ``cublasGemmEx`` on CuPy buffers: fp32 with ``CUBLAS_COMPUTE_32F``
  (TF32 off), tf32 with ``CUBLAS_COMPUTE_32F_FAST_TF32``, bf16 / fp16 inputs
  with fp32 accumulation (``CUBLAS_COMPUTE_32F``); 3 warm-up calls, then
  10 calls timed with CUDA events, the best call kept (a ceiling). The
  result of a small call is checked against a float32 matmul first, so a
  wrong binding cannot report a fast garbage figure.
* CPU: NumPy float32 ``matmul`` with ``n = 2048`` (the BLAS NumPy links),
  1 warm-up and 3 timed calls. The CPU kernels compute in float32 whatever
  the precision asked, so every precision gets the fp32 figure, noted.

A failure (no cuBLAS binding, out of memory) gives ``tflops: None`` and the
reason; the benchmark goes on without the fraction.
"""

from __future__ import annotations

import time

import numpy as np

from opgraph.backends.cuda.cublas import GEMM_TYPES, gemm_ex_into

GPU_N, CPU_N = 8192, 2048


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


def gpu_peak(precision: str, n: int = GPU_N, repeat: int = 10) -> dict:
    """Measured matmul TFLOP/s of the current GPU in ``precision`` (see module doc)."""
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


def cpu_peak(n: int = CPU_N, repeat: int = 3) -> dict:
    """Measured NumPy float32 matmul GFLOP/s of this CPU, as TFLOP/s."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = min(_wall(lambda: a @ b) for _ in range(repeat))
    return {"tflops": 2 * n**3 / (best * 1e12), "best_ms": best * 1e3,
            "method": f"numpy float32 matmul {n}x{n}x{n}, best of {repeat} after 1 warm-up"}


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_peaks(device: str, precisions) -> dict[str, dict]:
    """``{precision: {tflops, best_ms, method[, note | error]}}`` for each
    precision, each measured once (CPU: once for all, see module doc). Never
    raises: a failed measurement has ``tflops: None`` and ``error``."""
    out: dict[str, dict] = {}
    if device == "cpu":
        try:
            base = cpu_peak()
        except Exception as e:  # pragma: no cover - numpy matmul does not fail
            base = {"tflops": None, "error": f"{type(e).__name__}: {e}"}
        for p in precisions:
            out[p] = dict(base)
            if p != "fp32":
                out[p]["note"] = f"the CPU kernels compute {p} requests in float32: fp32 peak"
        return out
    for p in precisions:
        try:
            out[p] = gpu_peak(p)
        except Exception as e:
            out[p] = {"tflops": None, "error": f"{type(e).__name__}: {e}"}
    return out


__all__ = ["measure_peaks", "gpu_peak", "cpu_peak"]
