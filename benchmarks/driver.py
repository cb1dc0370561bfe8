"""``opgraph-bench``'s driver: every model x precision x lowering, checked, timed, measured.

For each model (:func:`run_benchmark`):

1. the training graph (:func:`protocol.training_graph`: output passed back
   as its own gradient, parameters only) and random feeds placed on the
   device (input standard normal, He-normal weights, zero biases);
2. the float64 reference, computed once and reused by every column
   (:class:`check.Reference`);
3. for each precision and each lowering (:mod:`.lowerings`): compile with
   the lowering's policy; a lowering that applies to no convolution of the
   model is reported ``n/a`` with the reason and not run; otherwise each
   step it decides is checked against the reference (``mismatch``: reported,
   not timed); one real run measures memory (:mod:`.memory`); then the
   seed's protocol (:mod:`.protocol`): warm-up, forward / backward-data /
   backward-filter in separate loops, and each conv/linear layer's steps of
   each phase alone; with ``cuda_graph``, a second record ``<lowering>+graph``
   from the same compiled graph: each phase replayed as CUDA graphs
   (:meth:`protocol.PhaseRunner.time_graphed_phases`);
4. the PyTorch peer(s) on the same model and feeds (:mod:`.peer_torch`).

A failure of one column (a kernel raising, out of memory) is recorded as
``status: error`` with its message and the run goes on. Throughput counts a
multiply-add as 2 FLOPs; backward-data and backward-filter of a layer each
count its forward FLOPs; the fraction of peak divides by the matrix-multiply
peak of the same precision measured once in this run (:mod:`.peak`).

CPU defaults: the seed's batches (128; VGG-A 64) and 10 + 10 calls are
sized for a GPU; on a 2-core CPU the defaults are batch
:data:`CPU_DEFAULT_BATCH`, :data:`CPU_WARMUP` + :data:`CPU_REPEAT` calls and
the lowerings :data:`lowerings.CPU_DEFAULT`, so that ``opgraph-bench`` with
no arguments finishes in a few minutes (the output says so).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import attrs

import opgraph as og
from opgraph.backends import device as dev
from opgraph.passes.policy import LoweringPolicy
from opgraph.types import HALF_DTYPES

from . import check as chk
from . import lowerings as lw
from .environment import environment, git_commit  # noqa: F401  (re-exported)
from .forward import ForwardTiming, lowering_summary, time_calls, time_forward  # noqa: F401
from .memory import memory_record, run_and_measure
from .models import LAYERS, Model
from .peak import measure_peaks
from .protocol import (PHASES, PhaseRunner, TrainingGraph, main_step, random_feeds, schedule,
                       training_graph)
from .timer import Timer, make_timer

#: Mini-batch used on the CPU when ``--batch`` is not given (see module doc).
CPU_DEFAULT_BATCH = 8
#: Warm-up calls and timed calls on the CPU, and on a GPU (the seed's 10/10).
CPU_WARMUP, CPU_REPEAT = 1, 3
GPU_WARMUP, GPU_REPEAT = 10, 10
CPU_DEFAULT_NOTE = (f"CPU default lowerings: {', '.join(lw.CPU_DEFAULT)} only (on 2 cores FFT runs "
                    "10-30x slower than GEMM and autotuning times every candidate of every node, so "
                    "all lowerings plus auto would take far more than a few minutes); "
                    "ask for others with --lowering")
SCHEMA_VERSION = 1


def cuda_status() -> tuple[bool, str]:
    """Whether CuPy sees a CUDA GPU, and a sentence saying what it sees."""
    return dev.cuda_status()


def resolve_device(requested: str) -> tuple[str, str]:
    """Map ``'auto' | 'cpu' | 'cuda'`` to a device and the reason for it.

    Raises:
        DeviceUnavailableError: ``'cuda'`` asked for, no usable GPU.
        ValueError: an unknown device name.
    """
    resolved = dev.resolve_device(requested)
    return str(resolved), resolved.reason


def default_batch(model_seed_batch: int, device: str, batch: int | None) -> tuple[int, str]:
    """The batch a timing run uses, and why: ``batch`` if given, else the
    seed's on a GPU and :data:`CPU_DEFAULT_BATCH` on the CPU."""
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


