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
   backward-filter in separate loops, the whole step in one loop
   (:mod:`.whole_step`), and each conv/linear layer's steps of each phase
   alone; with ``cuda_graph`` (every lowering, or those named; the default GPU
   run: ``auto``), a second record ``<lowering>+graph`` from the
   same compiled graph: each phase replayed as CUDA graphs
   (:meth:`protocol.PhaseRunner.time_graphed_phases`), and the phases' graphs
   back to back as the whole step;
4. the PyTorch peers on the same model and feeds (:mod:`.peer_run`), first,
   and the ratios of every column to them (:mod:`.peer_column`).

A failure of one column (a kernel raising, out of memory) is recorded as
``status: error`` with its exception's type, message and innermost frames
(``records.error_record``) and the run goes on. Every timed column gets its
spread and an ``unstable`` flag (:mod:`.stability`). Throughput counts a
multiply-add as 2 FLOPs; backward-data and backward-filter of a layer each
count its forward FLOPs; the fraction of peak divides by the matrix-multiply
peak of the same precision measured once in this run (:mod:`.peak`).

CPU defaults: the seed's batches (128; VGG-A 64; the modern suite's 128,
DenseNet-121 64) and 10 + 10 calls are sized for a GPU; on a 2-core CPU the defaults are batch
:data:`CPU_DEFAULT_BATCH`, :data:`CPU_WARMUP` + :data:`CPU_REPEAT` calls and
the lowerings :data:`lowerings.CPU_DEFAULT`, so that ``opgraph-bench`` with
no arguments finishes in a few minutes (:data:`CPU_RUN_TIME`; the output says so).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable, Mapping, Sequence

import attrs

import opgraph as og
from opgraph.backends import device as dev
from opgraph.passes.policy import LoweringPolicy

from . import check as chk
from . import lowerings as lw
from . import report, stability
from .environment import environment, git_commit, thread_counts  # noqa: F401  (re-exported)
from .forward import ForwardTiming, lowering_summary, time_calls, time_forward  # noqa: F401
from .graph_column import (changed_choices, graph_column, graph_failed, graph_placeholder, recompile_note,
                           replay_policy)
from .memory import memory_record, run_and_measure
from .models import LAYERS, Model
from .peak import measure_peaks
from .peer_column import add_ratios, peer_records, threads_note
from .protocol import (PHASES, PhaseRunner, TrainingGraph, applied_layout, random_feeds, schedule,  # noqa: F401
                       training_graph)
from .records import (error_fields, fill_throughput, forced_nodes, layer_records, model_flops, new_record,
                      phase_totals, release_device, warnings_noted)
from .tables import cache_note
from .timer import AUTO_ROUND, AdaptiveTimer, Timer, make_timer
from .whole_step import opgraph_step

#: Mini-batch used on the CPU when ``--batch`` is not given (see module doc).
CPU_DEFAULT_BATCH = 8
#: How long the default CPU run (the four winners, batch 8, gemm, 1 + 3 calls)
#: takes, as the run's notes, ``--batch``'s help and README.md say it (a test
#: keeps README's words equal to these): 3 minutes measured alone on 2026-12-02
#: and by a later fresh-user run on 2 cores; 6 to 11.3 minutes beside other work.
CPU_RUN_TIME = ("about 3 minutes on an otherwise idle 2-core machine, "
                "6-11 minutes when other work shares its cores")
#: Warm-up calls and timed calls on the CPU, and on a GPU (the seed's 10/10).
CPU_WARMUP, CPU_REPEAT = 1, 3
GPU_WARMUP, GPU_REPEAT = 10, 10
CPU_DEFAULT_NOTE = (f"CPU default lowerings: {', '.join(lw.CPU_DEFAULT)} only (on 2 cores FFT runs "
                    "3.6-96x slower than GEMM (L1-L5) and autotuning times every candidate of every node, so "
                    "all lowerings plus auto would take far more than a few minutes); "
                    "ask for others with --lowering")
#: The document's ``schema_version`` (defined beside the schema, in report.py, which ``compare`` reads).
SCHEMA_VERSION = report.SCHEMA_VERSION


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


