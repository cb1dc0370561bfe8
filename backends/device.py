"""Devices: which one to run on, its array module, and moving arrays to it.

Two devices exist: ``'cpu'`` (NumPy) and ``'cuda'`` (CuPy on the current
CUDA device). ``'auto'`` picks ``'cuda'`` when CuPy imports and sees at least
one GPU, else ``'cpu'``, and says why (:func:`resolve_device`). The passes
reach these functions through the registry (``registry.device_support``),
where this module registers them.

Nothing here imports CuPy or the cuDNN frontend at module import: a CPU-only
machine imports this module, and the whole of opgraph, without either. A GPU
that is absent, or a CuPy that cannot load, is reported once as a
:class:`DeviceUnavailableError` when ``'cuda'`` is asked for explicitly.
"""

from __future__ import annotations

import functools
import os
import platform
from types import ModuleType

import numpy as np

from opgraph.errors import OpgraphError, ParameterError

from .registry import DeviceSupport, register_devices

DEVICES = ("cpu", "cuda")


class DeviceUnavailableError(OpgraphError):
    """``device='cuda'`` was asked for, but CuPy cannot load or sees no GPU."""


class ResolvedDevice(str):
    """A device name (``'cpu'`` or ``'cuda'``) that also carries ``reason``,
    the human-readable explanation of why it was chosen."""

    reason: str

    def __new__(cls, name: str, reason: str) -> "ResolvedDevice":
        obj = super().__new__(cls, name)
        obj.reason = reason
        return obj


@functools.lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """``(usable, why)`` for the CUDA device, probed once per process.

    Usable means: ``import cupy`` works and the CUDA runtime reports at least
    one device. ``why`` names the device or says what failed and how to fix it.
    """
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising anything
        return False, (f"CuPy cannot be imported ({type(exc).__name__}: {exc}); "
                       "install it with pip install -e \".[bench,cuda12]\" or \".[bench,cuda13]\"")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver, no device
        return False, f"CuPy {cupy.__version__} sees no usable GPU ({exc})"
    if count < 1:
        return False, f"CuPy {cupy.__version__} sees no GPU (device count 0)"
    try:
        name = _gpu_name(cupy, cupy.cuda.runtime.getDevice())
    except Exception as exc:
        return False, f"CuPy {cupy.__version__} cannot query the GPU ({exc})"
    return True, f"CuPy {cupy.__version__} sees {count} GPU(s); using {name}"


def resolve_device(device: str = "auto") -> ResolvedDevice:
    """The concrete device for ``device`` in ``{'auto', 'cpu', 'cuda'}``.

    Returns:
        A :class:`ResolvedDevice`: compares equal to ``'cpu'`` or ``'cuda'``;
        its ``.reason`` says why (e.g. "auto: CuPy 14.2.0 sees 1 GPU(s); using
        NVIDIA H200").

    Raises:
        DeviceUnavailableError: ``'cuda'`` asked for and not usable (the
            message says why and how to install CuPy).
        ParameterError: an unknown device name (a ``ValueError`` too).
    """
    name = str(device).lower()
    if name == "cpu":
        # asked for by name: whether it was the caller's default is the caller's to say (passes/compiler.py)
        return ResolvedDevice("cpu", "cpu: the device asked for")
    if name in ("cuda", "gpu"):
        ok, why = cuda_status()
        if not ok:
            raise DeviceUnavailableError(f"device 'cuda' is unavailable: {why}. "
                                         "Use device='cpu' (or 'auto') to run on the CPU.")
        return ResolvedDevice("cuda", f"cuda: {why}")
    if name == "auto":
        ok, why = cuda_status()
        return ResolvedDevice("cuda" if ok else "cpu",
                              f"auto: {why}" + ("" if ok else "; falling back to the CPU"))
    raise ParameterError("device", device, "must be one of 'auto', 'cpu', 'cuda'")


def array_module(device: str) -> ModuleType:
    """``numpy`` for ``'cpu'``, ``cupy`` for ``'cuda'``.

    Raises:
        DeviceUnavailableError: ``'cuda'`` and CuPy is not usable.
    """
    if resolve_device(device) == "cpu":
        return np
    import cupy
    return cupy


