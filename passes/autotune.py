"""The autotune pass (the meta-optimizer): time every candidate, keep the fastest correct one.

Theano's 2014 "meta-optimizer" design, per node (forward and each backward
node separately, since their best algorithms differ):

1. candidates: every rule the lower pass's survey finds applicable (policy
   exclusions and rule declines are listed in the report, not run) times
   each of its ``variants`` (e.g. one per cuDNN engine, one per Winograd tile);
2. each runs once on random inputs of the node's types (seeded, on the
   device; an input that is a function of the node's other inputs, such as
   the batch statistics of its x, computed from them: ``autotune_inputs``)
   and its output is compared with the reference rule's
   (``reference`` / ``direct``) computed in float64 on the same inputs:
   relative error ``||out - ref|| / ||ref||`` within :func:`tolerance`
   (SEMANTICS.md, "Numbers"); NaN never passes; a raising kernel is
   ``failed``; a workspace above ``policy.workspace_limit`` is ``over budget``;
3. the rest are timed by ``ctx.timer``: one timed run, and unless that is
   already :data:`PRUNE_FACTOR` x the best median so far (then it is recorded
   as is, reason "pruned"), ``ctx.warmup - 1`` warm-up runs and ``ctx.repeats``
   timed runs whose median counts; the fastest median wins (ties: policy
   order). The untimed check run warms plans and caches first;
4. workspace tie-break (:func:`choose`): among the correct candidates timed in
   full (not pruned) whose median is within ``(1 + policy.workspace_tolerance)
   x`` the fastest's, the one with the smallest workspace wins instead (ties:
   the faster median, then policy order), and its row's reason says so: a
   cuDNN engine 1 % faster than another is not worth hundreds of MiB of
   scratch space at the memory peak. ``workspace_tolerance = 0`` keeps the
   fastest;
5. memory-aware re-choice (:meth:`AutotunePass._fit_peak`,
   ``passes/autotune_memory.py``): once every node is chosen, a node whose
   step raises the planned peak above the lowest one the graph can reach
   (the memory pass's bytes per step; ``autotune_memory.reachable_peak``) is
   chosen again from its rows: the fastest correct one timed in full whose
   workspace keeps its step under that peak wins when its median is within
   ``(1 + policy.peak_tolerance) x`` the fastest's; the row's reason and a
   note say so. ``peak_tolerance = 0`` keeps the time-based choice.

Nodes the policy forces, and nodes with a single candidate, are not timed.
Decisions persist in :class:`~passes.autotune_cache.AutotuneCache` with every
candidate's measurements; a cached decision is reused without running
anything if its algorithm still applies, the winner chosen again from the
cached measurements under the current ``workspace_tolerance``
(:func:`rechoose`), unless the entry's top-level choice was edited by hand
to another candidate its rows show correct: that one is used, and the
report's notes say so; an edit that is not used is a ``RuntimeWarning``
saying why (:func:`hand_edit`). Each node's seconds by part: ``autotune_clock``.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from typing import Callable, Mapping, Protocol

import attrs
import numpy as np

from opgraph.errors import LoweringError
from opgraph.graph import Graph
from opgraph.op import Lowered
from opgraph.run_types import run_types
from opgraph.backends.registry import KernelContext, device_support

from .autotune_cache import AutotuneCache, cache_key
from .autotune_clock import NodeClock, TuneClock
from .autotune_inputs import REFERENCE_ALGORITHMS, InputPool, consistent_inputs, random_inputs
from .autotune_inputs import reference_output as _reference
from .autotune_memory import StepRoom, fit_headroom, held_bytes, reachable_peak
from .base import Pass, PassContext
from .candidates import ENGINE_LIMIT_TAG, rule_variants, rule_workspace, survey_node
from .memory import plan_inplace, plan_memory, step_bytes
from .report import Candidate, NodeReport, format_size

#: A candidate whose first timed run is this many times the best median so far
#: is recorded with that one run and not timed further.
PRUNE_FACTOR = 3.0
EXACT_ALGORITHMS = ("reference", "direct", "gemm", "cuda", "unfold")


class Timer(Protocol):
    """Times one candidate: ``measure(fn, label=..., warmup=..., repeats=...)``
    calls ``fn`` ``warmup`` times untimed, then returns ``repeats`` durations
    in seconds. ``label`` (``'winograd[tile=2]'``) lets a test stub answer
    known times per candidate. Optional: ``synchronize()`` (``autotune_clock``)."""

    def measure(self, fn: Callable[[], object], *, label: str, warmup: int,
                repeats: int) -> list[float]: ...


class PerfCounterTimer:
    """CPU wall time with ``time.perf_counter`` around each call."""

    clock_name = "wall"

    def measure(self, fn, *, label, warmup, repeats):
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out


class CudaEventTimer:
    """GPU time between two CUDA events recorded around each call (CuPy): the
    policy's ``tune_clock = 'launch'``. The GPU reaches the first event before
    the host has launched the call's kernels, so a kernel shorter than its
    launch is timed as the launch (``backends/cuda/held_stream.py``)."""

    clock_name = "launch (events around each call)"

    def measure(self, fn, *, label, warmup, repeats):
        import cupy

        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeats):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
        return out

    def synchronize(self) -> None:
        """Wait for the work queued on the current stream."""
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def _take_waits(timer) -> list[str]:
    """The labels a held-stream timer timed by the launch clock on the node just
    tuned (:class:`backends.cuda.held_stream.HeldStreamTimer`), emptied so that
    the next node's candidates are held again; [] for other timers."""
    waits = getattr(timer, "waits", None)
    if not waits:
        return []
    out = sorted(waits)
    waits.clear()
    return out


