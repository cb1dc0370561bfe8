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
   order). The untimed check run warms plans and caches first. A node the
   zero-copy plan will put in its slice of a concat's buffer
   (``zero_copy.predict_homes``, made on this graph: the memory pass plans on
   the same edges) runs both steps into that slice of a scratch buffer: a
   rule that writes strided views as its strided write and, as another
   candidate with ``strided_out: False``, as its dense result plus the copy
   (``autotune_measure.out_forms``), which the plan honours; its cache key
   names the slice (``out=``), so a dense decision is never reused for it;
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
anything if its algorithm still applies (its key holds the fingerprint of the
code generating our kernels, ``backends/cuda/kernel_sources.py``, and of the
kernels the generator emits for the node, ``codegen_sources.py``: one tuned
on other kernel code is not found, and the node is tuned and checked again,
with a note, its new entry replacing that one), the winner chosen again from the
cached measurements under the current ``workspace_tolerance``
(:func:`rechoose`), unless the entry's top-level choice was edited by hand
to another candidate its rows show correct: that one is used, and the
report's notes say so; an edit that is not used is a ``RuntimeWarning``
saying why and naming the choice that runs (warned once the memory-aware
re-choice is made: :func:`hand_edit`, ``HandEdit.instead_of_rows``). Each
node's seconds by part: ``autotune_clock``.

This module holds the pass itself: the loop over the nodes (cache lookup,
reuse or measurement, lowering, the cache write) and the memory-aware
re-choice once every node is chosen. Each other part is a module of its own,
and its public names are re-exported here:

* ``autotune_contenders``: which applicable rules compete, and their name in
  the cache key (:func:`candidate_set`);
* ``autotune_timers``: the :class:`Timer` protocol and the default timers;
* ``autotune_inputs``: the candidates' inputs and the float64 reference;
* ``autotune_accuracy``: :func:`relative_error` and :func:`tolerance`;
* ``autotune_measure``: one node's candidates checked and timed (steps 2-3);
* ``autotune_choice``: :func:`choose` and the CUDA-graph capture rule (steps 4-5);
* ``autotune_reuse``: a cached decision chosen again from its rows
  (:func:`rechoose`), or refused (:func:`entry_problem`, :func:`refused_options`);
* ``autotune_hand_edit``: a cached choice edited by hand (:func:`hand_edit`);
* ``autotune_memory``, ``autotune_cache``, ``autotune_clock``: the memory
  peak, the cache file, where the time goes.
