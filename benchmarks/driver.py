"""The timing protocol of ``opgraph-bench``, and the environment it records.

Protocol (the seed's, ``torch7/imagenet_winners/benchmark.lua``, adapted to
one call at a time): random input and parameters on the device, ``warmup``
untimed calls, then ``repeat`` timed calls; each call is timed on its own, so
the median and the minimum over repeats can be reported (the seed divided
one loop of 10 by 10, which gives the mean). Units: milliseconds per
mini-batch. On the CPU the clock is ``time.perf_counter``; on a GPU, CUDA
events recorded around the call on the current stream (the device time of
the work, without Python start-up skew), synchronised before reading.

The seed ran 10 warm-ups and 10 steps on a GPU at batch 128 (VGG-A 64).
With the NumPy reference on a 2-core CPU (some 10-40 GFLOP/s) that protocol
takes several minutes per model (VGG-A: about 1 TFLOP per forward call), so
the CPU defaults are smaller (:data:`CPU_DEFAULT_BATCH`, :data:`CPU_WARMUP`,
:data:`CPU_REPEAT`); the CLI says which values it used and why.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import attrs
import numpy as np

import opgraph as og
from opgraph.backends import device as dev
from opgraph.analysis import summarize, totals

from .models import Model

#: Mini-batch used on the CPU when ``--batch`` is not given (see module doc).
CPU_DEFAULT_BATCH = 8
#: Warm-up calls and timed calls on the CPU, and on a GPU (the seed's 10/10).
CPU_WARMUP, CPU_REPEAT = 1, 3
GPU_WARMUP, GPU_REPEAT = 10, 10


def cuda_status() -> tuple[bool, str]:
    """Whether CuPy sees a CUDA GPU, and a sentence saying what it sees
    (``opgraph.backends.device.cuda_status``; never raises)."""
    return dev.cuda_status()


def resolve_device(requested: str) -> tuple[str, str]:
    """Map ``'auto' | 'cpu' | 'cuda'`` to a device and the reason for it.

    Raises:
        DeviceUnavailableError: ``'cuda'`` was asked for but no GPU is usable
            (the message says how to install CuPy).
        ValueError: an unknown device name.
    """
    resolved = dev.resolve_device(requested)
    return str(resolved), resolved.reason


def default_batch(model_seed_batch: int, device: str, batch: int | None) -> tuple[int, str]:
    """The batch a timing run uses, and why.

    ``batch`` (from ``--batch``) wins; otherwise the seed's batch on a GPU and
    :data:`CPU_DEFAULT_BATCH` on the CPU.
    """
    if batch is not None:
        return batch, "set with --batch"
    if device == "cpu":
        return CPU_DEFAULT_BATCH, (
            "CPU default: the seed's batches (128; VGG-A 64) are sized for a GPU; "
            f"{CPU_DEFAULT_BATCH} keeps a run of the four models within a few minutes on a "
            f"2-core CPU (use --batch N to change it)")
    return model_seed_batch, "the seed benchmark's batch"


def protocol_defaults(device: str, warmup: int | None, repeat: int | None) -> tuple[int, int]:
    """Warm-up and repeat counts: given values, else the device's defaults."""
    w, r = (CPU_WARMUP, CPU_REPEAT) if device == "cpu" else (GPU_WARMUP, GPU_REPEAT)
    return (w if warmup is None else warmup), (r if repeat is None else repeat)


