"""The memory side of autotune's choice: a node's workspace against the activations' peak.

The memory pass plans the schedule's peak as the maximum over its steps of
the activation bytes live during the step plus the step's workspace
(``passes/memory.py``). A step's *headroom* is the activations' peak (the
maximum of the live bytes alone) minus the bytes live during it: a workspace
up to the headroom raises nothing, a larger one sets a planned peak above the
activations' own. On the H200, AlexNet's stem backward-filter on ``unfold``
takes 544 MiB of scratch where the activations peak at 328 MiB; its
``chunks`` variants need 4x and 16x less and may run a few per cent slower.

Once every node is chosen, the autotune pass chooses again, from its measured
rows, each node whose workspace is larger than its headroom
(``passes.autotune.choose`` given the node's :class:`StepRoom`):
:func:`fit_headroom` gives it the fastest correct candidate timed in full
whose workspace fits the headroom and whose median is within
``(1 + policy.peak_tolerance) x`` the fastest's; when none fits, the one with
the least workspace within that tolerance, if it needs less than the time-based
choice. ``peak_tolerance = 0`` keeps the time-based choice.
"""
from __future__ import annotations

import attrs

from opgraph.executable import InplacePlan
from opgraph.graph import Graph

from .memory import step_live_bytes
from .report import Candidate, format_size


@attrs.frozen
class StepRoom:
    """The memory around one step of the schedule, in bytes.

    Attributes:
        live: activation bytes live during the step, its workspace aside
            (:func:`passes.memory.step_live_bytes`).
        activation_peak: the schedule's activation peak (the maximum of
            ``live`` over its steps).
    """

    live: int
    activation_peak: int

    @property
    def headroom(self) -> int:
        """The workspace bytes the step may take without raising the planned
        peak above the activations' peak."""
        return self.activation_peak - self.live


def step_rooms(graph: Graph, outputs, dtype: str | None, plan: InplacePlan) -> dict[int, StepRoom]:
    """Node id -> :class:`StepRoom` of each step of ``outputs``' schedule that
    is not a source, under the in-place and zero-copy ``plan``
    (``passes.memory.plan_inplace``) and compile's ``dtype`` (None: as declared)."""
    live = step_live_bytes(graph, outputs, dtype, plan)
    peak = max(live.values(), default=0)
    return {n: StepRoom(b, peak) for n, b in live.items()}


def fit_headroom(near: list[Candidate], fastest: Candidate, chosen: Candidate, room: StepRoom,
                 tolerance: float) -> Candidate:
    """The row that keeps a step's planned peak lowest within ``tolerance``,
    for a step whose ``chosen`` row's workspace is above ``room.headroom``.

    ``near``: the correct rows timed in full whose median is within ``(1 +
    tolerance) x`` that of ``fastest``, the fastest correct row (itself
    included). The fastest of those whose workspace fits the headroom wins
    (ties: row order); when none fits, the one with the least workspace
    (ties: the faster), unless it needs no less than ``chosen``, which then
    stays. A row that replaces ``chosen`` says why in its ``reason``
    (``within 10 % of the fastest unfold (0.392 vs 0.383 ms), keeps the
    planned peak at the activations' 328.0 MiB instead of 872.0 MiB
    (peak_tolerance)``), and ``chosen`` why it lost. Statuses are the caller's
    (:func:`passes.autotune.choose` marks the winner).
    """
    def workspace(c: Candidate) -> int:
        return c.workspace or 0

    raised = room.live + workspace(chosen)  # the planned peak this step sets with chosen
    activations = format_size(room.activation_peak)
    fits = [c for c in near if workspace(c) <= room.headroom]
    if fits:
        best = min(fits, key=lambda c: c.time_ms)
        gain = f"keeps the planned peak at the activations' {activations} instead of {format_size(raised)}"
        beaten = f"{best.label} is within {100 * tolerance:g} % of the fastest and fits"
    else:
        best = min(near, key=lambda c: (workspace(c), c.time_ms))
        if workspace(best) >= workspace(chosen):
            return chosen
        lowered = format_size(room.live + workspace(best))
        gain = f"lowers the planned peak to {lowered} from {format_size(raised)} (the activations': {activations})"
        beaten = f"{best.label} is within {100 * tolerance:g} % of the fastest with less"
    best.reason = "; ".join(filter(None, [
        best.reason, f"within {100 * tolerance:g} % of the fastest {fastest.label} ({best.time_ms:.3f} vs "
                     f"{fastest.time_ms:.3f} ms), {gain} (peak_tolerance)"]))
    chosen.reason = "; ".join(filter(None, [
        chosen.reason, f"its {format_size(workspace(chosen))} of workspace raises the planned peak to "
                       f"{format_size(raised)}, above the activations' {activations}; {beaten}"]))
    return best


__all__ = ["StepRoom", "step_rooms", "fit_headroom"]