def default_timer(device: str, clock: str = "device") -> Timer:
    """Autotune's timer for ``device`` and the policy's ``tune_clock``: the
    device backend's (``DeviceSupport.tune_timer``: on cuda, ``'device'`` times
    each candidate's kernels alone), else CUDA events around each call on
    ``'cuda'`` and ``time.perf_counter`` elsewhere."""
    support = device_support()
    timer = support.tune_timer(device, clock) if support.tune_timer else None
    if timer is not None:
        return timer
    return CudaEventTimer() if device == "cuda" else PerfCounterTimer()


def tolerance(algorithm: str, precision: str = "fp32", dtype: str = "float32") -> float:
    """Largest accepted relative error (SEMANTICS.md "Numbers"): half precision
    1e-2, TF32 5e-3, fp32 1e-4 for exact-summation algorithms (direct, GEMM)
    and 1e-3 for transform algorithms (FFT, Winograd, cuDNN engines); float64 1e-9."""
    if dtype in ("float16", "bfloat16") or precision in ("bf16", "fp16"):
        return 1e-2
    if precision == "tf32":
        return 5e-3
    if dtype == "float64":
        return 1e-9
    return 1e-4 if algorithm in EXACT_ALGORITHMS else 1e-3


def relative_error(xp, out, ref) -> float:
    """``||out - ref|| / ||ref||`` computed in float64 on the arrays' device
    (absolute error when ``ref`` is all zeros); NaN for a shape mismatch or
    a non-finite value.

    On the device, not the host: copying a large conv output and its
    reference to the host for every candidate dominated autotuning time.
    """
    if tuple(out.shape) != tuple(ref.shape):
        return math.nan
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: the NaN below says it
        diff = float(xp.linalg.norm((out.astype(xp.float64) - ref.astype(xp.float64)).ravel()))
        norm = float(xp.linalg.norm(ref.ravel().astype(xp.float64)))
    err = diff / norm if norm > 0 else diff
    return err if math.isfinite(err) else math.nan