def random_feeds(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Random host arrays for the model's input and every parameter, by name.

    The input is standard normal (the seed's ``torch.randn``); weights are
    He-normal (std ``sqrt(2 / fan_in)``, He et al. 2015) so activations keep
    unit scale through the depth of VGG, biases are zero. Deterministic in
    ``seed``.
    """
    rng = np.random.default_rng(seed)
    dtype = np.dtype(model.dtype)

    def normal(shape, std=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(dtype, copy=False)

    feeds = {model.input.name: normal(model.input.type.shape)}
    for p in model.params:
        shape = p.type.shape
        if len(shape) == 1:
            feeds[p.name] = np.zeros(shape, dtype)
        else:
            fan_in = math.prod(shape[1:])
            feeds[p.name] = normal(shape, math.sqrt(2.0 / max(fan_in, 1)))
    return feeds


def time_calls(fn: Callable[[], object], *, warmup: int, repeat: int,
               device: str = "cpu") -> list[float]:
    """Milliseconds of each of ``repeat`` calls of ``fn`` after ``warmup`` calls.

    On ``'cuda'`` the time is read from CUDA events around each call (after
    synchronising); on the CPU from ``time.perf_counter``.

    Raises:
        ValueError: ``warmup < 0`` or ``repeat < 1``.
    """
    if warmup < 0:
        raise ValueError(f"warmup={warmup}: must be >= 0")
    if repeat < 1:
        raise ValueError(f"repeat={repeat}: must be >= 1")
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        for _ in range(repeat):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(float(cupy.cuda.get_elapsed_time(start, end)))
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


@attrs.frozen
class ForwardTiming:
    """The forward timing of one model (all times in ms per mini-batch)."""

    model: str
    spec_key: str
    batch: int
    batch_reason: str
    dtype: str
    device: str
    lowering: str
    warmup: int
    repeat: int
    times_ms: tuple[float, ...]
    flops: int
    params: int
    compile_s: float

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.times_ms)

    @property
    def gflops_per_s(self) -> float:
        """Forward FLOP rate at the median time, in GFLOP/s."""
        return self.flops / (self.median_ms * 1e6) if self.median_ms > 0 else float("nan")

    def as_dict(self) -> dict:
        d = attrs.asdict(self)
        d["times_ms"] = list(self.times_ms)
        d.update(median_ms=self.median_ms, min_ms=self.min_ms, mean_ms=self.mean_ms,
                 gflop=self.flops / 1e9, gflops_per_s=self.gflops_per_s)
        return d


def time_forward(model: Model, *, device: str = "cpu", warmup: int = CPU_WARMUP,
                 repeat: int = CPU_REPEAT, seed: int = 0, policy=None,
                 pipeline: str = "default", batch_reason: str = "") -> ForwardTiming:
    """Compile ``model`` for ``device`` with ``policy`` and ``pipeline`` (as
    ``opgraph.compile`` takes them; None and ``'default'``: its defaults) and
    time its forward pass; ``lowering`` in the result names the algorithms the
    compiled graph actually runs.

    Inputs and parameters are placed on the device before timing, so no
    host-device copy is timed (as in the seed).
    """
    t0 = time.perf_counter()
    run = og.compile([model.output], device=device, policy=policy, pipeline=pipeline)
    compile_s = time.perf_counter() - t0
    feeds = random_feeds(model, seed)
    feeds = {k: dev.to_device(v, device) for k, v in feeds.items()}
    times = time_calls(lambda: run(**feeds), warmup=warmup, repeat=repeat, device=device)
    rows = summarize(model.graph, [model.output])
    tot = totals(rows, model.graph, [model.output])
    return ForwardTiming(
        model=model.key, spec_key=model.spec_key, batch=model.batch, batch_reason=batch_reason,
        dtype=model.dtype, device=device, lowering=lowering_summary(run), warmup=warmup,
        repeat=repeat, times_ms=tuple(times), flops=tot.flops, params=tot.params,
        compile_s=compile_s)


def lowering_summary(run) -> str:
    """The algorithms an ``Executable`` runs, e.g. ``'reference'`` or
    ``'conv: gemm; other: reference'`` (convolutions listed apart because
    that is where the lowerings differ)."""
    conv, other = set(), set()
    for st in getattr(run, "steps", ()):
        (conv if "Conv2d" in st.op.op.name else other).add(st.op.algorithm)
    if not conv and not other:
        return "unknown"
    if not conv or not other or conv == other:
        return ", ".join(sorted(conv | other))
    return f"conv: {', '.join(sorted(conv))}; other: {', '.join(sorted(other)) or '-'}"


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


def environment(device: str, **extra) -> dict:
    """What every result file records: time stamp, device, library versions,
    Python, platform, CPU count, git commit, plus ``extra`` (batch, dtype...)."""
    env = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "opgraph": _version("opgraph"),
        "git_commit": git_commit(),
        "argv": sys.argv[1:],
    }
    env.update({k: v for k, v in dev.versions().items() if v is not None})
    if device in dev.DEVICES:
        env["device_name"] = dev.device_name(device)
    env.update(extra)
    return env


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


__all__ = ["CPU_DEFAULT_BATCH", "CPU_WARMUP", "CPU_REPEAT", "GPU_WARMUP", "GPU_REPEAT",
           "cuda_status", "resolve_device", "default_batch", "protocol_defaults",
           "random_feeds", "time_calls", "ForwardTiming", "time_forward", "lowering_summary", "git_commit",
           "environment"]
