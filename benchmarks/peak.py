"""The device's matrix-multiply peak, measured once per run and precision.

The fraction of peak a layer reaches is only meaningful against a ceiling
measured on the same machine in the same run (shared machines drift), so
``opgraph-bench`` times one large matrix multiply per precision it reports:

* GPU: ``C = A @ B`` with ``n = 8192`` through cuBLAS ``cublasGemmEx`` in
  each precision, the best of 10 calls timed with CUDA events after a
  correctness check: the CUDA backend's public
  :func:`opgraph.backends.cuda.matmul_peak.measure_matmul_peak`.
* CPU: NumPy float32 ``matmul`` with ``n = 2048`` (the BLAS NumPy links),
  1 warm-up and 3 timed calls. The CPU kernels compute in float32 whatever
  the precision asked, so every precision gets the fp32 figure, noted.

A failure (no cuBLAS binding, out of memory) gives ``tflops: None`` and the
reason; the benchmark goes on without the fraction.
"""

from __future__ import annotations

import time

import numpy as np

from opgraph.backends.cuda.matmul_peak import measure_matmul_peak

CPU_N = 2048


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
            out[p] = measure_matmul_peak(p)
        except Exception as e:
            out[p] = {"tflops": None, "error": f"{type(e).__name__}: {e}"}
    return out


__all__ = ["measure_peaks", "cpu_peak"]