def is_device_array(array) -> bool:
    """True for a CuPy array (without importing CuPy when it is not loaded)."""
    return type(array).__module__.startswith("cupy")


def to_device(array, device: str):
    """``array`` on ``device``: a NumPy array for ``'cpu'``, a CuPy array for
    ``'cuda'`` (dtype kept; no copy when it is already there)."""
    if resolve_device(device) == "cpu":
        return to_host(array)
    import cupy
    return cupy.asarray(array)


def to_host(array):
    """A NumPy array holding ``array`` (a CuPy array is copied to the host,
    which waits for the work that produces it); NumPy input is returned as is."""
    if is_device_array(array):
        return array.get()
    return np.asarray(array)


def synchronize(device: str) -> None:
    """Wait for all queued work on ``device`` (no-op on the CPU)."""
    if device == "cuda":
        import cupy
        cupy.cuda.Device().synchronize()


def device_memory_bytes(device: str) -> int | None:
    """Total memory of the current CUDA device in bytes (``cudaMemGetInfo``);
    None for ``'cpu'``.

    Raises:
        DeviceUnavailableError: ``'cuda'`` asked for, no usable GPU.
    """
    if resolve_device(device) == "cuda":
        import cupy
        return int(cupy.cuda.runtime.memGetInfo()[1])
    return None


def _gpu_name(cupy, index: int) -> str:
    name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def device_name(device: str) -> str:
    """Human-readable name: the GPU's (``'NVIDIA H200'``) or the CPU's."""
    if resolve_device(device) == "cuda":
        import cupy
        return _gpu_name(cupy, cupy.cuda.runtime.getDevice())
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def _version_triple(v: int) -> str:
    """CUDA's ``1000*major + 10*minor`` encoding as ``'major.minor'``."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def versions() -> dict[str, str | None]:
    """Library versions for result files and autotune-cache keys.

    Keys: ``numpy``, ``cupy``, ``cuda_runtime``, ``cuda_driver``,
    ``cudnn_backend``, ``cudnn_frontend``, ``gpu``. A library that is absent
    (or a query that fails) gives ``None``; this function never raises.
    """
    out: dict[str, str | None] = {"numpy": np.__version__, "cupy": None, "cuda_runtime": None,
                                  "cuda_driver": None, "cudnn_backend": None,
                                  "cudnn_frontend": None, "gpu": None}
    ok, _ = cuda_status()
    if ok:
        import cupy
        out["cupy"] = cupy.__version__
        for key, query in (("cuda_runtime", cupy.cuda.runtime.runtimeGetVersion),
                           ("cuda_driver", cupy.cuda.runtime.driverGetVersion)):
            try:
                out[key] = _version_triple(query())
            except Exception:
                pass
        try:
            out["gpu"] = device_name("cuda")
        except Exception:
            pass
    try:
        import cudnn
        out["cudnn_frontend"] = getattr(cudnn, "__version__", None)
        if ok:
            v = cudnn.backend_version()  # 91900 for 9.19.0
            out["cudnn_backend"] = f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
    except Exception:
        pass
    return out


def tune_timer(device: str, clock: str):
    """Autotune's timer on ``device`` for the policy's ``tune_clock``: on cuda,
    ``'device'`` holds the stream while the calls are queued, so each is timed
    alone on the GPU (``backends/cuda/held_stream.py``); anything else (the
    ``'launch'`` clock, the CPU) is the passes' default (None)."""
    if device == "cuda" and clock == "device":
        from .cuda.held_stream import HeldStreamTimer
        return HeldStreamTimer()
    return None


register_devices(DeviceSupport(resolve=resolve_device, array_module=array_module, versions=versions,
                               device_name=device_name, tune_timer=tune_timer))

__all__ = ["DEVICES", "DeviceUnavailableError", "ResolvedDevice", "cuda_status", "resolve_device",
           "array_module", "is_device_array", "to_device", "to_host", "synchronize",
           "device_memory_bytes", "device_name", "versions", "tune_timer"]