"""

from __future__ import annotations

import attrs

from opgraph.errors import LoweringError, warn_from_caller
from opgraph.graph import Graph
from opgraph import ops
from opgraph.op import Lowered, abstract_of
from opgraph.run_types import run_types

from .autotune_accuracy import EXACT_ALGORITHMS, relative_error, tolerance
from .autotune_cache import AutotuneCache, cache_key, key_layout
from .autotune_choice import EAGER_STEP_MS, CaptureBlocker, captures_all, choose, declared_blocker
from .autotune_clock import TuneClock
from .autotune_contenders import KeyNode, candidate_set, contenders
from .autotune_hand_edit import HandEdit, hand_edit, pinned_by_hand
from .autotune_inputs import REFERENCE_ALGORITHMS, InputPool, random_inputs
from .autotune_measure import PRUNE_FACTOR, measure_candidates, out_forms
from .autotune_memory import StepRoom, held_bytes, reachable_peak
from .autotune_reuse import RECHOOSE_VERSION, entry_problem, measured_rows, rechoose, refused_options
from .autotune_timers import CudaEventTimer, PerfCounterTimer, Timer, default_timer, take_waits
from .base import Pass, PassContext
from .candidates import ENGINE_LIMIT_TAG, rule_variants, rule_workspace, survey_node
from .force import matches_a_node
from .policy import DEFAULT_ENGINE_LIMIT
from .memory import plan_inplace, plan_memory, step_bytes
from .report import NodeReport, format_size
from .zero_copy import Home, predict_homes


@attrs.frozen
class _Measured:
    """A node autotune chose from measured rows, which the memory-aware
    re-choice (:meth:`AutotunePass._fit_peak`) may choose from again.

    Attributes:
        rows: its candidates as measured, before any choice (``Candidate.to_dict``).
        blocker: the :data:`CaptureBlocker` its choice respected.
        applicable: algorithm -> the survey's entry of each competing rule
            (the rule with the policy's options).
        home: where the zero-copy plan will put its output (its rows were
            timed writing there), or None.
        cached: the rows were read from the cache, so a row's options are
            checked before it runs (:func:`refused_options`).
    """

    rows: list
    blocker: CaptureBlocker
    applicable: dict
    cached: bool
    home: Home | None = None


#: How the note on an ``engine_limits`` key naming no node begins (a benchmark record repeats it).
UNMATCHED_ENGINE_LIMITS = "policy.engine_limits key"


def _named(ctx: PassContext, view) -> tuple[str, str | None] | None:
    """``(name, direction)`` under which ``engine_limits`` keys name node ``view`` (its
    ``PassContext.aliases`` name), or None for a node no key names."""
    alias = ctx.aliases.get(view.name, view.name)
    return None if alias is None else (alias, getattr(abstract_of(view.op), "direction", None))


def _note_unmatched_engine_limits(graph: Graph, nodes: list, ctx: PassContext) -> None:
    """Note and warn of each ``policy.engine_limits`` key that names none of ``nodes`` (the
    graph's :func:`_named` nodes; a typo would otherwise leave every node at the default limit
    without a word), as ``force``'s are: before any node is tuned, so that a typo is said
    before minutes of tuning."""
    for key in ctx.policy.engine_limits:
        if not matches_a_node(key, nodes):
            _say(ctx, f"{UNMATCHED_ENGINE_LIMITS} {key!r} matches no node of graph {graph.name!r}")


def _note_idle_engine_limits(graph: Graph, nodes: list, ctx: PassContext, limited: list) -> None:
    """On cuda, note and warn of each ``policy.engine_limits`` key that names some of
    ``nodes`` but none that autotune timed over cuDNN engines (``limited``: the ``(name,
    direction)`` of those it did): a pooling layer, a forced node, every node when cuDNN is
    missing; and of a non-default ``engine_limit`` when no node was. (Elsewhere the compile
    notes that every key has no effect: ``compiler.ENGINE_LIMITS_IDLE``.)"""
    if ctx.device != "cuda":
        return
    if not limited and ctx.policy.engine_limit != DEFAULT_ENGINE_LIMIT:
        _say(ctx, f"policy engine_limit={ctx.policy.engine_limit or 'all'}: no node of graph {graph.name!r} "
                  f"had cuDNN engines to time (no cuDNN node, or cuDNN unavailable): no effect")
    for key in ctx.policy.engine_limits:
        if matches_a_node(key, nodes) and not matches_a_node(key, limited):
            _say(ctx, f"{UNMATCHED_ENGINE_LIMITS} {key!r} names no node of graph {graph.name!r} whose cuDNN "
                      "engines autotune times (not a cuDNN node, forced, or cuDNN unavailable): no effect")


def _say(ctx: PassContext, msg: str) -> None:
    ctx.report.note(msg)
    warn_from_caller(msg)


def _engine_limit(policy, ctx: PassContext, name: str, op) -> int | None:
    """Node ``name``'s cuDNN engine limit: ``policy.engine_limit_for`` under the name its force
    keys match (``PassContext.aliases``: a legalized ``/unpadded`` node is its original's; a node
    aliased to None, which no force key names, keeps the policy's ``engine_limit``)."""
    alias = ctx.aliases.get(name, name)
    # None: a copy no force key names (a fusion's rematerialised node): nor does an engine_limits key
    return policy.engine_limit if alias is None else policy.engine_limit_for(alias, op.direction)


def _strided_forms(rule, home: Home | None, view) -> bool:
    """Whether ``rule``'s candidates on node ``view`` come in both output forms
    (``autotune_measure.out_forms``), so ``strided_out: False`` is an option."""
    return home is not None and rule.writes_strided(view.type.layout)


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


class AutotunePass(Pass):
    """Re-choose each lowered node's implementation by timing (see module doc)."""

    name = "autotune"

    def run(self, graph: Graph, outputs, ctx: PassContext) -> Graph:
        policy = ctx.policy
        # (name, direction) of every node engine_limits keys can name
        named = list(filter(None, (_named(ctx, v) for v in graph.nodes_in_order(outputs))))
        _note_unmatched_engine_limits(graph, named, ctx)
        limited: list[tuple] = []  # (name, direction) of the nodes timed over cuDNN engines
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
        # node id -> a hand edit not used: warned after the memory-aware re-choice, which may
        # replace the choice its warning names as used instead (HandEdit.instead_of_rows)
        unused_edits: dict[int, HandEdit] = {}
        file_hits = 0  # cache hits on decisions read from the file (not timed by this compile)
        # where the zero-copy plan (run by the memory pass on these edges) will put
        # each concat input: candidates are timed writing there (zero_copy.predict_homes)
        homes = predict_homes(graph, outputs)
        for view in list(graph.nodes_in_order(outputs)):
            if not isinstance(view.op, Lowered):
                continue
            node_clock = clock.node()
            op, types = view.op.op, view.input_types
            s = survey_node(view, ctx, op=op)
            rec = ctx.report.nodes.get(view.name)
            # this node's engine limit (policy.engine_limits: force's keys, the legalize pass's
            # aliases too), in its key: a node given another limit is tuned afresh, the rest hit
            engine_limit = _engine_limit(policy, ctx, view.name, op)
            if s.forced is not None or rec is None:
                continue
            # without the workspace limit: an over-budget candidate is reported, not declined
            applicable = list(contenders(s.applicable(limited=False), ctx.device))
            if any(ENGINE_LIMIT_TAG in e.rule.tags for e in applicable) and (named_as := _named(ctx, view)):
                limited.append(named_as)
            by_algorithm = {e.rule.algorithm: e for e in applicable}  # one entry each: contenders
            # every input's layout where they differ; the output's where it differs from inputs
            # that agree; a source such as a Constant (a stochastic-depth mask) has no input: its own layout
            layout = key_layout(types, view.type.layout)
            # a concat homed in a larger one: its step is the executor's own, whatever its rule
            home = homes.get(view.id) if not isinstance(abstract_of(view.op), ops.Concat) else None
            run_in = tuple(run[i] for i in graph.input_ids(view.id))
            # the node a variants function's node_fingerprint hashes (codegen_sources: a plan of the
            # node, ~0.4 ms), given only where the key can be written: two contenders or more, or a
            # homed node (two output forms); a lone rule on a buffer of its own is timed only if it
            # lists several variants, and the one variants function with a node_fingerprint lists one
            keyed = (KeyNode(op, run_in, run[view.id], home.placement() if home is not None else None)
                     if len(applicable) > 1 or home is not None else None)
            key = cache_key(op, types, ctx.dtype, layout, policy, ctx.device, device_name, versions,
                            candidates=candidate_set(((e.rule, e.options) for e in applicable), engine_limit,
                                                     keyed),
                            out=home.describe() if home is not None else None)
            hit = cache.get(key)
            problem = entry_problem(hit) if hit else None
            if problem:  # hand-edited rows that cannot decide: measured again
                cache.warn(f"autotune cache {cache.path}: node {view.name}: {problem}; re-tuned")
                hit = None
            blocker = (declared_blocker(applicable) if policy.cuda_graph and ctx.device == "cuda"
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
                refused = entry and refused_options(entry, cached_opts, op, types, ctx.device, engine_limit,
                                                    _strided_forms(entry.rule, home, view))
                if not refused and edit is not None and not edit.used and not edit.measured:
                    # an edit to options no row has: the documented tile = 7 case is re-tuned
                    edited = next((e for e in applicable if e.rule.algorithm == edit.algorithm), None)
                    refused = edited and refused_options(edited, edit.options, op, types, ctx.device,
                                                         engine_limit, _strided_forms(edited.rule, home, view))
            if refused:  # a hand-edited or stale entry: a kernel would raise on every run
                cache.warn(f"autotune cache {cache.path}: node {view.name}: {refused}; re-tuned")
                entry = None
            elif edit is not None and entry is not None and edit.used:
                ctx.report.note(f"autotune cache {cache.path}: node {view.name}: {edit.message}")
            elif edit is not None and entry is not None:
                unused_edits[view.id] = edit
            if entry is not None:  # reuse: nothing is timed
                rule, opts = entry.rule, {**entry.options, **cached_opts}
                rec.how, rec.candidates = "cache", rows
                rec.cache_key = key
                file_hits += key in cache.from_file
                # rows rechoose() decides from, and no choice the user made by hand
                if (policy.peak_tolerance > 0 and hit.get("rechoose") == RECHOOSE_VERSION
                        and isinstance(hit.get("candidates"), list)
                        and not pinned_by_hand(hit, algorithm, cached_opts)):
                    decided[view.id] = _Measured(hit["candidates"], blocker, by_algorithm, cached=True, home=home)
            else:
                with node_clock.part("variants"):  # every cuDNN engine's plan is built here
                    cands = [(e.rule, {**e.options, **variant}) for e in applicable
                             for variant in rule_variants(e.rule, op, types, ctx.device, e.options,
                                                          engine_limit)]
                    cands = out_forms(cands, home, view.type.layout)  # a homed node: strided, or dense + copy
                if len(cands) < 2:
                    rec.tune_seconds = clock.done(node_clock, "untimed")
                    continue
                rec.cache_key = key
                if hit and not refused:
                    ctx.report.note(f"autotune: {view.name}: cached choice {hit['algorithm']} no longer "
                                    "applies; re-tuned")
                elif cache.get(key) is None and cache.superseded(key) is not None:
                    ctx.report.note(f"autotune: {view.name}: its cached decision was tuned on other kernel "
                                    "code (the source fingerprint in its key differs); re-tuned")
                rows, timed = measure_candidates(op, types, cands, s, ctx, timer, view, run[view.id], run_in,
                                                 node_clock, pool, home)
                waited = take_waits(timer)
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
                decided[view.id] = _Measured(measured, blocker, by_algorithm, cached=False, home=home)
            _lower(graph, view.id, rec, rule, opts, ctx.device)
            rec.tune_seconds = clock.done(node_clock, "cache" if rec.how == "cache" else "tuned")
        _note_idle_engine_limits(graph, named, ctx, limited)
        moved = self._fit_peak(graph, outputs, ctx, decided, cache)
        for n, edit in unused_edits.items():
            name = graph.node(n).name
            message = edit.message
            if n in moved:  # the warning names the choice that runs, not the rows' it replaced
                label = next(c.label for c in ctx.report.nodes[name].candidates if c.status == "chosen")
                message = edit.instead_of_rows(label, f"chosen for the memory peak (peak_tolerance "
                                                      f"{100 * policy.peak_tolerance:g} %)")
            cache.warn(f"autotune cache {cache.path}: node {name}: {message}")
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
                  cache: AutotuneCache) -> list[int]:
        """Choose again, from its measured rows, each node of ``decided`` whose
        step raises the planned peak above the lowest one reachable
        (``passes/autotune_memory.py``, ``policy.peak_tolerance``; 0: nothing
        to do), and note how many were and the planned peak before and after;
        returns the ids of the nodes chosen again. The cache keeps the
        measurements, not this choice: it depends on the whole schedule, and
        the next compile makes it again from the rows."""
        policy = ctx.policy
        if policy.peak_tolerance == 0 or not decided:
            return []
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
                                          _engine_limit(policy, ctx, view.name, view.op.op),
                                          _strided_forms(entry.rule, measured.home, view))
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
                f"planned peak {format_size(before, after, activations)} -> "
                f"{format_size(after, before, activations)} (the activations' "
                f"{format_size(activations, before, after)})")
        return moved


#: The pass, and the names of its parts that tests, benchmarks and scripts import
#: from here (defined in the ``autotune_*`` modules, re-exported).
__all__ = ["AutotunePass", "choose", "rechoose", "measured_rows", "hand_edit", "pinned_by_hand", "HandEdit",
           "CaptureBlocker", "captures_all", "EAGER_STEP_MS", "refused_options", "Timer", "PerfCounterTimer",
           "CudaEventTimer", "default_timer", "tolerance", "random_inputs", "relative_error", "REFERENCE_ALGORITHMS",
           "EXACT_ALGORITHMS", "PRUNE_FACTOR", "RECHOOSE_VERSION", "entry_problem", "candidate_set"]