def default_batch(model_seed_batch: int, device: str, batch: int | None,
                  run_seed_batches: Mapping[str, int] | None = None) -> tuple[int, str]:
    """The batch a timing run uses, and why: ``batch`` if given, else the
    seed's on a GPU and :data:`CPU_DEFAULT_BATCH` on the CPU.

    Args:
        run_seed_batches: model name -> seed batch of every model of the run,
            which the CPU reason quotes (it named DenseNet-121's 64 in runs
            without DenseNet-121); None: this model's alone.
    """
    if batch is not None:
        return batch, "set with --batch"
    if device == "cpu":
        seeds = run_seed_batches or {"this model": model_seed_batch}  # one model: its name is never shown
        return CPU_DEFAULT_BATCH, (
            f"CPU default: {seed_batch_words(seeds)} sized for a GPU; "
            f"{CPU_DEFAULT_BATCH} keeps a CPU run short (the four winners take {CPU_RUN_TIME}) "
            "(use --batch N to change it)")
    return model_seed_batch, "convnet-benchmarks' batch (the modern suite's for the modern convnets)"


def seed_batch_words(seed_batches: Mapping[str, int]) -> str:
    """``"convnet-benchmarks' batches (128; vgg_a 64) are"`` or ``"convnet-benchmarks' batch (64) is"``:
    the batch most models of ``seed_batches`` (model name -> seed batch) take,
    then each model that takes another, by name, so that only models of the
    run are named."""
    common = Counter(seed_batches.values()).most_common(1)[0][0]
    others = [f"{name} {b}" for name, b in seed_batches.items() if b != common]
    if not others:
        return f"convnet-benchmarks' batch ({common}) is"
    return f"convnet-benchmarks' batches ({common}; {', '.join(others)}) are"


def protocol_defaults(device: str, warmup: int | None, repeat: int | str | None) -> tuple[int, int]:
    """Warm-up and repeat counts: given values, else the device's defaults;
    ``repeat='auto'`` gives :data:`timer.AUTO_ROUND` (the round of an
    :class:`~timer.AdaptiveTimer`, ``Settings.adaptive``)."""
    w, r = (CPU_WARMUP, CPU_REPEAT) if device == "cpu" else (GPU_WARMUP, GPU_REPEAT)
    if repeat == "auto":
        repeat = AUTO_ROUND
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
    #: True: every lowering also gets a ``+graph`` column; a tuple: the lowerings
    #: named there (the default GPU run: ``("auto",)``); False: none.
    cuda_graph: bool | tuple = attrs.field(default=False,
                                           converter=lambda v: v if isinstance(v, bool) else tuple(v))

    def graphed(self, lowering: str) -> bool:
        """Whether ``lowering`` gets a ``<lowering>+graph`` column."""
        return self.cuda_graph is True or (not isinstance(self.cuda_graph, bool) and lowering in self.cuda_graph)
    #: ``--repeat auto``: every opgraph loop repeats until stable (:class:`timer.AdaptiveTimer`,
    #: rounds of ``repeat`` calls); the PyTorch peer times ``repeat`` calls.
    adaptive: bool = False
    #: ``--trace``: a :class:`trace.TraceCollector` that gets one step of every timed column.
    trace: object = None

    @property
    def applied_layout(self) -> str:
        """The layout the columns compute in (:func:`applied_layout`)."""
        return applied_layout(self.layout, self.device)

    def protocol(self, clock: str) -> dict:
        return {"warmup": self.warmup, "repeat": "auto" if self.adaptive else self.repeat, "clock": clock,
                "grad_output": "the model output itself (no loss)",
                "wrt": "parameters only, so a first convolution reading the image has no "
                       "backward-data (L1-L5: the image too, as the layer-wise benchmark)",
                "phases": list(PHASES), "per_layer": self.per_layer, "check": self.check,
                "cuda_graph": [lo.name for lo in self.lowerings if self.graphed(lo.name)],
                "statistics": "median and min over the repeat calls of each loop; mean = convnet-benchmarks'; "
                              "spread: quartiles and IQR (benchmarks/stability.py)",
                "source": "convnet-benchmarks torch7/imagenet_winners/benchmark.lua"}


def _declined(exe, lowering: lw.Lowering, forced: dict) -> dict:
    """Layer -> why ``lowering``'s algorithm did not run it in ``exe``
    (:func:`lowerings.not_applicable`), the layers the policy forced left out."""
    return {k: v for k, v in lw.not_applicable(exe, lowering).items() if k not in forced}


