"""The ``<lowering>+graph`` column: the eager column's compiled graph, each
phase replayed as CUDA graphs (:meth:`protocol.PhaseRunner.time_graphed_phases`)
and the phases' graphs replayed back to back as the whole step
(:func:`.whole_step.graphed_step`), checked end to end against the float64
reference and, on a new input, against the eager executor."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from opgraph.backends import device as dev
from opgraph.passes.report import Candidate

from . import check as chk
from .protocol import PhaseRunner
from .records import error_fields, fill_throughput, layer_records, model_flops, phase_totals
from .whole_step import graphed_step

if TYPE_CHECKING:
    from .driver import Settings


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


def graph_check(eager_e2e: dict, graph_e2e: dict) -> tuple[bool, str | None]:
    """Whether a replay's end-to-end errors (:func:`check.end_to_end`) match
    its eager column's, and why not."""
    if not graph_e2e["finite"]:
        return False, f"non-finite values in {', '.join(graph_e2e['non_finite'][:3])}"
    for key in ("output", "max_grad", "max_state"):
        e, g = eager_e2e.get(key), graph_e2e.get(key)
        if e is None or g is None:
            continue
        bound = max(GRAPH_CHECK_FACTOR * e, e + GRAPH_CHECK_SLACK)
        if g > bound:
            return False, f"{key} relative error {g:.3g} > {bound:.3g} (eager column: {e:.3g})"
    return True, None


def graph_follows(runner: PhaseRunner, exe, tg, feeds: dict, s: Settings) -> tuple[float, str | None]:
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


def replay_policy(exe, policy):
    """The policy a ``+graph`` column compiles with when the eager column's
    graph would not replay whole: ``cuda_graph`` on (autotune then picks, among
    its measured candidates, a capturable one wherever one is correct) for an
    autotuned policy one of whose compiled steps declares itself not capturable
    (FFT, Winograd, the bias gradient's cuBLAS ``method='gemv'``: such a step
    runs eagerly between the graphs, and on the H200 the fp32 ResNet-50 replay
    was slower than eager for it, 2026-12-02). None:
    the column replays the eager column's graph. No timing is repeated: the
    choice is made again from the cached measurements."""
    if not policy.autotune or policy.cuda_graph:
        return None
    if not any(getattr(st.ctx, "capture_blocker", None) for st in exe.steps):
        return None
    return attrs.evolve(policy, cuda_graph=True)


def changed_choices(eager_exe, replay_exe) -> dict[str, str]:
    """Step name -> ``'fft -> cudnn'`` for the steps whose implementation
    differs between the two compiles of one graph: the algorithm, or the
    variant of one rule (``'cuda[method=gemv] -> cuda'``: the bias gradient's
    cuBLAS variant does not capture either)."""
    before = {st.name: _choice(st) for st in eager_exe.steps}
    return {st.name: _change(before[st.name], _choice(st)) for st in replay_exe.steps
            if st.name in before and before[st.name] != _choice(st)}


def _choice(step) -> tuple[str, dict]:
    """The step's algorithm and options."""
    return step.op.algorithm, dict(step.op.option_dict)


def _change(old: tuple[str, dict], new: tuple[str, dict]) -> str:
    """``'fft -> cudnn[engine=3]'``, ``'cuda[method=gemv] -> cuda'``: each side
    labelled as autotune's rows are, without the options both sides share (the
    policy's ``precision``), which would only repeat themselves."""
    def label(alg, opts, other):
        return Candidate(alg, {k: v for k, v in opts.items() if other.get(k, object()) != v}).label
    return f"{label(*old, new[1])} -> {label(*new, old[1])}"


def recompile_note(changed: dict[str, str]) -> str:
    """The ``+graph`` record's note on a compile for the replay (:func:`changed_choices`)."""
    head = ("compiled again with cuda_graph (autotune picks a capturable candidate unless an uncapturable "
            "one saves more than a split of the replay costs): "
            f"{len(changed)} step{'' if len(changed) == 1 else 's'} changed")
    if not changed:
        return head
    shown = ", ".join(f"{name} ({how})" for name, how in list(changed.items())[:6])
    return f"{head}: {shown}" + (", ..." if len(changed) > 6 else "")


