"""Forward-only timing of one compiled model (the first ``opgraph-bench``
mode, kept for scripts and the ONNX import tests).

:func:`time_forward` compiles ``model.forward_outputs`` (the output, and the
new running statistics of a model with training-form batch norm) with a
policy and times ``warmup`` + ``repeat`` calls of the whole forward pass (ms per mini-batch,
median and min; CUDA events on a GPU, ``time.perf_counter`` on the CPU).
The full convnet-benchmarks protocol (backward-data and backward-filter,
per layer, checked, with memory and the PyTorch peer) is
:func:`opgraph.benchmarks.driver.run_benchmark`.
"""

from __future__ import annotations

import time

import attrs

import opgraph as og
from opgraph.analysis import summarize, totals
from opgraph.backends import device as dev

from .models import Model
from .protocol import random_feeds
from .timer import Timing, time_calls


@attrs.frozen(kw_only=True)
class ForwardTiming(Timing):
    """The forward timing of one model (all times in ms per mini-batch);
    median / min / mean come from :class:`.timer.Timing`."""

    model: str
    spec_key: str
    batch: int
    batch_reason: str
    dtype: str
    device: str
    lowering: str
    warmup: int
    repeat: int
    flops: int
    params: int
    compile_s: float

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


def time_forward(model: Model, *, device: str = "cpu", warmup: int = 1,
                 repeat: int = 3, seed: int = 0, policy=None,
                 pipeline: str = "default", batch_reason: str = "") -> ForwardTiming:
    """Compile ``model`` for ``device`` with ``policy`` and ``pipeline`` (as
    ``opgraph.compile`` takes them; None and ``'default'``: its defaults) and
    time its forward pass; ``lowering`` in the result names the algorithms the
    compiled graph actually runs.

    Inputs and parameters are placed on the device before timing, so no
    host-device copy is timed (as in the seed).
    """
    t0 = time.perf_counter()
    run = og.compile(model.forward_outputs, device=device, policy=policy, pipeline=pipeline)
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
        (conv if st.op.family == "conv" else other).add(st.op.algorithm)
    if not conv and not other:
        return "unknown"
    if not conv or not other or conv == other:
        return ", ".join(sorted(conv | other))
    return f"conv: {', '.join(sorted(conv))}; other: {', '.join(sorted(other)) or '-'}"


__all__ = ["time_calls", "ForwardTiming", "time_forward", "lowering_summary"]
