"""Whether a cached decision can be reused, and the choice made again from its rows.

A cache entry (``passes/autotune_cache.py``) holds a node's candidates as
they were measured, tagged :data:`RECHOOSE_VERSION`: the autotune pass reuses
it without running anything, choosing the winner again from those rows under
the current policy (:func:`rechoose`, through ``autotune_choice.choose``),
so changing ``workspace_tolerance`` or ``cuda_graph`` needs no re-tuning.
Before that it asks whether the entry can decide at all: rows with a time
that is no time, or that contradict themselves (a status unknown or missing;
a correct one whose own rel_error is above its own tolerance, or NaN:
:func:`entry_problem`), or options that no longer name one
of the rule's variants for the node (:func:`refused_options`: a hand-edited
Winograd ``tile = 7`` would raise on every run) send the node back to be
measured. Separate from the cache file's reading and writing, which knows
nothing of candidates, rules or choices.
"""

from __future__ import annotations

import math

from .autotune_choice import CaptureBlocker, captures_all, choose
from .candidates import ENGINE_LIMIT_TAG, rule_variants
from .report import STATUSES, Candidate
from .zero_copy import STRIDED_OUT

#: the statuses of a row that may be chosen (``chosen``: entries written before
#: :data:`RECHOOSE_VERSION` kept the winner's mark)
CORRECT = ("ok", "unverified", "chosen")

#: Cache entries written with this tag hold their rows as measured, before any
#: choice (every check of :func:`~passes.autotune_measure.measure_candidates`
#: applied, the output dtype included), so :func:`rechoose` may decide again
#: from them.
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
    options: its rows were not all checked as today's are. ``entry`` is one
    :func:`entry_problem` passed: its rows' statuses, errors and times are
    trusted here (a row without a status would read as ``ok``)."""
    if entry.get("rechoose") != RECHOOSE_VERSION:
        rows = [Candidate.from_dict(c) for c in entry.get("candidates", [])]
        return rows, entry.get("algorithm"), dict(entry.get("options", {}))
    rows, timed = measured_rows(entry.get("candidates", []))
    best = choose(rows, timed, workspace_tolerance, capture_blocker)
    if best is None:
        return rows, entry.get("algorithm"), dict(entry.get("options", {}))
    return rows, best.algorithm, dict(best.options)


def entry_problem(entry: dict) -> str | None:
    """Why a cache entry's rows cannot decide, or None: a row that contradicts
    itself (:func:`row_problems`: a hand edit, ``time_ms: -1e9`` or an ``ok``
    row with ``rel_error: 5``, would win or be trusted), or, in an entry
    :func:`rechoose` decides from, a correct row without a time or no correct
    row (the tuner writes neither: it times every correct candidate and
    raises when none is correct). Every defective row's problems are said,
    ``; ``-joined. The entry's shape (JSON types) is
    ``autotune_cache.entry_defect``'s, checked when the file is read."""
    rows = entry.get("candidates", [])
    problems = [p for row in rows for p in row_problems(row)]
    if problems:
        return "; ".join(problems)
    correct = [row for row in rows if row.get("status") in CORRECT]
    if entry.get("rechoose") == RECHOOSE_VERSION:
        untimed = next((row for row in correct if row.get("time_ms") is None), None)
        if untimed is not None:  # choose compares the correct rows' times
            return (f"row {_row_label(untimed)!r} is {untimed.get('status')} without a time_ms "
                    "(the tuner times every correct row)")
    if entry.get("rechoose") == RECHOOSE_VERSION and rows and not correct:
        return "no row is correct (every row's status is " + ", ".join(
            sorted({str(row.get("status")) for row in rows})) + ")"
    return None


