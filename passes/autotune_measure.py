"""One node's candidates measured: each checked against the float64 reference, then timed.

Steps 2 and 3 of the meta-optimizer (``passes/autotune.py``), for one node
whose cache holds no usable decision: draw the inputs (``autotune_inputs``),
compute the reference output once, run each candidate once and check its
output (dtype, then :func:`~passes.autotune_accuracy.relative_error` within
:func:`~passes.autotune_accuracy.tolerance`; a raising kernel is ``failed``,
a workspace above ``policy.workspace_limit`` is ``over budget``), then time
the rest with the pass's timer, pruning a candidate whose first timed run is
already :data:`PRUNE_FACTOR` x the best median so far. The rows it returns
are what the cache stores and what ``autotune_choice.choose`` decides from:
measuring and choosing are separate so that a cached decision is chosen again
without running anything.
"""

from __future__ import annotations

import math
import statistics

from opgraph.backends.registry import KernelContext

from .autotune_accuracy import relative_error, tolerance
from .autotune_clock import NodeClock
from .autotune_inputs import InputPool, consistent_inputs
from .autotune_inputs import reference_output as _reference
from .base import PassContext
from .candidates import rule_workspace
from .report import Candidate

#: A candidate whose first timed run is this many times the best median so far
#: is recorded with that one run and not timed further.
PRUNE_FACTOR = 3.0


def measure_candidates(op, types, cands, s, ctx: PassContext, timer, view, out_type, run_in,
                       clock: NodeClock, pool: InputPool) -> tuple[list[Candidate], list[Candidate]]:
    """Check and time each candidate of ``cands`` (``(rule, options)`` pairs, in
    policy order) on ``view``, the node of ``op`` with input ``types``; returns the
    report rows (the survey ``s``'s declined rules too) and those of them timed in
    full (not pruned). ``out_type`` and ``run_in`` are the node's output and
    input types as they run (:func:`opgraph.run_types.run_types`: ``ctx.dtype``
    applied, batch statistics kept in float32); inputs are drawn in ``run_in``.
    A candidate whose output dtype is not ``out_type``'s is ``wrong``: a
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


__all__ = ["PRUNE_FACTOR", "measure_candidates"]
