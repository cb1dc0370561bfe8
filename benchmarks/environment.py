"""What every ``opgraph-bench`` result file records about where it ran.

Time stamp, device and its name, the NVIDIA driver, CUDA runtime and driver
API, cuDNN (backend and frontend), CuPy, NumPy, PyTorch (and its cuDNN when
the peer ran), Python, platform, CPU count, the git commit of the checkout
(``+dirty`` with uncommitted changes) and the command line; the caller adds
precision, layout, batch and protocol settings.

Nothing here imports PyTorch (its version comes from package metadata) and
nothing raises: an absent library or a failed query is ``None``.
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


__all__ = ["git_commit", "package_version", "nvidia_driver", "environment"]


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

