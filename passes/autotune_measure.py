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

A node whose output the zero-copy plan will put in its slice of a concat's
buffer (``zero_copy.predict_homes``: ``home``) is checked and timed in the
form it will run, into a strided view of a scratch buffer of the concat's
shape and layout: a rule that writes strided views of the output's layout
(``Rule.writes_strided``) as ``kernel(..., out=view)`` and, as a second
candidate of the same options plus ``strided_out: False``
(:func:`out_forms`), as its dense result copied into the view
(``buffer_views.copy_into``); any other rule dense plus the copy, as the plan
runs it. The faster form wins like any candidate; the plan honours the
option (``zero_copy.plan_views``: ``copied_in``). On the H200, cuDNN's
strided engines ran GoogLeNet's inception convolutions 1.5-3x their dense
time, while the copy of those slices takes ~0.02 ms.
"""

from __future__ import annotations

import math
import statistics

from opgraph.backends.registry import KernelContext, Rule
from opgraph.buffer_views import copy_into
from opgraph.types import numpy_dtype

from .autotune_accuracy import filled_error, poisoned_copy, relative_error, tolerance
from .autotune_clock import NodeClock
from .autotune_inputs import InputPool, consistent_inputs
from .autotune_inputs import reference_output as _reference
from .base import PassContext
from .candidates import rule_workspace
from .report import Candidate
from .zero_copy import STRIDED_OUT, Home, kernel_options

#: A candidate whose first timed run is this many times the best median so far
#: is recorded with that one run and not timed further.
PRUNE_FACTOR = 3.0


def strided_form(rule: Rule, opts, layout: str | None) -> bool:
    """Whether candidate ``(rule, opts)`` of a homed node writes its slice
    itself (``out=``): its rule writes strided views of ``layout`` and its
    options do not say ``strided_out: False``."""
    return rule.writes_strided(layout) and opts.get(STRIDED_OUT, True) is not False


def out_forms(cands, home: Home | None, layout: str | None) -> list:
    """``cands`` (``(rule, options)`` pairs, policy order) in every form a node
    whose output lives at ``home`` (None: its own buffer; ``cands`` as given)
    may run: each rule that writes strided views of ``layout`` twice, as is
    (the strided write) and with ``strided_out: False`` (dense, then the
    copy into its slice); any other rule once (the plan copies it in)."""
    if home is None:
        return list(cands)
    out = []
    for rule, opts in cands:
        out.append((rule, opts))
        if rule.writes_strided(layout):
            out.append((rule, {**opts, STRIDED_OUT: False}))
    return out


def _scratch(home: Home, out_type, xp):
    """``(view, root)``: ``home``'s slice of a new buffer of the concat's shape,
    layout and ``out_type``'s dtype (the strides the step will write through),
    and that whole buffer as dense memory (:func:`_poison` fills it)."""
    slots: dict = {}
    view = home.region(numpy_dtype(out_type.dtype)).array(slots, xp)
    root = slots[home.root]
    channels_last = home.layout == "NHWC" and len(home.shape) == 4
    return view, (root.transpose(0, 2, 3, 1) if channels_last else root)


def _poison(root) -> None:
    """Every byte of ``root`` (C-contiguous) set to 0xFF, a NaN in every float
    format: a strided kernel that leaves part of its slice unwritten (or
    writes elsewhere) fails the check instead of passing on what an earlier
    candidate left there."""
    root.view("uint8").fill(255)


def _with_filled_copies(op, arrays: list) -> list:
    """``arrays`` with each input ``op`` fills (``Op.fills``) replaced by a
    :func:`~.autotune_accuracy.poisoned_copy`: the candidate writes the copy, so the shared
    input stays the reference's value, and what it leaves unwritten fails the check."""
    return [poisoned_copy(a) if k in op.fills else a for k, a in enumerate(arrays)]