class AutotunePass(Pass):
    """Re-choose each lowered node's implementation by timing (see module doc)."""

    name = "autotune"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        policy = ctx.policy
        cache = AutotuneCache.for_policy(policy)
        timer = ctx.timer or default_timer(ctx.device, policy.tune_clock)
        versions = ctx.versions()
        if getattr(timer, "clock_id", None):  # a decision timed by another clock is not reused
            versions = {**versions, "tune_clock": timer.clock_id}
        device_name = ctx.device_name()
        # the types values run in (compile's dtype applied; batch statistics stay float32)
        run = run_types(graph, graph.ancestors(outputs), ctx.dtype)
        clock = TuneClock(getattr(timer, "synchronize", None), ctx.device)  # where the pass's time goes
        pool = InputPool(ctx.xp, ctx.seed)  # candidates' inputs, drawn once per type for the whole run
        waits: dict[str, list[str]] = {}  # node -> candidates the launch clock timed (HeldStreamTimer)
        decided: dict[int, _Measured] = {}  # node id -> what the memory-aware re-choice may choose from
        file_hits = 0  # cache hits on decisions read from the file (not timed by this compile)
        for view in list(graph.nodes_in_order(outputs)):
            if not isinstance(view.op, Lowered):
                continue
            node_clock = clock.node()
            op, types = view.op.op, view.input_types
            s = survey_node(view, ctx, op=op)
            rec = ctx.report.nodes.get(view.name)
            if s.forced is not None or rec is None:
                continue
            # without the workspace limit: an over-budget candidate is reported, not declined
            applicable = list(_contenders(s.applicable(limited=False), ctx.device))
            by_algorithm = {e.rule.algorithm: e for e in applicable}  # one entry each: _contenders
            # a source such as a Constant (a stochastic-depth mask) has no input: its own layout
            layout = getattr(types[0] if types else view.type, "layout", None) or "NCHW"
            key = cache_key(op, types, ctx.dtype, layout, policy, ctx.device, device_name, versions,
                            candidates=candidate_set(((e.rule, e.options) for e in applicable), policy.engine_limit))
            hit = cache.get(key)
            problem = entry_problem(hit) if hit else None
            if problem:  # hand-edited rows that cannot decide: measured again
                cache.warn(f"autotune cache {cache.path}: node {view.name}: {problem}; re-tuned")
                hit = None
            blocker = (_declared_blocker(applicable) if policy.cuda_graph and ctx.device == "cuda"
                       else captures_all)
            rows, algorithm, cached_opts = (rechoose(hit, policy.workspace_tolerance, blocker) if hit
                                            else ([], None, {}))
            # a top-level choice edited by hand: used when its row is correct (hand_edit)
            edit = hand_edit(hit, rows, algorithm, cached_opts, policy.workspace_tolerance,
                             blocker) if hit else None
            if edit is not None and edit.used:
                algorithm, cached_opts = edit.algorithm, edit.options
            entry = next((e for e in applicable if e.rule.algorithm == algorithm), None)
            with node_clock.part("variants"):  # a cuDNN engine's plan is built here
                refused = entry and refused_options(entry, cached_opts, op, types, ctx.device, policy.engine_limit)
                if not refused and edit is not None and not edit.used and not edit.measured:
                    # an edit to options no row has: the documented tile = 7 case is re-tuned
                    edited = next((e for e in applicable if e.rule.algorithm == edit.algorithm), None)
                    refused = edited and refused_options(edited, edit.options, op, types, ctx.device,
                                                         policy.engine_limit)
            if refused:  # a hand-edited or stale entry: a kernel would raise on every run
                cache.warn(f"autotune cache {cache.path}: node {view.name}: {refused}; re-tuned")
                entry = None
            elif edit is not None and entry is not None:
                say = ctx.report.note if edit.used else cache.warn
                say(f"autotune cache {cache.path}: node {view.name}: {edit.message}")
            if entry is not None:  # reuse: nothing is timed
                rule, opts = entry.rule, {**entry.options, **cached_opts}
                rec.how, rec.candidates = "cache", rows
                rec.cache_key = key
                file_hits += key in cache.from_file
                # rows rechoose() decides from, and no choice the user made by hand
                if (policy.peak_tolerance > 0 and hit.get("rechoose") == RECHOOSE_VERSION
                        and isinstance(hit.get("candidates"), list)
                        and not pinned_by_hand(hit, algorithm, cached_opts)):
                    decided[view.id] = _Measured(hit["candidates"], blocker, by_algorithm, cached=True)
            else:
                with node_clock.part("variants"):  # every cuDNN engine's plan is built here
                    cands = [(e.rule, {**e.options, **variant}) for e in applicable
                             for variant in rule_variants(e.rule, op, types, ctx.device, e.options,
                                                          policy.engine_limit)]
                if len(cands) < 2:
                    rec.tune_seconds = clock.done(node_clock, "untimed")
                    continue
                rec.cache_key = key
                if hit and not refused:
                    ctx.report.note(f"autotune: {view.name}: cached choice {hit['algorithm']} no longer "
                                    "applies; re-tuned")
                rows, timed = self._tune(op, types, cands, s, ctx, timer, view, run[view.id],
                                         tuple(run[i] for i in graph.input_ids(view.id)), node_clock, pool)
                waited = _take_waits(timer)
                if waited:
                    waits[view.name] = waited
                measured = [c.to_dict() for c in rows]  # cached as timed: rechoose() decides again
                best = choose(rows, timed, policy.workspace_tolerance, blocker)
                if best is None:
                    raise LoweringError(f"node {view.name} ({op.describe()}): autotune found no correct "
                                        "candidate:" + "".join(f"\n  {c.label}: {c.status}: {c.reason}"
                                                               for c in rows))
                rule, opts = next((r, o) for r, o in cands if r.algorithm == best.algorithm
                                  and o == best.options)
                rec.how, rec.candidates = "autotune", rows
                cache.put(key, {"algorithm": rule.algorithm, "options": opts, "time_ms": best.time_ms,
                                "candidates": measured, "rechoose": RECHOOSE_VERSION,
                                # what the tuner chose: a top-level choice unlike it is a hand edit
                                "tuned": {"algorithm": rule.algorithm, "options": opts},
                                "device": device_name, "versions": versions})
                cache.checkpoint()
                decided[view.id] = _Measured(measured, blocker, by_algorithm, cached=False)
            _lower(graph, view.id, rec, rule, opts, ctx.device)
            rec.tune_seconds = clock.done(node_clock, "cache" if rec.how == "cache" else "tuned")
        self._fit_peak(graph, outputs, ctx, decided, cache)
        cache.save()
        for w in cache.messages:
            ctx.report.note(w)
        if waits:  # timed from their launch: the host's time is in their medians
            said = [f"{node} ({', '.join(labels)})" for node, labels in waits.items()]
            ctx.report.note(f"autotune: on {len(waits)} node(s) a candidate's held stream ran out (the call "
                            "waits for the device, or the host paused while queueing it), so the launch "
                            "clock timed it (host time included): "
                            + "; ".join(said[:6]) + (" ..." if len(said) > 6 else ""))
        if getattr(timer, "unavailable", None):
            ctx.report.note(f"autotune: the device clock cannot hold the stream here ({timer.unavailable}); "
                            "the launch clock timed every candidate (host time included)")
        ctx.report.autotune = {**clock.summary(), "clock": getattr(timer, "clock_name", type(timer).__name__),
                               "cache_path": None if cache.path is None else str(cache.path),
                               "file_hits": file_hits}
        return graph

    def _fit_peak(self, graph: Graph, outputs, ctx: PassContext, decided: dict[int, _Measured],
                  cache: AutotuneCache) -> None:
        """Choose again, from its measured rows, each node of ``decided`` whose
        step raises the planned peak above the lowest one reachable
        (``passes/autotune_memory.py``, ``policy.peak_tolerance``; 0: nothing
        to do), and note how many were and the planned peak before and after.
        The cache keeps the measurements, not this choice: it depends on the
        whole schedule, and the next compile makes it again from the rows."""
        policy = ctx.policy
        if policy.peak_tolerance == 0 or not decided:
            return
        plan = plan_inplace(graph, outputs, zero_copy=True)  # as the memory pass will plan it
        steps = step_bytes(graph, outputs, ctx.dtype, plan)

        least = {}  # node id -> the least workspace its rows offer within the tolerance
        for n, measured in decided.items():
            rows, timed = measured_rows(measured.rows)  # fresh rows: choose() marks the ones it gets
            row = choose(rows, timed, policy.workspace_tolerance, measured.blocker,
                         StepRoom(0, 0, 0), policy.peak_tolerance)  # no headroom: the least workspace
            least[n] = min(steps[n].workspace, row.workspace or 0) if row is not None else steps[n].workspace
        ceiling = reachable_peak(steps, least)
        activations = max(st.live for st in steps.values())
        before = max(st.planned for st in steps.values())
        moved = []  # node ids chosen again
        # One pass over the nodes suffices: a node's choice changes only its own
        # step's workspace, not the bytes any step holds besides (the schedule,
        # and the in-place and zero-copy plans, kept as they are: checked below).
        for n, measured in decided.items():
            view, room = graph.node(n), StepRoom(held_bytes(steps[n]), ceiling, activations)
            rec = ctx.report.nodes[view.name]
            if not room.raises(steps[n].workspace):
                continue
            rows, timed = measured_rows(measured.rows)
            best = choose(rows, timed, policy.workspace_tolerance, measured.blocker, room, policy.peak_tolerance)
            entry = measured.applicable.get(best.algorithm) if best is not None else None
            if entry is None:  # no correct row, or its rule no longer applies: the rows cannot decide
                continue
            opts = {**entry.options, **best.options}
            if (best.algorithm, opts) == (rec.algorithm, rec.options):
                continue
            if measured.cached:  # a row read from the file: its options must still run (refused_options)
                refused = refused_options(entry, best.options, view.op.op, view.input_types, ctx.device,
                                          policy.engine_limit)
                if refused:
                    cache.warn(f"autotune cache {cache.path}: node {view.name}: {refused}; "
                               f"{rec.chosen} kept")
                    continue
            old_rule, old_opts = measured.applicable[rec.algorithm].rule, rec.options
            _lower(graph, n, rec, entry.rule, opts, ctx.device)
            if plan_inplace(graph, outputs, zero_copy=True) != plan:  # its rule shares buffers otherwise
                _lower(graph, n, rec, old_rule, old_opts, ctx.device)
                ctx.report.note(f"autotune: {view.name}: {best.label} would lower the planned peak, but it "
                                f"changes the in-place or zero-copy plan; {rec.chosen} kept")
                continue
            rec.candidates = rows
            moved.append(n)
        if moved:
            after = plan_memory(graph, outputs, ctx.dtype, plan)["planned_peak_bytes"]
            names = [graph.node(n).name for n in moved]
            ctx.report.note(
                f"autotune: {len(moved)} node(s) chosen again for the memory peak (peak_tolerance "
                f"{100 * policy.peak_tolerance:g} %): {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}; "
                f"planned peak {format_size(before)} -> {format_size(after)} (the activations' "
                f"{format_size(activations)})")

    def _tune(self, op, types, cands, s, ctx: PassContext, timer, view, out_type, run_in,
              clock: NodeClock, pool: InputPool) -> tuple[list[Candidate], list[Candidate]]:
        """Check and time each candidate; returns the report rows (declined ones
        too) and those of them timed in full (not pruned). ``out_type`` and
        ``run_in`` are the node's output and input types as they run
        (:func:`opgraph.run_types.run_types`: ``ctx.dtype`` applied, batch
        statistics kept in float32); inputs are drawn in ``run_in``. A
        candidate whose output dtype is not ``out_type``'s is ``wrong``: a
        float32 result in a bf16 graph would turn every later value into float32.
        ``clock`` gets the seconds of each part (``passes/autotune_clock.py``);
        ``pool`` draws the inputs (``autotune_inputs.InputPool``)."""
        xp, policy = ctx.xp, ctx.policy
        want = out_type.dtype
        with clock.part("inputs", settle=True):  # layout transposes may still be queued
            # e.g. batch statistics that are x's own (autotune_inputs)
            arrays = consistent_inputs(view, pool.inputs(run_in), xp, ctx.device)
        with clock.part("reference", settle=True):  # float64 kernels, else billed to the first check
            try:
                ref = _reference(op, arrays, xp, ctx.device, out_type)
            except Exception:
                ref = None
        dtype = str(arrays[0].dtype) if arrays else "float32"
        rows, timed, best = [], [], None  # best: fastest fully timed median so far, seconds
        for rule, opts in cands:
            c = Candidate(rule.algorithm, dict(opts), workspace=rule_workspace(rule, op, types, opts),
                          tolerance=tolerance(rule.algorithm, policy.precision, dtype))
            rows.append(c)
            if policy.workspace_limit is not None and c.workspace > policy.workspace_limit:
                c.status, c.reason = "over budget", f"workspace > limit {policy.workspace_limit:,d} B"
                continue
            kctx = KernelContext(xp, ctx.device, dict(opts), out_type)
            clock.checked += 1
            # settle: relative_error waits for the kernel; a failed, wrong-dtype or
            # unverified one has nobody waiting, and its run would be billed to timing
            with clock.part("check", settle=True):
                try:
                    out = rule.kernel(kctx, op, *arrays)
                except Exception as e:  # includes device out-of-memory errors
                    c.status, c.reason = "failed", f"{type(e).__name__}: {e}"
                    continue
                got = getattr(getattr(out, "dtype", None), "name", None)
                if got is not None and got != want:
                    c.status, c.reason = "wrong", f"returns {got}, the node's type is {want}"
                    continue
                if ref is not None:
                    c.rel_error = relative_error(xp, out, ref)
                    if not c.rel_error <= c.tolerance:  # NaN fails too
                        c.status, c.reason = "wrong", f"relative error {c.rel_error:.2e} > {c.tolerance:.0e}"
                        continue
                else:
                    c.status, c.reason = "unverified", "no reference rule for this op"
            run = lambda: rule.kernel(kctx, op, *arrays)  # noqa: E731
            # One timed run first (the check run above warmed plans and caches):
            # a candidate already PRUNE_FACTOR x slower than the best median is
            # not worth the full protocol.
            clock.timed += 1
            with clock.part("timing"):  # no settle: the timer waits for its own runs
                (once,) = timer.measure(run, label=c.label, warmup=0, repeats=1)
            if best is not None and once > PRUNE_FACTOR * best:
                c.time_ms = c.min_ms = 1e3 * once
                c.reason = f"pruned after 1 timed run (> {PRUNE_FACTOR:g}x the best {1e3 * best:.3f} ms)"
                continue
            with clock.part("timing"):
                times = timer.measure(run, label=c.label, warmup=max(0, ctx.warmup - 1),
                                      repeats=max(1, ctx.repeats))
            c.time_ms, c.min_ms = 1e3 * statistics.median(times), 1e3 * min(times)
            timed.append(c)
            best = min(best if best is not None else math.inf, statistics.median(times))
        for algo, why in s.declined(limited=False).items():
            status = "excluded" if why.startswith(("excluded", "opt-in")) else "declined"
            rows.append(Candidate(algo, {}, status=status, reason=why))
        return rows, timed


