"""Which measured candidate wins a node: the fastest correct one, then the tie-breaks.

Steps 4 and 5 of the meta-optimizer (``passes/autotune.py``) as one pure
function of the measured rows, :func:`choose`: the fastest correct median,
unless a near-fastest row needs less workspace (``workspace_tolerance``), a
row that cannot be captured into a CUDA graph must beat the capturable ones
by :data:`EAGER_STEP_MS` (``cuda_graph``; :data:`CaptureBlocker`,
:func:`declared_blocker`), or the row's workspace raises the planned memory
peak (``peak_tolerance``, ``passes/autotune_memory.py``). Separate from the
measuring (``autotune_measure``) because the same choice is made again,
without running anything, from the rows a cache entry holds
(``autotune_reuse.rechoose``) and by the memory-aware re-choice once every
node is chosen.
"""

from __future__ import annotations

from typing import Callable, Mapping

from .autotune_memory import StepRoom, fit_headroom
from .report import Candidate, format_size
from .zero_copy import kernel_options

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


def declared_blocker(applicable) -> CaptureBlocker:
    """The :data:`CaptureBlocker` of a replayed step: what the applicable
    candidate's rule declares for those options (``Rule.declared_capture_blocker``:
    the rule's own reason, or its variant's); None for an algorithm that no
    longer applies (a cached choice of one is re-tuned anyway)."""
    rules = {e.rule.algorithm: e.rule for e in applicable}

    def blocker(algorithm: str, options: Mapping) -> str | None:
        rule = rules.get(algorithm)
        # strided_out is the zero-copy plan's: a variant's blocker reads the kernel's options
        return rule.declared_capture_blocker(kernel_options(options)) if rule is not None else None
    return blocker


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
    graphs; :func:`declared_blocker`) says why a row (its algorithm and
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


__all__ = ["CaptureBlocker", "EAGER_STEP_MS", "captures_all", "declared_blocker", "choose"]