def graph_column(rec: dict, runner: PhaseRunner, tg, sched, na: dict, exe, ref, feeds: dict,
                  s: Settings, peak: dict | None, recompiled: dict | None = None) -> dict:
    """The ``<lowering>+graph`` record: ``rec``'s compiled graph, each phase
    replayed as CUDA graphs; per-layer times stay with the eager record. Two
    checks (the per-node check of the eager column holds: the same kernels
    run, or, after a compile for the replay, kernels autotune checked against
    the float64 reference as candidates of the same nodes): the replayed outputs end to end against the float64 reference
    (:func:`_graph_check`, catches unwritten or corrupted arrays) and the
    replay on a new input against the eager executor (:func:`_graph_follows`,
    catches a graph reading an array that is not the current one).
    ``recompiled``: the fields of a compile for the replay (:func:`replay_policy`:
    ``policy``, ``compile_s``, ``algorithms``, ``notes``), which replace the
    eager column's."""
    g = _graph_record(rec, "check")
    if recompiled:
        g.update({k: v for k, v in recompiled.items() if k != "notes"})
        g["notes"] += recompiled.get("notes", [])
    try:
        phases, summary = runner.time_graphed_phases(s.repeat, s.warmup)
        g["graph"] = summary
        step = graphed_step(runner, s.repeat)  # the phases' graphs back to back: the whole step
        if ref is not None:
            e2e = chk.end_to_end(ref.xp, [runner.slots[v.node] for v in exe.outputs], ref)
            passed, why = graph_check(rec["check"]["end_to_end"], e2e)
            follow, why_follow = graph_follows(runner, exe, tg, feeds, s)
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
        g["totals"] = phase_totals(g["times"])
        g["step"] = step
        g["flops"] = model_flops(tg)
        fill_throughput(g, peak)
        g["layers"] = layer_records(tg, sched, {}, na, exe.report)
    except Exception as e:  # the eager record stands; say why the replay did not
        g.update(error_fields(e, "CUDA-graph replay failed: "))
        for k in _TIMING_KEYS:
            g.pop(k, None)
        return g
    finally:
        runner.close_replays()
    g["notes"] += capture_notes(summary, rec.get("step"), g.get("step"))
    return g


def capture_notes(summary: dict, eager_step: dict | None, graph_step: dict | None) -> list[str]:
    """What a ``+graph`` record says of its capture: the totals, the captured and
    eager steps of each phase (``summary``: phase -> ``GraphReplay.summary()``),
    and, where the replayed whole step's median is above the eager column's,
    that the eager column is the faster choice and which steps kept the
    graphs apart (issue 16: ``+graph`` must never be slower than eager)."""
    steps = sum(v["steps"] for v in summary.values())
    captured = sum(v["captured_steps"] for v in summary.values())
    graphs = sum(v["graphs"] for v in summary.values())
    notes = [f"CUDA graphs: {captured} of {steps} steps captured in {graphs} graphs; "
             f"{steps - captured} run eagerly between them",
             "captured/eager steps per phase: " + "; ".join(
                 f"{p} {v['captured_steps']}/{v['eager_steps']}" for p, v in summary.items())]
    e, r = (eager_step or {}).get("median_ms"), (graph_step or {}).get("median_ms")
    if e and r and r > e:
        reasons = sorted({why for v in summary.values() for why in v["eager"].values()})
        notes.append(f"the replay ({r:.3f} ms) is slower than eager ({e:.3f} ms): use the eager column"
                     + (f"; steps kept out of the graphs because: {'; '.join(reasons[:3])}" if reasons else ""))
    return notes


#: Keys of an eager record that describe its own timing, not the compiled graph.
_TIMING_KEYS = ("times", "totals", "step", "tflops", "peak_fraction", "layers", "other_ms")


def _graph_record(rec: dict, *drop: str) -> dict:
    """The ``<lowering>+graph`` record's start: ``rec`` without its timing (and ``drop``)."""
    g = {k: v for k, v in rec.items() if k not in _TIMING_KEYS + drop}
    g.update(lowering=rec["lowering"] + "+graph", notes=list(rec["notes"]))
    return g


def graph_failed(rec: dict, e: BaseException, prefix: str) -> dict:
    """The ``+graph`` record of a replay that could not be built (the eager record stands)."""
    g = _graph_record(rec, "check")
    g.update(error_fields(e, prefix))
    return g


def graph_placeholder(rec: dict) -> dict:
    """The ``+graph`` record of a lowering whose eager column did not time
    (n/a, mismatch, error, skipped): not replayed, and why."""
    g = _graph_record(rec)
    status = rec["status"] if rec["status"] in ("n/a", "skipped") else "skipped"
    g.update(status=status,
             reason=f"not replayed: the eager column is {rec['status']}"
                    + (f" ({rec['reason']})" if rec.get("reason") else ""))
    return g


__all__ = ["GRAPH_CHECK_FACTOR", "GRAPH_CHECK_SLACK", "GRAPH_FOLLOW_TOL", "GRAPH_FOLLOW_TOL_DEFAULT",
           "graph_follow_tolerance", "graph_check", "graph_follows", "graph_column", "graph_placeholder",
           "capture_notes", "replay_policy", "changed_choices", "graph_failed", "recompile_note"]