@attrs.frozen
class Settings:
    """Everything a benchmark run needs besides the models."""

    device: str
    lowerings: tuple = attrs.field(converter=tuple)
    precisions: tuple = attrs.field(default=("fp32",), converter=tuple)
    layout: str = "NCHW"
    warmup: int = CPU_WARMUP
    repeat: int = CPU_REPEAT
    per_layer: bool = True
    check: bool = True
    compare: tuple = attrs.field(default=(), converter=tuple)
    base_policy: LoweringPolicy = attrs.field(factory=LoweringPolicy)
    seed: int = 0
    time_limit: float | None = None
    cuda_graph: bool = False

    @property
    def applied_layout(self) -> str:
        """The layout the columns compute in: ``layout``, except that NHWC
        applies on cuda only (passes/layout.py keeps NCHW elsewhere, as the CPU
        kernels are written for it), so a CPU run is ``'NCHW'`` whatever was asked."""
        return "NHWC" if self.layout == "NHWC" and self.device == "cuda" else "NCHW"

    def protocol(self, clock: str) -> dict:
        return {"warmup": self.warmup, "repeat": self.repeat, "clock": clock,
                "grad_output": "the model output itself (no loss)",
                "wrt": "parameters only, so a first convolution reading the image has no "
                       "backward-data (L1-L5: the image too, as the layer-wise benchmark)",
                "phases": list(PHASES), "per_layer": self.per_layer, "check": self.check,
                "cuda_graph": self.cuda_graph,
                "statistics": "median and min over the repeat calls of each loop; mean = the seed's",
                "source": "convnet-benchmarks torch7/imagenet_winners/benchmark.lua"}


def _release(device: str) -> None:
    """Give a finished column's device memory back: collect the cycles that
    may still hold arrays (compiled graphs, CUDA-graph replays), then the
    pool's cached blocks. (The GoogLeNet bf16 ``fft`` column ran out of memory
    on 2026-11-30 after eighteen CUDA-graph columns, with 37.6 GB in the default
    pool of the 139 GB device: something held the rest.)"""
    if device == "cuda":
        import gc

        import cupy

        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()


def _record(model: Model, precision: str, s: Settings, lowering: str, kind: str) -> dict:
    # ``layout`` is what ran (merging keys on it); the request stays visible beside it
    return {"model": model.key, "batch": model.batch, "dtype": model.dtype, "precision": precision,
            "layout": s.applied_layout, "layout_requested": s.layout, "device": s.device,
            "lowering": lowering, "kind": kind,
            "status": "ok", "reason": None, "notes": []}


def _totals(times: dict) -> dict:
    med = {p: (t["median_ms"] if t else None) for p, t in times.items()}
    mins = {p: (t["min_ms"] if t else None) for p, t in times.items()}
    back = [p for p in times if p != "forward"]
    bwd = sum(med[p] or 0.0 for p in back)
    bwd_min = sum(mins[p] or 0.0 for p in back)
    return {"forward_ms": med["forward"], "backward_ms": bwd, "total_ms": med["forward"] + bwd,
            "total_min_ms": mins["forward"] + bwd_min}


def _throughput(rec: dict, peak: dict | None) -> None:
    """Fill ``tflops`` (per phase, backward and total, at the median times) and
    ``peak_fraction`` (total TFLOP/s over the measured matmul peak) of a timed record."""
    tot, times = rec["totals"], rec["times"]
    ms = {"forward": tot["forward_ms"], "backward": tot["backward_ms"], "total": tot["total_ms"]}
    for p in ("backward_data", "backward_filter"):
        if times.get(p):
            ms[p] = times[p]["median_ms"]
    rec["tflops"] = {p: (f / (ms[p] * 1e9) if ms.get(p) else None) for p, f in rec["flops"].items()}
    top = (peak or {}).get("tflops")
    total = rec["tflops"].get("total")
    rec["peak_fraction"] = total / top if top and total else None