#: ``capture_blocker(algorithm, options)``: why a candidate (a rule's variant)
#: cannot be captured into a CUDA graph, or None.
CaptureBlocker = Callable[[str, Mapping], str | None]


#: What running one step eagerly between a replay's CUDA graphs is counted to
#: cost (ms; an estimate, not measured alone): the graph is split there, so one
#: graph launch more, and the step's own kernel launches from the host, which
#: overlap the queued graph's work while the GPU is busy. A candidate that
#: cannot be captured still wins a replayed step when it beats the fastest
#: capturable one by more than this. On the H200 (2026-12-04) fp32 NCHW
#: AlexNet's three FFT backward-data steps were each about 0.2 ms faster than
#: cuDNN's: the replay that traded them for cuDNN ran 9.81 ms against the
#: eager step's 9.28, the one that kept them eager between graphs 9.21.
EAGER_STEP_MS = 0.05


def captures_all(algorithm: str, options: Mapping) -> str | None:
    """The :data:`CaptureBlocker` of a step that is not replayed as CUDA
    graphs: nothing is left out for capture."""
    return None


@attrs.frozen
class _Measured:
    """A node autotune chose from measured rows, which the memory-aware
    re-choice (:meth:`AutotunePass._fit_peak`) may choose from again.

    Attributes:
        rows: its candidates as measured, before any choice (``Candidate.to_dict``).
        blocker: the :data:`CaptureBlocker` its choice respected.
        applicable: algorithm -> the survey's entry of each competing rule
            (the rule with the policy's options).
        cached: the rows were read from the cache, so a row's options are
            checked before it runs (:func:`refused_options`).
    """

    rows: list
    blocker: CaptureBlocker
    applicable: dict
    cached: bool