def row_problems(row: dict) -> list[str]:
    """What makes one cached candidate row (of the shape ``entry_defect``
    accepts) contradict itself, each naming the row and the field, or []:

    * a ``time_ms`` / ``min_ms`` that is not a finite number >= 0;
    * no ``status``, or one not of :data:`~passes.report.STATUSES` (the tuner
      writes one of them on every row; a missing one would read as ``ok``);
    * a correct status (:data:`CORRECT`) with its own ``rel_error`` above its
      own ``tolerance``, or NaN (the tuner marks such a row ``wrong``).

    A time of 0 is a time: a step that does no work (a zero-copy view) or
    one shorter than the clock's resolution measures 0, the tuner writes it
    so, and a check refusing it had such a node re-tuned, with a warning, at
    every compile."""
    name = repr(_row_label(row))
    out = []
    for field in ("time_ms", "min_ms"):
        t = row.get(field)
        if t is not None and not (isinstance(t, (int, float)) and not isinstance(t, bool)
                                  and math.isfinite(t) and t >= 0):
            out.append(f"row {name} has {field} {t!r}, not a finite time >= 0")
    if "status" not in row:
        return out + [f"row {name} has no status (every row the tuner writes has one: {', '.join(STATUSES)})"]
    status = row["status"]
    if status not in STATUSES:
        return out + [f"row {name} has status {status!r}, not one of {', '.join(STATUSES)}"]
    if status not in CORRECT:
        return out
    error, tol = row.get("rel_error"), row.get("tolerance")
    if error is not None and math.isnan(error):
        out.append(f"row {name} is {status} but its rel_error is NaN (the tuner marks such a row wrong)")
    elif error is not None and tol is not None and not error <= tol:
        out.append(f"row {name} is {status} but its rel_error {error:g} is above its tolerance {tol:g} "
                   "(the tuner marks such a row wrong)")
    return out


def _row_label(row: dict) -> str:
    """``'winograd[tile=2]'``: a cached row as the report names it (variants of
    one algorithm differ by their options)."""
    opts = row.get("options")
    return Candidate(str(row.get("algorithm")), opts if isinstance(opts, dict) else {}).label


def _same_options(a: dict, b: dict) -> bool:
    """Equal options of equal types: a hand-edited ``chunks = 2.0`` equals ``2`` in Python, and the
    kernel that takes an int refuses it on every call (review)."""
    return a == b and all(type(a[k]) is type(b[k]) for k in a)


def refused_options(entry, cached: dict, op, types, device, engine_limit: int | None = None,
                    strided_forms: bool = False) -> str | None:
    """Why a cached decision's options cannot run the node (``entry``: the
    applicable rule of the cached algorithm with the policy's options), or
    None. Its options must be the policy's plus one of the rule's variants for
    this node, as :func:`~passes.autotune_measure.measure_candidates` would
    have timed them: a hand-edited Winograd ``tile = 7`` is none, and its
    kernel would raise. A
    cuDNN engine (rules tagged ``variants:engine_limit``) is checked by
    building its plan alone: listing the variants would build every plan of
    the node again, the cost the cache is there to save. ``strided_out:
    False`` (``zero_copy.STRIDED_OUT``) is an option only where
    ``strided_forms`` (the node's output is predicted in a concat's buffer
    and the rule writes strided views of its layout:
    ``autotune_measure.out_forms``); anywhere else the plan would ignore it."""
    if STRIDED_OUT in cached:
        label = f"cached option {STRIDED_OUT}={cached[STRIDED_OUT]!r} of {entry.rule.algorithm}"
        if not strided_forms:
            return (f"{label}: this node's output is not written into a concat's buffer by a rule that writes "
                    f"strided views, so the zero-copy plan has no {STRIDED_OUT} choice to make here")
        if cached[STRIDED_OUT] is not False:
            return f"{label}: the one value it takes is false (write dense, then copy into the concat's slice)"
        cached = {k: v for k, v in cached.items() if k != STRIDED_OUT}
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
    if any(_same_options(chosen, a) for a in allowed):
        return None
    return (f"cached options {cached} of {entry.rule.algorithm} are not among its variants for this "
            f"node ({', '.join(map(str, allowed))})")


__all__ = ["RECHOOSE_VERSION", "CORRECT", "measured_rows", "rechoose", "entry_problem", "row_problems",
           "refused_options"]