def model_flops(tg) -> dict:
    """FLOPs of one iteration per phase, plus ``backward`` and ``total``: the
    conv/linear layers' forward FLOPs, counted again for backward-filter (every
    layer) and backward-data (every layer but those reading the image)."""
    fwd = sum(tg.layer_flops.values())
    data = sum(tg.layer_flops[k] for k in tg.data_grad_layers)
    return {"forward": fwd, "backward_data": data, "backward_filter": fwd,
            "backward": data + fwd, "total": 2 * fwd + data}


def _layer_records(tg, sched, layer_times: dict, na: dict, report) -> list[dict]:
    nodes = getattr(report, "nodes", {}) or {}
    rows = []
    for layer, by_phase in sched.layers.items():
        f = tg.layer_flops[layer]
        row = {"layer": layer, "op": tg.layers[layer], "flops": f, "algorithm": {}, "ms": {},
               "min_ms": {}, "tflops": {}, "workspace_bytes": {}, "not_applicable": {},
               "fused_relu": False}
        for p, steps in by_phase.items():
            main = main_step(steps)
            if main is not None:
                row["algorithm"][p] = main.op.algorithm
                row["fused_relu"] |= main.op.op.name == "Conv2dBiasRelu"
                rec = nodes.get(main.name)
                row["workspace_bytes"][p] = int(rec.workspace) if rec is not None else 0
                if main.name in na:
                    row["not_applicable"][p] = na[main.name]
            t = layer_times.get(layer, {}).get(p)
            if t is not None:
                row["ms"][p], row["min_ms"][p] = t.median_ms, t.min_ms
                row["tflops"][p] = f / (t.median_ms * 1e9) if t.median_ms > 0 else None
        rows.append(row)
    return rows


def run_lowering(tg, feeds: dict, ref, lowering: lw.Lowering, base: LoweringPolicy, s: Settings,
                 timer: Timer, peak: dict | None) -> list[dict]:
    """The column(s) of one lowering for one model and precision (see the
    module docstring): its record, then, with ``s.cuda_graph``, the record of
    its CUDA-graph replay."""
    model = tg.model
    rec = _record(model, base.precision, s, lowering.name, "opgraph")
    out = [rec]
    policy = lowering.policy(base, s.device)
    app = lw.applicability(tg, lowering, s.device, policy)
    if app and all(why is not None for why in app.values()):
        reasons = sorted(set(app.values()))
        rec.update(status="n/a", reason=f"{lowering.name} applies to no convolution of {model.key}: "
                   + "; ".join(reasons[:3]) + (" ..." if len(reasons) > 3 else ""))
        return out
    exe = runner = None
    try:
        t0 = time.perf_counter()
        exe = og.compile(tg.outputs, device=s.device, policy=policy)
        rec["compile_s"] = time.perf_counter() - t0
        sched = schedule(exe, tg)
        na = lw.not_applicable(exe, lowering)
        rec["algorithms"] = lw.algorithm_counts(exe)
        rec["precision_applied"] = lw.precision_applied(exe)
        rec["not_applicable"] = na
        if base.precision != "fp32" and base.precision not in rec["precision_applied"]:
            computed = "float32" if model.dtype in HALF_DTYPES else model.dtype
            storage = f" from {model.dtype} storage" if computed != model.dtype else ""
            rec["notes"].append(f"precision {base.precision} requested, but no kernel of this lowering "
                                f"takes a precision option: it computed in {computed}{storage}")
        if s.layout != "NCHW":
            rec["notes"] += [n for n in exe.report.notes if n.startswith("layout:")]
        if ref is not None:
            result = chk.check_lowering(exe, ref)
        outputs, measured = run_and_measure(exe, feeds, s.device)
        rec["memory"] = memory_record(exe.report, measured, s.device)
        if ref is not None:
            result.end_to_end = chk.end_to_end(ref.xp, outputs, ref)
            result.passed = result.passed and result.end_to_end["finite"]
            rec["check"] = result.as_dict()
        del outputs
        if ref is not None and not result.passed:
            bad = result.failures[:3] or [{"node": "end to end", "rel_error": None,
                                           "tolerance": None}]
            rec.update(status="mismatch", reason="not timed: " + "; ".join(
                f"{f['node']}: " + (f.get("dtype") or f"relative error {f['rel_error']} > {f['tolerance']}")
                for f in bad))
            return out
        runner = PhaseRunner(sched, exe.feed(feeds), timer)
        runner.warmup(s.warmup)
        phases = runner.time_phases(s.repeat)
        layer_times = runner.time_layers(s.repeat) if s.per_layer else {}
        rec["times"] = {p: (t.as_dict() if t else None) for p, t in phases.items()}
        rec["totals"] = _totals(rec["times"])
        rec["flops"] = model_flops(tg)
        _throughput(rec, peak)
        rec["layers"] = _layer_records(tg, sched, layer_times, na, exe.report)
        if s.per_layer:
            rec["other_ms"] = {p: ((rec["times"][p] or {}).get("median_ms") or 0.0)
                               - sum(r["ms"].get(p, 0.0) for r in rec["layers"]) for p in PHASES}
        if s.cuda_graph:
            out.append(_graph_column(rec, runner, tg, sched, na, exe, ref, feeds, s, peak))
    except Exception as e:  # one column's failure (kernel error, OOM) must not end the run
        rec.update(status="error", reason=f"{type(e).__name__}: {e}")
    finally:
        exe = runner = None  # every array of the column (and a replay's pools) is freed here
        _release(s.device)
    return out