def measure_candidates(op, types, cands, s, ctx: PassContext, timer, view, out_type, run_in,
                       clock: NodeClock, pool: InputPool,
                       home: Home | None = None) -> tuple[list[Candidate], list[Candidate]]:
    """Check and time each candidate of ``cands`` (``(rule, options)`` pairs, in
    policy order) on ``view``, the node of ``op`` with input ``types``; returns the
    report rows (the survey ``s``'s declined rules too) and those of them timed in
    full (not pruned). ``out_type`` and ``run_in`` are the node's output and
    input types as they run (:func:`opgraph.run_types.run_types`: ``ctx.dtype``
    applied, batch statistics kept in float32); inputs are drawn in ``run_in``.
    A candidate whose output dtype is not ``out_type``'s is ``wrong``: a
    float32 result in a bf16 graph would turn every later value into float32.
    ``clock`` gets the seconds of each part (``passes/autotune_clock.py``);
    ``pool`` draws the inputs (``autotune_inputs.InputPool``). ``home``: where
    the zero-copy plan will put the output (``zero_copy.predict_homes``), or
    None; then each candidate runs into that slice of a scratch buffer, by
    its form (:func:`strided_form`; ``cands`` already holds both forms:
    :func:`out_forms`), and its check reads the slice."""
    xp, policy = ctx.xp, ctx.policy
    want = out_type.dtype
    with clock.part("inputs", settle=True):  # layout transposes may still be queued
        # e.g. batch statistics that are x's own (autotune_inputs)
        arrays = consistent_inputs(view, pool.inputs(run_in), xp, ctx.device)
    with clock.part("reference", settle=True):  # float64 kernels, else billed to the first check
        try:
            # a slot's own step writes nothing: the node that fills it checks its value
            ref = None if op.filled_by_reader else _reference(op, arrays, xp, ctx.device, out_type)
        except Exception:
            ref = None
        unverified = ("filled by the node that reads it, and checked there" if op.filled_by_reader
                      else "no reference rule for this op")
        # the concat's buffer the output will live in: its slice is where candidates write
        target, root = _scratch(home, out_type, xp) if home is not None else (None, None)
    dtype = str(arrays[0].dtype) if arrays else "float32"
    rows, timed, best = [], [], None  # best: fastest fully timed median so far, seconds
    for rule, opts in cands:
        c = Candidate(rule.algorithm, dict(opts), workspace=rule_workspace(rule, op, types, opts),
                      tolerance=tolerance(rule.algorithm, policy.precision, dtype))
        rows.append(c)
        if policy.workspace_limit is not None and c.workspace > policy.workspace_limit:
            c.status, c.reason = "over budget", f"workspace > limit {policy.workspace_limit:,d} B"
            continue
        kctx = KernelContext(xp, ctx.device, kernel_options(opts), out_type)  # strided_out: the plan's
        into = {"out": target} if target is not None and strided_form(rule, opts, out_type.layout) else {}
        clock.checked += 1
        # settle: relative_error waits for the kernel; a failed, wrong-dtype or
        # unverified one has nobody waiting, and its run would be billed to timing
        with clock.part("check", settle=True):
            try:
                if root is not None:
                    _poison(root)
                called = _with_filled_copies(op, arrays)
                out = rule.kernel(kctx, op, *called, **into)
                got = getattr(getattr(out, "dtype", None), "name", None)
                if got is not None and got != want:
                    c.status, c.reason = "wrong", f"returns {got}, the node's type is {want}"
                    continue
                if target is not None:  # the check reads the slice, as the concat's readers will
                    if not into:
                        copy_into(target, out)
                    out = target
            except Exception as e:  # includes device out-of-memory errors
                c.status, c.reason = "failed", f"{type(e).__name__}: {e}"
                continue
            if ref is not None:
                # a filled input's error too (Op.fills): it is a second result
                c.rel_error = max([relative_error(xp, out, ref)]
                                  + [filled_error(xp, called[k], arrays[k]) for k in op.fills],
                                  key=lambda e: math.inf if math.isnan(e) else e)
                if not c.rel_error <= c.tolerance:  # NaN fails too
                    c.status, c.reason = "wrong", f"relative error {c.rel_error:.2e} > {c.tolerance:.0e}"
                    continue
            else:
                c.status, c.reason = "unverified", unverified
        if target is not None and not into:  # the dense result and its copy into the slice
            def run():
                copy_into(target, rule.kernel(kctx, op, *called))
        else:
            run = lambda: rule.kernel(kctx, op, *called, **into)  # noqa: E731
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


__all__ = ["PRUNE_FACTOR", "measure_candidates", "out_forms", "strided_form"]