def _lower(graph: Graph, node: int, rec: NodeReport, rule, opts: dict, device: str) -> None:
    """Lower ``node`` to ``rule`` with ``opts`` on ``device`` and record it in
    its :class:`~passes.report.NodeReport` ``rec`` (algorithm, options, the
    ``Lowered`` description and its workspace in bytes)."""
    view = graph.node(node)
    op = view.op.op
    lowered = Lowered(op, rule.algorithm, device, opts)
    graph.replace_op(node, lowered)
    rec.algorithm, rec.options, rec.chosen = rule.algorithm, dict(opts), lowered.describe()
    rec.workspace = rule_workspace(rule, op, view.input_types, opts)


def choose(rows: list[Candidate], timed: list[Candidate], workspace_tolerance: float,
           capture_blocker: CaptureBlocker = captures_all, room: StepRoom | None = None,
           peak_tolerance: float = 0.0) -> Candidate | None:
    """The winning row, marked ``chosen``; None when no row is correct.

    Correct rows (status ``ok``, or ``unverified`` for an op without a
    reference rule) compete on their median ``time_ms`` (milliseconds): the
    fastest wins, ties in row (policy) order. When ``workspace_tolerance`` > 0,
    the rows of ``timed`` (timed in full, not pruned) whose median is within
    ``(1 + workspace_tolerance) x`` the fastest's are near-fastest, and the
    one of them with the smallest ``workspace`` (bytes) wins instead (ties: the
    faster median, then row order). When that is not the fastest, its
    ``reason`` says why it was chosen (``within 3 % of the fastest
    cudnn[engine=1] (0.412 vs 0.405 ms), 290.0 MiB less workspace ...``) and
    the fastest's why it was not.

    ``capture_blocker`` (policy ``cuda_graph``: the step is replayed as CUDA
    graphs; :func:`_declared_blocker`) says why a row (its algorithm and
    options: one variant of a capturable rule may not capture) cannot be
    captured: such a row runs eagerly between the graphs, so it competes only
    when it beats every correct capturable row by more than
    :data:`EAGER_STEP_MS` (or none is correct); a faster one left out says so
    in its ``reason``, and one kept says what it saves.

    ``room`` (the memory-aware re-choice, ``passes/autotune_memory.py``): the
    bytes the node's step holds besides its workspace and the reachable
    peak. When ``peak_tolerance`` > 0 and the winner's workspace is above the
    step's headroom (it raises the planned peak above the reachable one), the row
    :func:`~passes.autotune_memory.fit_headroom` picks among the rows timed
    in full within ``(1 + peak_tolerance) x`` the fastest wins instead, its
    ``reason`` saying so.
    """
    correct = [c for c in rows if c.status in ("ok", "unverified")]
    blocked = {id(c): why for c in correct if (why := capture_blocker(c.algorithm, c.options)) is not None}
    capturable = [c for c in correct if id(c) not in blocked]
    if capturable and blocked:
        bar = min(c.time_ms for c in capturable)
        kept = []
        for c in correct:
            if id(c) not in blocked or c.time_ms >= bar:
                continue
            if c.time_ms + EAGER_STEP_MS < bar:
                kept.append(c)
                note = (f"not capturable ({blocked[id(c)]}): runs eagerly between the CUDA graphs, "
                        f"{bar - c.time_ms:.3f} ms faster than the fastest capturable row (a split "
                        f"is counted as {EAGER_STEP_MS} ms)")
            else:
                note = (f"faster, but not capturable ({blocked[id(c)]}) and the step is replayed as "
                        f"CUDA graphs (cuda_graph): by {bar - c.time_ms:.3f} ms, no more than the "
                        f"{EAGER_STEP_MS} ms a split is counted as")
            c.reason = "; ".join(filter(None, [c.reason, note]))
        correct = capturable + kept
    fastest = min(correct, key=lambda c: c.time_ms, default=None)
    if fastest is None:
        return None
    full = {id(c) for c in timed}

    def near(tolerance: float) -> list[Candidate]:  # the fastest, and the rows timed in full close to it
        return [c for c in correct if c is fastest or (
            id(c) in full and c.time_ms <= (1 + tolerance) * fastest.time_ms)]

    best = fastest
    if workspace_tolerance > 0:
        best = min(near(workspace_tolerance), key=lambda c: (c.workspace or 0, c.time_ms))
    if best is not fastest:
        saved = format_size((fastest.workspace or 0) - (best.workspace or 0))
        pct = f"{100 * workspace_tolerance:g} %"
        best.reason = "; ".join(filter(None, [
            best.reason, f"within {pct} of the fastest {fastest.label} ({best.time_ms:.3f} vs "
                         f"{fastest.time_ms:.3f} ms), {saved} less workspace (workspace_tolerance)"]))
        fastest.reason = "; ".join(filter(None, [
            fastest.reason, f"fastest, but {best.label} is within {pct} with {saved} less workspace"]))
    if room is not None and peak_tolerance > 0 and (best.workspace or 0) > room.headroom:
        best = fit_headroom(near(peak_tolerance), fastest, best, room, peak_tolerance)
    best.status = "chosen"
    return best