#: A replay's end-to-end error may exceed its eager column's by this factor or by
#: :data:`GRAPH_CHECK_SLACK`, whichever is larger (cuDNN weight-gradient engines sum
#: in a nondeterministic order); reading a stale or wrong array gives errors near 1.
GRAPH_CHECK_FACTOR, GRAPH_CHECK_SLACK = 2.0, 1e-3
#: Largest relative difference between the replay and the eager executor on a new
#: input (the same kernels on the same values; nondeterministic sums only): by the
#: storage dtype, as a nondeterministic sum stored in bf16/fp16 differs by its
#: rounding (up to 2^-8 relative in bf16; AlexNet bf16 storage measured 2.0e-3 on
#: the H200), while a stale array differs by ~1.
GRAPH_FOLLOW_TOL = {"bfloat16": 1e-2, "float16": 1e-2}
GRAPH_FOLLOW_TOL_DEFAULT = 1e-3


def graph_follow_tolerance(dtype: str) -> float:
    """:data:`GRAPH_FOLLOW_TOL` of a storage dtype name (1e-3 for float32/64)."""
    return GRAPH_FOLLOW_TOL.get(dtype, GRAPH_FOLLOW_TOL_DEFAULT)


def _graph_check(eager_e2e: dict, graph_e2e: dict) -> tuple[bool, str | None]:
    """Whether a replay's end-to-end errors (:func:`check.end_to_end`) match
    its eager column's, and why not."""
    if not graph_e2e["finite"]:
        return False, f"non-finite values in {', '.join(graph_e2e['non_finite'][:3])}"
    for key in ("output", "max_grad"):
        e, g = eager_e2e.get(key), graph_e2e.get(key)
        if e is None or g is None:
            continue
        bound = max(GRAPH_CHECK_FACTOR * e, e + GRAPH_CHECK_SLACK)
        if g > bound:
            return False, f"{key} relative error {g:.3g} > {bound:.3g} (eager column: {e:.3g})"
    return True, None


def _graph_follows(runner: PhaseRunner, exe, tg, feeds: dict, s: Settings) -> tuple[float, str | None]:
    """Write a new image (the negated one) into the input array the graphs captured, replay every
    phase, and compare each output with the eager executor on that image:
    ``(largest relative difference, why it fails or None)``. A replay that
    reads a stale array passes :func:`_graph_check` (same values as the build)
    but not this. The original image is written back afterwards."""
    name = tg.model.input.name
    node = next(src.id for src in exe.sources if src.name == name)
    x = runner.slots[node]
    xp = dev.array_module(s.device)
    # Every access to x on the replays' stream: it is non-blocking, so it does not wait for
    # work on the default stream; a copy enqueued there raced the write below on the H200
    # (docs/gpu.md, 2026-11-30 third session: NaN and stale-looking replays).
    with runner.graph_stream:
        old = x.copy()
        new = -old  # a different image whatever the seed (the network is not even in its input)
    try:
        with runner.graph_stream:
            x[...] = new
        runner.replay_all()  # ends with a synchronisation: new is complete for the eager run
        replayed = [runner.slots[v.node] for v in exe.outputs]
        eager = exe(**{**feeds, name: new})
        worst = max(chk.relative_error(xp, g, e) for g, e in zip(replayed, eager))
    finally:
        with runner.graph_stream:
            x[...] = old
        runner.graph_stream.synchronize()
    tol = graph_follow_tolerance(tg.model.dtype)
    if not worst <= tol:  # NaN fails too
        return worst, (f"on a new input the replay differs from the eager executor by {worst:.3g} "
                       f"(> {tol:g}): a graph reads a stale array")
    return worst, None