def run_lowering(tg, feeds: dict, ref, lowering: lw.Lowering, base: LoweringPolicy, s: Settings,
                 timer: Timer, peak: dict | None) -> list[dict]:
    """The column(s) of one lowering for one model and precision (see the
    module docstring): its record, then, where ``s.graphed(lowering.name)``,
    the record of its CUDA-graph replay."""
    model = tg.model
    rec = new_record(model, base.precision, s, lowering.name, "opgraph")
    out = [rec]
    policy = lowering.policy(base, s.device)
    rec["policy"] = policy.to_dict()  # what this column compiles with (the environment's is the base)
    why = lw.inapplicable(tg, lowering, s.device, policy)
    if why:
        rec.update(status="n/a", reason=why)
        return out
    exe = runner = None
    try:
        t0 = time.perf_counter()
        with warnings_noted(rec["notes"]):  # a corrupt autotune cache: said in the record, not only on stderr
            exe = og.compile(tg.outputs, device=s.device, policy=policy)
        rec["compile_s"] = time.perf_counter() - t0
        rec["autotune"] = exe.report.autotune or None  # where compile_s went, when autotune ran
        rec["notes"] += filter(None, [cache_note(rec["autotune"])])  # the table says it, and so does the JSON
        rec["fusion"] = exe.report.fusion or None  # which fusion rules rewrote how many matches
        sched = schedule(exe, tg)
        rec["forced"] = forced_nodes(exe.report)  # the policy's choice, not a decline
        if policy.force and not rec["forced"]:  # a typo'd node name: the column would be the fallback's
            typos = "; ".join(n for n in exe.report.notes if n.startswith("policy.force key"))
            rec.update(status="n/a", reason=f"{lowering.name}: its policy forces no node of {model.key}"
                                            + (f": {typos}" if typos else ""))
            return out
        na = _declined(exe, lowering, rec["forced"])
        rec["algorithms"] = lw.algorithm_counts(exe)
        rec["precision_applied"] = lw.precision_applied(exe)
        rec["not_applicable"] = na
        rec["notes"] += lw.requested_notes(exe, base.precision, s.layout, model.dtype, rec["notes"])
        rec["notes"] += filter(None, [lowering.policy_note(policy)])
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
        rec["step"] = opgraph_step(runner, s.repeat)  # the whole step in one loop: what the ratios use
        layer_times = runner.time_layers(s.repeat) if s.per_layer else {}
        rec["times"] = {p: (t.as_dict() if t else None) for p, t in phases.items()}
        rec["totals"] = phase_totals(rec["times"])
        rec["flops"] = model_flops(tg)
        fill_throughput(rec, peak)
        rec["layers"] = layer_records(tg, sched, layer_times, na, exe.report)
        if s.trace is not None:  # one more step, outside every timed loop
            s.trace.add(f"{model.key} {base.precision} {lowering.name}", sched, runner.slots, s.device)
        if s.per_layer:
            rec["other_ms"] = {p: ((rec["times"][p] or {}).get("median_ms") or 0.0)
                               - sum(r["ms"].get(p, 0.0) for r in rec["layers"]) for p in PHASES}
        if s.graphed(lowering.name):
            recompiled = None
            replay_pol = replay_policy(exe, policy)
            if replay_pol is not None:  # a step would run eagerly between the graphs: choose again
                try:
                    eager_exe, exe = exe, None
                    runner = None  # the eager column's arrays go before the replay's are made
                    release_device(s.device)
                    t0 = time.perf_counter()
                    warned: list[str] = []
                    with warnings_noted(warned):
                        exe = og.compile(tg.outputs, device=s.device, policy=replay_pol)
                    changed = changed_choices(eager_exe, exe)
                    eager_exe = None
                    recompiled = {"policy": replay_pol.to_dict(), "compile_s": time.perf_counter() - t0,
                                  "algorithms": lw.algorithm_counts(exe),
                                  "notes": [recompile_note(changed), *warned]}
                    sched = schedule(exe, tg)
                    na = _declined(exe, lowering, rec["forced"])
                    runner = PhaseRunner(sched, exe.feed(feeds), timer)
                    runner.warmup(s.warmup)
                except Exception as e:  # the eager record stands
                    out.append(graph_failed(rec, e, "compiling for the replay (cuda_graph) failed: "))
                    return out
            out.append(graph_column(rec, runner, tg, sched, na, exe, ref, feeds, s, peak, recompiled))
    except Exception as e:  # one column's failure (kernel error, OOM) must not end the run
        rec.update(error_fields(e))
    finally:
        exe = runner = None  # every array of the column (and a replay's pools) is freed here
        release_device(s.device)
    return out


