"""What every ``opgraph-bench`` result file records about where it ran.

Time stamp, device and its name, the NVIDIA driver, CUDA runtime and driver
API, cuDNN (backend and frontend), CuPy, NumPy, PyTorch (and its cuDNN when
the peer ran), Python, platform, CPU count, the git commit of the checkout
(``+dirty`` with uncommitted changes) and the command line; the caller adds
precision, layout, batch and protocol settings, and the thread counts
(:func:`thread_counts`: NumPy's BLAS threads, PyTorch's, and the variables
that set them), which a CPU comparison with PyTorch depends on.

Nothing here imports PyTorch unless asked (:func:`thread_counts` of a run
that compares with it, which imports it anyway; its version comes from
package metadata) and nothing raises: an absent library or a failed query is
``None``.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from opgraph.backends import device as dev


def git_commit(path: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding this file (with
    ``+dirty`` when it has changes), or None outside a git checkout."""
    where = Path(path or __file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_version(dist: str) -> str | None:
    """Installed version of distribution ``dist`` (no import), or None."""
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def nvidia_driver() -> str | None:
    """The NVIDIA kernel driver version (``nvidia-smi``), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""
    return line or None


#: The environment variables the BLAS libraries (and PyTorch's OpenMP) read their thread counts from.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: The variables each BLAS reads, in its order of precedence (the first set one wins).
_BLAS_VARIABLES = {"openblas": ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"),
                   "mkl": ("MKL_NUM_THREADS", "OMP_NUM_THREADS")}


def numpy_blas() -> str | None:
    """``'openblas'`` or ``'mkl'``: the BLAS NumPy was built with (its build
    configuration), or None when it cannot tell."""
    try:
        name = str(np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]).lower()
    except Exception:  # NumPy < 1.26 prints its configuration only
        return None
    return next((k for k in _BLAS_VARIABLES if k in name), None)


def _positive(text) -> int | None:
    try:
        n = int(str(text).strip())
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def numpy_library_dirs() -> tuple[Path, ...]:
    """The folders NumPy's own shared libraries lie in: its package folder (a
    macOS wheel's ``numpy/.dylibs``, a build's own links) and the ``numpy.libs``
    folder beside it (the Linux and Windows wheels' bundled OpenBLAS), resolved."""
    package = Path(np.__file__).resolve().parent
    return package, package.parent / "numpy.libs"


def numpy_blas_entry(info) -> dict | None:
    """Of ``threadpoolctl.threadpool_info()``'s entries, the BLAS that NumPy
    loaded: the one whose ``filepath`` lies under :func:`numpy_library_dirs`.
    Not the first BLAS entry: SciPy's wheels bundle an OpenBLAS of their own
    (``scipy.libs/libscipy_openblas...``), listed first once SciPy is imported
    (opgraph imports it), and PyTorch may load another; each has its own thread
    count. None when no entry lies there (a NumPy linked to a system BLAS)."""
    dirs = numpy_library_dirs()
    for entry in info:
        path = entry.get("filepath")
        if entry.get("user_api") != "blas" or not path:
            continue
        try:
            where = Path(path).resolve()
        except (OSError, RuntimeError, TypeError, ValueError):
            continue
        if any(where.is_relative_to(d) for d in dirs):
            return entry
    return None


def blas_threads() -> tuple[int | None, str]:
    """The number of threads NumPy's BLAS runs with, and where it was read:
    the library's own count through ``threadpoolctl`` when that is installed
    and lists NumPy's own BLAS (:func:`numpy_blas_entry`: by its file, never
    SciPy's or PyTorch's, which the process may have loaded too), else the
    environment variable the library reads (``OPENBLAS_NUM_THREADS``,
    ``MKL_NUM_THREADS``, ``OMP_NUM_THREADS``: :data:`_BLAS_VARIABLES`); None
    when neither tells (the library's default, one thread per CPU for OpenBLAS)."""
    try:
        from threadpoolctl import threadpool_info

        info, listed = threadpool_info(), True
    except Exception:  # not installed, or it failed: the variables say what they set
        info, listed = [], False
    entry = numpy_blas_entry(info)
    if entry is not None and _positive(entry.get("num_threads")):
        return int(entry["num_threads"]), f"threadpoolctl ({entry.get('internal_api')})"
    name = numpy_blas()
    for var in _BLAS_VARIABLES.get(name, ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")):
        n = _positive(os.environ.get(var))
        if n is not None:
            return n, var
    why = "threadpoolctl lists no BLAS of NumPy's own" if listed else "no threadpoolctl"
    return None, (f"unknown: {why}, and none of {', '.join(THREAD_VARIABLES)} set "
                  f"({name or 'the BLAS'}'s default{', one thread per CPU' if name == 'openblas' else ''})")


def thread_counts(torch: bool = False) -> dict:
    """``{"blas", "blas_source", "torch", OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
    MKL_NUM_THREADS}``: NumPy's BLAS threads (:func:`blas_threads`),
    ``torch.get_num_threads()`` (PyTorch's own intra-op count; None unless
    ``torch`` is asked for or already imported, and when it is not installed)
    and the variables as set (None: unset)."""
    blas, source = blas_threads()
    own = None
    try:
        if torch or "torch" in sys.modules:
            import torch as _torch

            own = _torch.get_num_threads()
    except Exception:  # not installed: no peer to compare with
        own = None
    return {"blas": blas, "blas_source": source, "torch": own,
            **{var: os.environ.get(var) for var in THREAD_VARIABLES}}


def environment(device: str, **extra) -> dict:
    """The environment record (module docstring) plus ``extra``."""
    env = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "opgraph": package_version("opgraph"),
        "torch": package_version("torch"),
        "git_commit": git_commit(),
        "argv": sys.argv[1:],
        "threads": thread_counts(),
    }
    env.update({k: v for k, v in dev.versions().items() if v is not None})
    if device in dev.DEVICES:
        try:
            env["device_name"] = dev.device_name(device)
        except Exception:
            env["device_name"] = None
    if device == "cuda":
        env["nvidia_driver"] = nvidia_driver()
    env.update(extra)
    return env


__all__ = ["git_commit", "package_version", "nvidia_driver", "environment", "THREAD_VARIABLES", "numpy_blas",
           "numpy_library_dirs", "numpy_blas_entry", "blas_threads", "thread_counts"]


def missing_gpu_libraries(device: str) -> list[str]:
    """One line per GPU library opgraph would use on ``device`` but cannot
    import (the cuDNN frontend: every ``cudnn`` rule; nvmath-python: cuBLAS
    calls inside CUDA graphs). Without the frontend, ``auto`` still runs, on
    ``gemm`` / ``fft`` convolutions several times slower: a run must say so,
    not look like a cuDNN run. Empty on the CPU."""
    if device != "cuda":
        return []
    from opgraph.backends.cuda.cublas import capture_requirement
    from opgraph.backends.cuda.cudnn_rules import environment_reason

    return [f"{what}: {why}" for what, why in (("cudnn unavailable", environment_reason()),
                                               ("cuBLAS not capturable", capture_requirement()))
            if why is not None]

