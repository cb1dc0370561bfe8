"""The device's measured copy bandwidth: the ceiling of a memory-bound step.

A memory-bound step (an activation, its gradient, a pooling, a bias or
batch-norm reduction, a concat) cannot move its bytes faster than a plain
copy of a large buffer, so its fraction of that copy rate says how far it is
from the physical limit (issue 16: about 4.3 TB/s on the H200). The rate is
measured on the same machine in the same run as the steps it judges:

* ``cuda``: a device-to-device copy (``cupy.ndarray.copy`` into a preallocated
  array: one ``cudaMemcpyAsync``) of :data:`GPU_BYTES`, 3 warm-up calls, then
  ``repeat`` calls timed with CUDA events, the best kept;
* ``cpu``: ``numpy.copyto`` of :data:`CPU_BYTES` between two preallocated
  arrays, timed with ``time.perf_counter``, the best of ``repeat``.

Bytes moved count the read and the write (``2 x size``), as a step's bytes
count its inputs read and its outputs written.
"""

from __future__ import annotations

import time

import numpy as np

#: Buffer sizes (bytes): large enough to leave every cache (the H200's L2 is 60 MB).
GPU_BYTES = 1 << 30
CPU_BYTES = 1 << 27


def measure_copy_bandwidth(device: str, nbytes: int | None = None, repeat: int = 10) -> dict:
    """Measured copy bandwidth of ``device`` (module docstring for the method).

    Args:
        device: ``'cuda'`` or ``'cpu'``.
        nbytes: size of the copied buffer in bytes (default :data:`GPU_BYTES`
            on cuda, :data:`CPU_BYTES` on the CPU).
        repeat: timed copies; the best is kept.

    Returns:
        ``{'gbps', 'best_ms', 'bytes', 'method'}``: GB/s (10^9 bytes per
        second, read plus write) of the best copy, its time in ms, the bytes
        it moved, and a sentence naming the method.

    Raises:
        ValueError: an unknown device, ``nbytes`` < 1 or ``repeat`` < 1;
        ImportError: ``cuda`` without CuPy.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: must be 'cpu' or 'cuda'")
    if repeat < 1:
        raise ValueError(f"repeat {repeat}: must be 1 or more")
    size = int(nbytes if nbytes is not None else (GPU_BYTES if device == "cuda" else CPU_BYTES))
    if size < 1:
        raise ValueError(f"nbytes {size}: must be 1 or more")
    best_ms = _cuda_best_ms(size, repeat) if device == "cuda" else _cpu_best_ms(size, repeat)
    moved = 2 * size
    how = ("device-to-device copy (cudaMemcpyAsync), CUDA events" if device == "cuda"
           else "numpy.copyto, time.perf_counter")
    return {"gbps": moved / (best_ms * 1e6), "best_ms": best_ms, "bytes": moved,
            "method": f"{how}: {size / 2**20:.0f} MiB read and written, best of {repeat}"}


def _cpu_best_ms(size: int, repeat: int) -> float:
    src = np.ones(size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch of dst's pages
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _cuda_best_ms(size: int, repeat: int) -> float:
    import cupy

    src = cupy.ones(size, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    for _ in range(3):
        dst.data.copy_from_device_async(src.data, size)
    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(repeat)]
    for start, end in events:
        start.record()
        dst.data.copy_from_device_async(src.data, size)
        end.record()
    events[-1][1].synchronize()
    best = min(cupy.cuda.get_elapsed_time(s, e) for s, e in events)
    del src, dst
    cupy.get_default_memory_pool().free_all_blocks()
    return best


__all__ = ["GPU_BYTES", "CPU_BYTES", "measure_copy_bandwidth"]