#: Cache entries written with this tag hold their rows as measured, before any
#: choice (every check of :meth:`AutotunePass._tune` applied, the output dtype
#: included), so :func:`rechoose` may decide again from them.
RECHOOSE_VERSION = 1


def measured_rows(measured: list[dict]) -> tuple[list[Candidate], list[Candidate]]:
    """``(rows, timed)`` to choose from: a node's candidates as measured
    (``Candidate.to_dict``, as a cache entry of :data:`RECHOOSE_VERSION`
    holds them), none of them ``chosen``, and those of them timed in full
    (a pruned row's ``reason`` starts with ``pruned``: one run is not a median)."""
    rows = [Candidate.from_dict(c) for c in measured]
    for c in rows:
        if c.status == "chosen":
            c.status = "ok"
    return rows, [c for c in rows if c.time_ms is not None and not c.reason.startswith("pruned")]


def rechoose(entry: dict, workspace_tolerance: float,
             capture_blocker: CaptureBlocker = captures_all) -> tuple[list[Candidate], str | None, dict]:
    """``(rows, algorithm, options)`` of a cached decision under the current
    ``workspace_tolerance`` and ``capture_blocker`` (:func:`choose`): the cached rows
    (times and workspaces as measured) go through :func:`choose` again, so
    changing either needs no re-tuning. An entry without the :data:`RECHOOSE_VERSION` tag (written
    before the tie-break and the output-dtype check) keeps its algorithm and
    options: its rows were not all checked as today's are."""
    if entry.get("rechoose") != RECHOOSE_VERSION:
        rows = [Candidate.from_dict(c) for c in entry.get("candidates", [])]
        return rows, entry.get("algorithm"), dict(entry.get("options", {}))
    rows, timed = measured_rows(entry.get("candidates", []))
    best = choose(rows, timed, workspace_tolerance, capture_blocker)
    if best is None:
        return rows, entry.get("algorithm"), dict(entry.get("options", {}))
    return rows, best.algorithm, dict(best.options)


def entry_problem(entry: dict) -> str | None:
    """Why a cache entry's rows cannot decide, or None: a measured time that is
    not a finite number >= 0 (a hand edit: ``time_ms: -1e9`` would win every
    comparison), or, in an entry :func:`rechoose` decides from, no correct row
    (the tuner never writes one: it raises when no candidate is correct)."""
    rows = entry.get("candidates", [])
    for row in rows:
        for field in ("time_ms", "min_ms"):
            t = row.get(field)
            if t is not None and not (isinstance(t, (int, float)) and not isinstance(t, bool)
                                      and math.isfinite(t) and t >= 0):
                return f"row {row.get('algorithm')!r} has {field} {t!r}, not a finite time >= 0"
    if entry.get("rechoose") == RECHOOSE_VERSION and rows and not any(
            row.get("status") in ("ok", "unverified", "chosen") for row in rows):
        return "no row is correct (every row's status is " + ", ".join(
            sorted({str(row.get("status")) for row in rows})) + ")"
    return None


