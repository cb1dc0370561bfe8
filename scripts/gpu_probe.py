"""Facts the GPU code relies on, checked on a GPU machine (one line each).

1. Which CuPy operations take ``ml_dtypes.bfloat16`` arrays: ok (the result's
   dtype) or the exception. The bf16 storage path keeps to what passes here.
2. Whether a ``cublasGemmEx`` through nvmath-python's low-level bindings, on a
   handle of our own with its own workspace, can be captured into a CUDA graph
   (CuPy's bindings refuse any cuBLAS call during capture), and whether its
   replay gives the same product as ``cupy.matmul``.
"""

from __future__ import annotations

import sys


def main() -> int:
    import cupy as cp
    import ml_dtypes
    import numpy as np

    bf = np.dtype(ml_dtypes.bfloat16)
    host = np.arange(-12, 12, dtype=np.float32).reshape(2, 3, 2, 2) / 4
    results = []

    def probe(name, fn):
        try:
            out = fn()
            if out is not None and hasattr(out, "dtype"):
                info = f"dtype={out.dtype}"
            else:
                info = repr(out)[:60]
            results.append((name, "ok", info))
        except Exception as e:  # noqa: BLE001 -- the probe reports every failure
            results.append((name, "FAIL", f"{type(e).__name__}: {str(e)[:160]}"))

    a = None

    def make():
        nonlocal a
        a = cp.asarray(host.astype(bf))
        return a

    probe("asarray(numpy bf16)", make)
    probe("asarray(float32, dtype=bf16)", lambda: cp.asarray(host, dtype=bf))
    probe("empty(bf16)", lambda: cp.empty((4,), dtype=bf))
    probe("zeros(bf16)", lambda: cp.zeros((4,), dtype=bf))
    probe("view uint16", lambda: a.view(cp.uint16))
    probe("uint16 view back", lambda: a.view(cp.uint16).view(bf))
    probe("astype float32", lambda: a.astype(cp.float32))
    probe("float32 astype bf16", lambda: cp.asarray(host).astype(bf))
    probe("asnumpy", lambda: cp.asnumpy(a))
    probe("transpose+ascontiguous", lambda: cp.ascontiguousarray(a.transpose(0, 2, 3, 1)))
    probe("copy", lambda: a.copy())
    probe("slice copy", lambda: a[:, 1:].copy())
    probe("concatenate", lambda: cp.concatenate([a, a], axis=1))
    probe("reshape", lambda: a.reshape(2, -1))
    probe("setitem slice", lambda: a.copy().__setitem__((slice(None), slice(0, 1)), a[:, 1:2]))
    probe("add", lambda: a + a)
    probe("add out=", lambda: cp.add(a, a, out=cp.empty_like(a)))
    probe("maximum", lambda: cp.maximum(a, 0))
    probe("greater", lambda: a > 0)
    probe("where", lambda: cp.where(a > 0, a, cp.zeros((), dtype=bf)))
    probe("sum", lambda: a.sum(axis=(0, 2, 3)))
    probe("sum dtype=float32", lambda: a.sum(axis=(0, 2, 3), dtype=cp.float32))
    probe("matmul", lambda: a.reshape(6, 4) @ a.reshape(6, 4).T)
    probe("pad", lambda: cp.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))))
    probe("ElementwiseKernel T=bf16",
          lambda: cp.ElementwiseKernel("T x", "T y", "y = x > (T)0 ? x : (T)0", "probe_relu")(a))
    probe("ElementwiseKernel float(x)",
          lambda: cp.ElementwiseKernel("T x", "float32 y", "y = (float)x", "probe_cvt")(a))
    probe("isfinite", lambda: cp.isfinite(a))
    probe("abs max", lambda: abs(a).max())
    probe("exp", lambda: cp.exp(a))
    width = max(len(n) for n, _, _ in results)
    for name, status, info in results:
        print(f"{name:<{width}}  {status:<4}  {info}")
    print(f"cupy {cp.__version__}, ml_dtypes {ml_dtypes.__version__}")
    print(capture_probe())
    return 0


def capture_probe() -> str:
    """nvmath cuBLAS gemm_ex captured into a CUDA graph, replayed, checked."""
    import cupy as cp
    import numpy as np
    try:
        from nvmath.bindings import cublas
    except Exception as e:  # noqa: BLE001
        return f"nvmath capture: no nvmath ({type(e).__name__}: {e})"
    try:
        handle = cublas.create()
        ws = cp.empty(32 << 20, dtype=cp.uint8)
        cublas.set_workspace(handle, ws.data.ptr, ws.nbytes)
        cublas.set_pointer_mode(handle, 0)  # host
        a = cp.random.rand(256, 512).astype(cp.float32)
        b = cp.random.rand(512, 128).astype(cp.float32)
        out = cp.zeros((256, 128), cp.float32)
        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            cublas.set_stream(handle, stream.ptr)
            stream.begin_capture()
            # row-major out = a @ b is column-major out^T = b^T a^T: cuBLAS (m, n, k) = (128, 256, 512)
            cublas.gemm_ex(handle, 0, 0, 128, 256, 512, one.ctypes.data, b.data.ptr, 0, 128,
                           a.data.ptr, 0, 512, zero.ctypes.data, out.data.ptr, 0, 128, 68, -1)
            graph = stream.end_capture()
            before = float(abs(out).max())
            graph.launch(stream)
            stream.synchronize()
        err = float(abs(out - a @ b).max() / abs(a @ b).max())
        return (f"nvmath capture: ok (output before replay max {before:.3g}, "
                f"after replay rel. error vs cupy.matmul {err:.2e})")
    except Exception as e:  # noqa: BLE001
        return f"nvmath capture: FAIL {type(e).__name__}: {str(e)[:200]}"


if __name__ == "__main__":
    sys.exit(main())