def _graph_column(rec: dict, runner: PhaseRunner, tg, sched, na: dict, exe, ref, feeds: dict,
                  s: Settings, peak: dict | None) -> dict:
    """The ``<lowering>+graph`` record: ``rec``'s compiled graph, each phase
    replayed as CUDA graphs; per-layer times stay with the eager record. Two
    checks (the per-node check of the eager column holds: the same kernels
    run): the replayed outputs end to end against the float64 reference
    (:func:`_graph_check`, catches unwritten or corrupted arrays) and the
    replay on a new input against the eager executor (:func:`_graph_follows`,
    catches a graph reading an array that is not the current one)."""
    g = _graph_record(rec, "check")
    try:
        phases, summary = runner.time_graphed_phases(s.repeat, s.warmup)
        g["graph"] = summary
        if ref is not None:
            e2e = chk.end_to_end(ref.xp, [runner.slots[v.node] for v in exe.outputs], ref)
            passed, why = _graph_check(rec["check"]["end_to_end"], e2e)
            follow, why_follow = _graph_follows(runner, exe, tg, feeds, s)
            g["check"] = {"end_to_end": e2e, "new_input_max_diff": follow,
                          "passed": passed and why_follow is None,
                          "how": "replayed outputs end to end against the float64 reference, within "
                                 f"{GRAPH_CHECK_FACTOR:g}x (or +{GRAPH_CHECK_SLACK:g}) of the eager "
                                 f"column's errors; and on a new input within "
                                 f"{graph_follow_tolerance(tg.model.dtype):g} "
                                 "of the eager executor"}
            if not g["check"]["passed"]:
                g.update(status="mismatch", reason=f"CUDA-graph replay: {why or why_follow}")
                return g
        g["times"] = {p: (t.as_dict() if t else None) for p, t in phases.items()}
        g["totals"] = _totals(g["times"])
        g["flops"] = model_flops(tg)
        _throughput(g, peak)
        g["layers"] = _layer_records(tg, sched, {}, na, exe.report)
    except Exception as e:  # the eager record stands; say why the replay did not
        g.update(status="error", reason=f"CUDA-graph replay failed: {type(e).__name__}: {e}")
        for k in _TIMING_KEYS:
            g.pop(k, None)
        return g
    finally:
        runner.close_replays()
    steps = sum(v["steps"] for v in summary.values())
    captured = sum(v["captured_steps"] for v in summary.values())
    graphs = sum(v["graphs"] for v in summary.values())
    g["notes"].append(f"CUDA graphs: {captured} of {steps} steps captured in {graphs} graphs; "
                      f"{steps - captured} run eagerly between them")
    return g


#: Keys of an eager record that describe its own timing, not the compiled graph.
_TIMING_KEYS = ("times", "totals", "tflops", "peak_fraction", "layers", "other_ms")


def _graph_record(rec: dict, *drop: str) -> dict:
    """The ``<lowering>+graph`` record's start: ``rec`` without its timing (and ``drop``)."""
    g = {k: v for k, v in rec.items() if k not in _TIMING_KEYS + drop}
    g.update(lowering=rec["lowering"] + "+graph", notes=list(rec["notes"]))
    return g


def _graph_placeholder(rec: dict) -> dict:
    """The ``+graph`` record of a lowering whose eager column did not time
    (n/a, mismatch, error, skipped): not replayed, and why."""
    g = _graph_record(rec)
    status = rec["status"] if rec["status"] in ("n/a", "skipped") else "skipped"
    g.update(status=status,
             reason=f"not replayed: the eager column is {rec['status']}"
                    + (f" ({rec['reason']})" if rec.get("reason") else ""))
    return g