@attrs.frozen
class HandEdit:
    """A cache entry's top-level ``algorithm``/``options`` that differ from the
    choice made from its measured rows (:func:`hand_edit`).

    Attributes:
        algorithm, options: the entry's top-level choice, as edited.
        used: whether it replaces the rows' choice.
        measured: whether the entry has a row of it (checked and timed).
        message: what the report says (a note when ``used``; else a
            ``RuntimeWarning`` through ``AutotuneCache.warn``).
    """

    algorithm: str
    options: dict
    used: bool
    measured: bool
    message: str


def hand_edit(entry: dict, rows: list[Candidate], algorithm: str | None, options: dict,
              workspace_tolerance: float, capture_blocker: CaptureBlocker = captures_all) -> HandEdit | None:
    """The hand edit of a cached decision's top-level choice, or None.

    ``rows``, ``algorithm`` and ``options`` are :func:`rechoose`'s answer for
    ``entry``. An entry the tuner writes records its own choice in ``tuned``
    (``{"algorithm": ..., "options": ...}``); a top-level ``algorithm`` /
    ``options`` unlike it was edited in the file, and is used (``used``; the
    rows' choice is then marked ``ok`` and the edited row ``chosen``, each
    ``reason`` saying so) when the entry has a row of exactly that choice
    whose status is correct (``ok``, or ``unverified`` for an op without a
    reference rule), and, by ``capture_blocker`` (policy ``cuda_graph``:
    :func:`choose`), that can be captured into a CUDA graph unless the rows'
    choice cannot either. Otherwise the rows' choice stands and ``message``
    says why the edit is not used. None when nothing conflicts: an entry
    without the ``rechoose`` tag (its top-level choice is used as written
    anyway), a top-level choice equal to ``tuned`` or to the rows' choice.

    An entry without a valid ``tuned`` (written before opgraph recorded it)
    cannot tell an edit from a choice made under another
    ``workspace_tolerance`` or ``cuda_graph``: the rows' choice stands, as the
    cache's documented re-choosing says, and ``message`` says so.
    """
    if entry.get("rechoose") != RECHOOSE_VERSION:
        return None
    edited_alg, edited_opts = entry.get("algorithm"), dict(entry.get("options", {}))
    if (edited_alg, edited_opts) == (algorithm, options):
        return None
    tuned = _tuned_choice(entry)
    valid = tuned is not None
    if (edited_alg, edited_opts) == tuned:
        return None
    e_label = Candidate(edited_alg, edited_opts).label
    best = next((c for c in rows if c.status == "chosen"), None)
    b_label = best.label if best is not None else Candidate(algorithm, options).label
    row = next((c for c in rows if c.algorithm == edited_alg and c.options == edited_opts), None)
    instead = f"{b_label} chosen from the entry's measured candidates instead"

    def no(why: str) -> HandEdit:
        return HandEdit(edited_alg, edited_opts, False, row is not None, why)

    if not valid:
        return no(f"the entry's choice {e_label} is not used: {instead} (workspace_tolerance "
                  f"{workspace_tolerance:g}); the entry has no \"tuned\" record of the tuner's own "
                  "choice (written before opgraph kept one), so a hand edit cannot be told from a choice "
                  "made under another workspace_tolerance or cuda_graph: pin a choice with the policy's "
                  "force, or delete the entry and edit the one re-tuning writes")
    tail = f"; {instead} (set algorithm/options back to \"tuned\" to silence this)"
    if row is None:
        measured = ", ".join(c.label for c in rows if c.status not in ("excluded", "declined"))
        return no(f"hand-edited choice {e_label} is not used: it is not among the entry's measured "
                  f"candidates ({measured}){tail}")
    if row.status not in ("ok", "unverified"):
        return no(f"hand-edited choice {e_label} is not used: its measured row is {row.status}"
                  + (f" ({row.reason})" if row.reason else "") + tail)
    edit_blocker = capture_blocker(edited_alg, edited_opts)
    if edit_blocker is not None and capture_blocker(algorithm, options) is None:
        return no(f"hand-edited choice {e_label} is not used: it cannot be captured into a CUDA graph "
                  f"({edit_blocker}) and the step is replayed as CUDA graphs (cuda_graph){tail}")
    if best is not None:
        best.status = "ok"
        best.reason = "; ".join(filter(None, [best.reason, f"the measurements' choice; the cache entry's "
                                                          f"hand-edited {e_label} is used instead"]))
    row.status = "chosen"
    row.reason = "; ".join(filter(None, [row.reason, f"hand-edited in the autotune cache (the measurements "
                                                    f"choose {b_label})"]))
    at = f"{row.time_ms:.3f} ms" if row.time_ms is not None else "untimed"
    than = f" ({best.time_ms:.3f} ms)" if best is not None and best.time_ms is not None else ""
    return HandEdit(edited_alg, edited_opts, True, True,
                    f"hand-edited choice {e_label} used ({at}, checked correct when tuned); "
                    f"the measurements alone choose {b_label}{than}")


def _tuned_choice(entry: dict) -> tuple[str, dict] | None:
    """``(algorithm, options)`` of a cache entry's ``tuned`` record (the
    tuner's own choice), or None where it has no valid one (written before
    opgraph kept it)."""
    tuned = entry.get("tuned")
    if not (isinstance(tuned, dict) and isinstance(tuned.get("algorithm"), str)
            and isinstance(tuned.get("options", {}), dict)):
        return None
    return tuned["algorithm"], dict(tuned.get("options", {}))


