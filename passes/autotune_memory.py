"""The memory side of autotune's choice: a node's workspace against the planned peak.

The memory pass plans the schedule's peak as the maximum over its steps of
the bytes each holds: the activations live during it, a result it copies
into its slice of a concat, and its kernel's workspace
(``passes/memory.py``, :class:`~passes.memory.StepBytes`). On the H200,
AlexNet's stem backward-filter on ``unfold`` took 544 MiB of scratch where
the activations peak at 525 MiB (872 MiB planned); its ``chunks=4`` variant
needs 136 MiB and runs 14-16 % slower.

Once every node is chosen, the autotune pass chooses again, from its measured
rows, the nodes whose steps raise the planned peak above the lowest one the
graph can reach (:func:`reachable_peak`: the activations' peak, every step
autotune may not change as it is, and every step it may change with the least
workspace among its rows within ``(1 + policy.peak_tolerance) x`` its fastest).
Such a node (``passes.autotune_choice.choose`` given its :class:`StepRoom`) gets,
through :func:`fit_headroom`, the fastest correct candidate timed in full,
within that tolerance, whose workspace keeps its step under that peak. A
step that raises the peak by less than :data:`PEAK_SLACK` of it keeps its
choice: a few KiB are not worth a slower kernel. ``peak_tolerance = 0``
keeps the time-based choice.
"""
from __future__ import annotations

import attrs

from .memory import StepBytes
from .report import Candidate, format_size

#: a step whose planned bytes exceed the reachable peak by less than this
#: fraction of it keeps its time-based choice
PEAK_SLACK = 0.01


@attrs.frozen
class StepRoom:
    """The memory around one step of the schedule, in bytes.

    Attributes:
        held: what the step holds besides its kernel's workspace (the
            activations live then, and a result it copies into a concat slice:
            :class:`passes.memory.StepBytes`).
        ceiling: the lowest planned peak the graph can reach
            (:func:`reachable_peak`).
        activation_peak: the schedule's activation peak (for the reasons).
    """

    held: int
    ceiling: int
    activation_peak: int

    @property
    def headroom(self) -> int:
        """The workspace bytes the step may take without raising the planned
        peak above :attr:`ceiling`."""
        return self.ceiling - self.held

    def raises(self, workspace: int) -> bool:
        """Whether ``workspace`` sets the step's planned bytes above the
        ceiling by more than :data:`PEAK_SLACK` of it."""
        return self.held + workspace - self.ceiling > PEAK_SLACK * self.ceiling


def held_bytes(step: StepBytes) -> int:
    """A step's bytes besides its kernel's workspace."""
    return step.live + step.copied


def reachable_peak(steps: dict[int, StepBytes], least: dict[int, int]) -> int:
    """The lowest planned peak the re-choice can reach, in bytes: the maximum of
    the activations' peak and of each step's planned bytes, with ``least``
    (node id -> the least workspace its rows offer within the tolerance) for
    the steps autotune may choose again, their present workspace for the
    others (forced, untimed, hand-edited)."""
    return max([max((s.live for s in steps.values()), default=0)]
               + [held_bytes(s) + least.get(n, s.workspace) for n, s in steps.items()])


def fit_headroom(near: list[Candidate], fastest: Candidate, chosen: Candidate, room: StepRoom,
                 tolerance: float) -> Candidate:
    """The row that keeps a step's planned bytes lowest within ``tolerance``,
    for a step whose ``chosen`` row's workspace is above ``room.headroom``.

    ``near``: the correct rows timed in full whose median is within ``(1 +
    tolerance) x`` that of ``fastest``, the fastest correct row (itself
    included). The fastest of those whose workspace fits the headroom wins
    (ties: row order); when none fits, the one with the least workspace
    (ties: the faster), unless it needs no less than ``chosen``, which then
    stays. A row that replaces ``chosen`` says why in its ``reason``
    (``within 20 % of the fastest unfold (0.441 vs 0.381 ms), keeps its step
    under the reachable peak of 525.2 MiB (the activations': 525.2 MiB)
    instead of 871.7 MiB (peak_tolerance)``), and ``chosen`` why it lost.
    Statuses are the caller's (:func:`passes.autotune_choice.choose` marks the winner).
    """
    def workspace(c: Candidate) -> int:
        return c.workspace or 0

    raised = room.held + workspace(chosen)  # the planned bytes this step sets with chosen
    sizes = (raised, room.ceiling, room.activation_peak, workspace(chosen),  # one unit per sentence
             *(room.held + workspace(c) for c in near))

    def size(nbytes: int) -> str:
        return format_size(nbytes, *sizes)
    ceiling = f"{size(room.ceiling)} (the activations': {size(room.activation_peak)})"
    fits = [c for c in near if workspace(c) <= room.headroom]
    if fits:
        best = min(fits, key=lambda c: c.time_ms)
        gain = f"keeps its step under the reachable peak of {ceiling} instead of {size(raised)}"
        beaten = f"{best.label} is within {100 * tolerance:g} % of the fastest and fits"
    else:
        best = min(near, key=lambda c: (workspace(c), c.time_ms))
        if workspace(best) >= workspace(chosen):
            return chosen
        lowered = size(room.held + workspace(best))
        gain = f"lowers its step to {lowered} from {size(raised)} (the reachable peak: {ceiling})"
        beaten = f"{best.label} is within {100 * tolerance:g} % of the fastest with less"
    best.reason = "; ".join(filter(None, [
        best.reason, f"within {100 * tolerance:g} % of the fastest {fastest.label} ({best.time_ms:.3f} vs "
                     f"{fastest.time_ms:.3f} ms), {gain} (peak_tolerance)"]))
    chosen.reason = "; ".join(filter(None, [
        chosen.reason, f"its {size(workspace(chosen))} of workspace raises the planned peak to "
                       f"{size(raised)}, above the reachable {ceiling}; {beaten}"]))
    return best


__all__ = ["StepRoom", "PEAK_SLACK", "held_bytes", "reachable_peak", "fit_headroom"]