def run_peer_entry(tg, feeds: dict, ref, peer: str, precision: str, s: Settings,
                   peak: dict | None) -> dict:
    """The PyTorch peer's record for one model and precision."""
    from .peer_torch import PeerError, run_peer

    rec = _record(tg.model, precision, s, peer, peer)
    try:
        # the layout opgraph applied, so that the ratios compare like with like
        out = run_peer(tg.model, feeds, device=s.device, precision=precision, layout=s.applied_layout,
                       warmup=s.warmup, repeat=s.repeat, compiled=peer == "torch-compile",
                       reference=ref, input_grad=tg.input_grad is not None)
    except PeerError as e:
        rec.update(status="unavailable", reason=str(e))
        return rec
    except Exception as e:
        rec.update(status="error", reason=f"{type(e).__name__}: {e}")
        return rec
    finally:
        _release(s.device)
    times = out["times"]
    rec["times"] = {"forward": times["forward"], "backward": times["backward"],
                    "backward_data": None, "backward_filter": None}
    fwd, bwd = times["forward"]["median_ms"], times["backward"]["median_ms"]
    rec["totals"] = {"forward_ms": fwd, "backward_ms": bwd, "total_ms": fwd + bwd,
                     "total_min_ms": times["forward"]["min_ms"] + times["backward"]["min_ms"]}
    rec["flops"] = {k: v for k, v in model_flops(tg).items() if k in ("forward", "backward", "total")}
    _throughput(rec, peak)
    rec["first_call_s"] = out["first_call_s"]
    rec["memory"] = out["memory"]
    rec["versions"] = out["versions"]
    rec["notes"].append("PyTorch autograd computes input and weight gradients in one backward "
                        "pass: backward-data / backward-filter split n/a")
    if out["check"] is not None:
        rec["check"] = {"end_to_end": out["check"], "passed": out["check"]["finite"]}
    return rec


def add_ratios(results: list[dict]) -> None:
    """``vs_torch`` / ``vs_torch_compile`` on every timed opgraph record: its
    forward, backward and total median over the peer's (same model, precision)."""
    peers = {(r["model"], r["precision"], r["kind"]): r for r in results
             if r["kind"] != "opgraph" and r["status"] == "ok"}
    for r in results:
        if r["kind"] != "opgraph" or r["status"] != "ok":
            continue
        for kind in ("torch", "torch-compile"):
            p = peers.get((r["model"], r["precision"], kind))
            if p is None:
                continue
            r["vs_" + kind.replace("-", "_")] = {
                k: r["totals"][k + "_ms"] / p["totals"][k + "_ms"] if p["totals"][k + "_ms"] else None
                for k in ("forward", "backward", "total")}


def unit_count(models: Sequence, s: Settings) -> int:
    """Columns the run will produce (for a progress bar): with ``cuda_graph``,
    two per lowering."""
    per_lowering = 2 if s.cuda_graph else 1
    return len(models) * len(s.precisions) * (per_lowering * len(s.lowerings) + len(s.compare))