def pinned_by_hand(entry: dict, algorithm: str | None, options: dict) -> bool:
    """Whether ``algorithm``/``options``, the choice a node runs from cache
    ``entry``, is the entry's top-level choice edited by hand (unlike its
    ``tuned`` record: :func:`hand_edit`), whether the edit overrides the
    choice made from the rows or agrees with it. The memory-aware re-choice
    leaves such a node alone: the user asked for that choice."""
    top = (entry.get("algorithm"), dict(entry.get("options", {})))
    tuned = _tuned_choice(entry)
    return tuned is not None and top != tuned and (algorithm, dict(options)) == top


def _declared_blocker(applicable) -> CaptureBlocker:
    """The :data:`CaptureBlocker` of a replayed step: what the applicable
    candidate's rule declares for those options (``Rule.declared_capture_blocker``:
    the rule's own reason, or its variant's); None for an algorithm that no
    longer applies (a cached choice of one is re-tuned anyway)."""
    rules = {e.rule.algorithm: e.rule for e in applicable}

    def blocker(algorithm: str, options: Mapping) -> str | None:
        rule = rules.get(algorithm)
        return rule.declared_capture_blocker(options) if rule is not None else None
    return blocker


def candidate_set(applicable, engine_limit: int | None = None) -> str:
    """``'cuda:pool_variants,cudnn:variants[engines<=10]'``: the competing
    rules (``(rule, options)`` pairs) and the function enumerating each one's
    variants, with the engine limit of those that take it (part of the cache
    key, so the same in every process: no object address; a decision tuned
    among 10 engines is not reused for a policy asking for all)."""
    def name(rule) -> str:
        limited = ENGINE_LIMIT_TAG in rule.tags and engine_limit is not None
        return f"{rule.algorithm}:{_stable_name(rule.variants)}" + (f"[engines<={engine_limit}]" if limited else "")
    return ",".join(sorted(name(r) for r, _ in applicable))


def _stable_name(fn) -> str:
    """A function's qualified name; for a ``functools.partial``, the wrapped
    function's with its bound arguments (``variants('forward')``); with
    ``@<revision>`` when the function has a ``revision`` attribute (a kernel
    family that changed how fast it runs bumps it, so the decisions tuned
    against its old kernels are tuned again: ``rules.vector_pool_variants``)."""
    if isinstance(fn, functools.partial):
        args = ", ".join([*map(repr, fn.args), *(f"{k}={v!r}" for k, v in sorted(fn.keywords.items()))])
        return f"{_stable_name(fn.func)}({args})"
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    revision = getattr(fn, "revision", None)
    return name if revision is None else f"{name}@{revision}"


def _contenders(applicable, device: str):
    """The candidates worth timing: all but the first reference alias (``direct``
    and ``reference`` run the same conv code: timing both is wasted work), and on
    ``cuda`` no reference at all when another rule applies: the oracle kernels
    are written to be right, not fast (float64-capable NumPy/CuPy code, host
    synchronisations), no step of a model may run them on the GPU (issue 16),
    and timing them on every node of a large model cost minutes of autotuning."""
    applicable = list(applicable)
    if device == "cuda" and any(e.rule.algorithm not in REFERENCE_ALGORITHMS for e in applicable):
        applicable = [e for e in applicable if e.rule.algorithm not in REFERENCE_ALGORITHMS]
    seen_ref = False
    for entry in applicable:
        if entry.rule.algorithm in REFERENCE_ALGORITHMS:
            if seen_ref:
                continue
            seen_ref = True
        yield entry


def refused_options(entry, cached: dict, op, types, device, engine_limit: int | None = None) -> str | None:
    """Why a cached decision's options cannot run the node (``entry``: the
    applicable rule of the cached algorithm with the policy's options), or
    None. Its options must be the policy's plus one of the rule's variants for
    this node, as :meth:`AutotunePass._tune` would have timed them: a
    hand-edited Winograd ``tile = 7`` is none, and its kernel would raise. A
    cuDNN engine (rules tagged ``variants:engine_limit``) is checked by
    building its plan alone: listing the variants would build every plan of
    the node again, the cost the cache is there to save."""
    chosen = {**entry.options, **cached}
    if ENGINE_LIMIT_TAG in entry.rule.tags and set(cached) <= {"engine"} | set(entry.options):
        engine = chosen.get("engine")
        if not isinstance(engine, int) or isinstance(engine, bool):
            return f"cached options {cached} of {entry.rule.algorithm}: engine must be a plan index"
        try:
            entry.rule.workspace(op, types, chosen)  # builds the engine's plan; raises if it cannot
        except Exception as e:
            return f"cached options {cached} of {entry.rule.algorithm} cannot run this node: {e}"
        return None
    allowed = [{**entry.options, **v}
               for v in rule_variants(entry.rule, op, types, device, entry.options, engine_limit)]
    if chosen in allowed:
        return None
    return (f"cached options {cached} of {entry.rule.algorithm} are not among its variants for this "
            f"node ({', '.join(map(str, allowed))})")


__all__ = ["AutotunePass", "choose", "rechoose", "measured_rows", "hand_edit", "pinned_by_hand", "HandEdit",
           "CaptureBlocker", "captures_all", "EAGER_STEP_MS", "refused_options", "Timer", "PerfCounterTimer", "CudaEventTimer",
           "default_timer", "tolerance", "random_inputs", "relative_error", "REFERENCE_ALGORITHMS"]