def unit_count(models: Sequence, s: Settings) -> int:
    """Columns the run will produce (for a progress bar): one per lowering,
    a second for each lowering replayed as CUDA graphs (:meth:`Settings.graphed`)."""
    graphed = sum(1 for lo in s.lowerings if s.graphed(lo.name))
    return len(models) * len(s.precisions) * (len(s.lowerings) + graphed + len(s.compare))


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
    if s.adaptive:
        timer = AdaptiveTimer(timer)
    start = time.perf_counter()
    peak = measure_peaks(s.device, s.precisions)
    # the base policy every column starts from (each opgraph result records its own, its
    # lowering's choice applied): the layout asked for, and the precision when there is one
    policy = attrs.evolve(s.base_policy, layout=s.layout,
                          **({"precision": s.precisions[0]} if len(s.precisions) == 1 else {}))
    env = environment(s.device, precision=list(s.precisions), layout=s.applied_layout,
                      layout_requested=s.layout, dtype=sorted({m.dtype for m in models}),
                      batch={m.key: m.batch for m in models}, warmup=s.warmup,
                      repeat="auto" if s.adaptive else s.repeat,
                      lowerings=[lo.name for lo in s.lowerings], compare=list(s.compare),
                      seed=s.seed, policy=policy.to_dict(),
                      threads=thread_counts(torch=bool(s.compare)))  # the peers import PyTorch anyway
    doc = {"tool": "opgraph-bench", "mode": "benchmark", "schema_version": SCHEMA_VERSION,
           "environment": env, "protocol": s.protocol(timer.clock), "peak": peak,
           "stability": stability.run_stability(peak, s.device, env.get("device_name")),
           "lowerings": {lo.name: lo.describe() for lo in s.lowerings},
           "notes": list(notes), "models": [], "results": []}
    if s.compare and s.device == "cpu":  # the peers' threads aligned to NumPy's BLAS, or why not
        doc["notes"] += filter(None, [threads_note(env["threads"])])
    doc["lowerings"].update({lo.name + "+graph": lo.describe() + "; each phase replayed as CUDA "
                             "graphs (steps that cannot be captured run eagerly between them)"
                             for lo in s.lowerings if s.graphed(lo.name)})
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
                entry["reference_bytes"] = {"device": ref.values.device_bytes, "host": ref.values.host_bytes}
                if ref.values.host_bytes:
                    doc["notes"].append(ref.values.spill_note(model.key))
                release_device(s.device)  # the run's freed float64 intermediates, for the peers' PyTorch
            except Exception as e:  # e.g. out of memory: no column of this model can be checked
                ref_error = error_fields(e, "float64 reference failed, so nothing was timed: ")
                release_device(s.device)
        for precision in s.precisions:
            base = attrs.evolve(s.base_policy, precision=precision, layout=s.layout)
            # the peers first: cheap, and the reference every column is compared with, so a
            # --time-limit that cuts the run short still leaves the ratios of what ran
            units = [(list(s.compare), None)] if s.compare else []
            units += [([lo.name], lo) for lo in s.lowerings]
            for names, lowering in units:
                if progress:
                    progress(f"{model.key} {precision} {', '.join(names)}")
                if s.time_limit is not None and time.perf_counter() - start > s.time_limit:
                    recs = [new_record(model, precision, s, n, "opgraph" if lowering else n) for n in names]
                    for rec in recs:
                        rec.update(status="skipped", reason=f"--time-limit {s.time_limit:g} s reached")
                elif ref_error is not None:
                    recs = [new_record(model, precision, s, n, "opgraph" if lowering else n) for n in names]
                    for rec in recs:
                        rec.update(ref_error)
                elif lowering is not None:
                    recs = run_lowering(tg, feeds, ref, lowering, base, s, timer, peak.get(precision))
                else:  # the peers of one model and precision run together: one compilation shared
                    recs = peer_records(tg, feeds, ref, names, precision, s, peak.get(precision))
                if lowering is not None and s.graphed(lowering.name) and len(recs) == 1:
                    recs.append(graph_placeholder(recs[0]))
                doc["results"] += recs
                add_ratios(doc["results"])
                stability.mark_columns(recs, doc["stability"]["reasons"])
                if on_result:
                    on_result(doc)
        del ref, feeds
        release_device(s.device)
    if time.perf_counter() - start > stability.DRIFT_MIN_SECONDS:  # did the load change meanwhile?
        doc["peak_after"] = measure_peaks(s.device, s.precisions)
        doc["stability"] = stability.run_stability(peak, s.device, env.get("device_name"), doc["peak_after"])
        stability.mark_columns(doc["results"], doc["stability"]["reasons"])
    doc["elapsed_s"] = time.perf_counter() - start
    return doc


__all__ = ["applied_layout", "CPU_DEFAULT_BATCH", "CPU_WARMUP", "CPU_REPEAT", "GPU_WARMUP", "GPU_REPEAT",
           "CPU_DEFAULT_NOTE", "Settings", "cuda_status", "resolve_device", "default_batch", "seed_batch_words",
           "protocol_defaults", "random_feeds", "model_flops", "run_lowering", "peer_records",
           "add_ratios", "unit_count", "run_benchmark", "time_calls", "ForwardTiming",
           "time_forward", "lowering_summary", "environment", "git_commit"]