def run_benchmark(models: Sequence[Model | TrainingGraph], s: Settings, *, timer: Timer | None = None,
                  progress: Callable[[str], None] | None = None,
                  on_result: Callable[[dict], None] | None = None, notes: Sequence[str] = ()) -> dict:
    """Run the whole benchmark; returns the result document (see ``report.py``).

    ``models`` are models or their training graphs (:func:`protocol.training_graph`;
    a model gets one, with the image's gradient for the layer suite L1-L5).
    ``progress(description)`` is called before each column, ``on_result(doc)``
    after each (the CLI writes the JSON file incrementally, so a run killed
    by a time limit still leaves its finished columns).
    """
    tgs = [m if isinstance(m, TrainingGraph) else training_graph(m, input_grad=m.spec_key in LAYERS)
           for m in models]
    models = [tg.model for tg in tgs]
    timer = timer or make_timer(s.device)
    start = time.perf_counter()
    peak = measure_peaks(s.device, s.precisions)
    # the policy as the columns run it: the layout asked for, and the precision when there is one
    policy = attrs.evolve(s.base_policy, layout=s.layout,
                          **({"precision": s.precisions[0]} if len(s.precisions) == 1 else {}))
    env = environment(s.device, precision=list(s.precisions), layout=s.applied_layout,
                      layout_requested=s.layout, dtype=sorted({m.dtype for m in models}),
                      batch={m.key: m.batch for m in models}, warmup=s.warmup, repeat=s.repeat,
                      lowerings=[lo.name for lo in s.lowerings], compare=list(s.compare),
                      seed=s.seed, policy=policy.to_dict())
    doc = {"tool": "opgraph-bench", "mode": "benchmark", "schema_version": SCHEMA_VERSION,
           "environment": env, "protocol": s.protocol(timer.clock), "peak": peak,
           "lowerings": {lo.name: lo.describe() for lo in s.lowerings},
           "notes": list(notes), "models": [], "results": []}
    if s.cuda_graph:
        doc["lowerings"].update({lo.name + "+graph": lo.describe() + "; each phase replayed as CUDA "
                                 "graphs (steps that cannot be captured run eagerly between them)"
                                 for lo in s.lowerings})
    for tg in tgs:
        model = tg.model
        feeds = {k: dev.to_device(v, s.device) for k, v in random_feeds(model, s.seed).items()}
        entry = {"model": model.key, "title": model.title, "spec_key": model.spec_key,
                 "batch": model.batch, "dtype": model.dtype, "params": model.param_count,
                 "layers": dict(tg.layers), "layer_flops": dict(tg.layer_flops)}
        doc["models"].append(entry)
        ref, ref_error = None, None
        out_of_time = s.time_limit is not None and time.perf_counter() - start > s.time_limit
        if s.check and not out_of_time:
            if progress:
                progress(f"{model.key}: float64 reference")
            try:
                ref = chk.Reference(tg, feeds, s.device)
                entry["reference_s"] = ref.seconds
            except Exception as e:  # e.g. out of memory: no column of this model can be checked
                ref_error = f"float64 reference failed, so nothing was timed: {type(e).__name__}: {e}"
                _release(s.device)
        for precision in s.precisions:
            base = attrs.evolve(s.base_policy, precision=precision, layout=s.layout)
            # the peer first: cheap, and the reference every column is compared with, so a
            # --time-limit that cuts the run short still leaves the ratios of what ran
            units = [(p, None) for p in s.compare] + [(lo.name, lo) for lo in s.lowerings]
            for name, lowering in units:
                if progress:
                    progress(f"{model.key} {precision} {name}")
                if s.time_limit is not None and time.perf_counter() - start > s.time_limit:
                    rec = _record(model, precision, s, name, "opgraph" if lowering else name)
                    rec.update(status="skipped", reason=f"--time-limit {s.time_limit:g} s reached")
                elif ref_error is not None:
                    rec = _record(model, precision, s, name, "opgraph" if lowering else name)
                    rec.update(status="error", reason=ref_error)
                elif lowering is not None:
                    rec = run_lowering(tg, feeds, ref, lowering, base, s, timer, peak.get(precision))
                else:
                    rec = run_peer_entry(tg, feeds, ref, name, precision, s, peak.get(precision))
                recs = rec if isinstance(rec, list) else [rec]
                if s.cuda_graph and lowering is not None and len(recs) == 1:
                    recs.append(_graph_placeholder(recs[0]))
                doc["results"] += recs
                add_ratios(doc["results"])
                if on_result:
                    on_result(doc)
        del ref, feeds
        _release(s.device)
    doc["elapsed_s"] = time.perf_counter() - start
    return doc


__all__ = ["CPU_DEFAULT_BATCH", "CPU_WARMUP", "CPU_REPEAT", "GPU_WARMUP", "GPU_REPEAT",
           "CPU_DEFAULT_NOTE", "Settings", "cuda_status", "resolve_device", "default_batch",
           "protocol_defaults", "random_feeds", "model_flops", "run_lowering", "run_peer_entry",
           "add_ratios", "unit_count", "run_benchmark", "time_calls", "ForwardTiming",
           "time_forward", "lowering_summary", "environment", "git_commit"]
