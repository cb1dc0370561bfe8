"""The whole training step timed as one loop, for every column.

The seed's protocol times forward, backward-data and backward-filter in
separate loops (:mod:`.protocol`), and PyTorch's backward is one autograd
pass, so the phase sums of opgraph and of a peer do not measure the same
thing: each loop starts from a drained device, and a CUDA-graph peer has no
phases at all. So every column also times the whole step (forward then
backward, every step of the training graph) in one loop of ``repeat`` calls
on its device's clock (device events on a GPU), and the ratios to the peers
(``vs torch``, ``vs best peer``: :mod:`.peer_column`) divide these times:

* opgraph (:func:`opgraph_step`): every scheduled step in order, as
  :meth:`protocol.PhaseRunner.run` runs a phase;
* opgraph ``+graph`` (:func:`graphed_step`): the phases' CUDA graphs
  (:mod:`opgraph.graph_replay`) replayed back to back in phase order, on
  their capture stream, with no synchronisation inside the loop;
* the PyTorch peers (:mod:`.peer_run`): forward and ``autograd.grad``, or
  one replay of the captured step.

The record (:func:`step_record`) gives the median and the spread: minimum,
maximum and the interquartile range of the calls.
"""

from __future__ import annotations

from typing import Callable

from .timer import Timer, Timing


def step_record(times_ms) -> dict:
    """``{"median_ms", "min_ms", "mean_ms", "q1_ms", "q3_ms", "iqr_ms", "max_ms",
    "times_ms"}`` of one loop's per-call milliseconds (:meth:`timer.Timing.as_dict`,
    quartiles by :func:`stability.spread`); ``iqr_ms`` is 0 for one call.

    Raises:
        ValueError: no times.
    """
    record = Timing(times_ms).as_dict()
    return {**record, "iqr_ms": record["iqr_ms"] or 0.0}


def time_step(timer: Timer, step: Callable[[], object], repeat: int, label: str = "step") -> dict:
    """:func:`step_record` of ``repeat`` calls of ``step`` on ``timer``."""
    return step_record(timer.measure(step, label=label, repeat=repeat))


def opgraph_step(runner, repeat: int) -> dict:
    """Every step of ``runner``'s schedule (a :class:`protocol.PhaseRunner`) in
    one loop of ``repeat`` calls."""
    steps = runner.sched.steps
    return time_step(runner.timer, lambda: runner.run(steps), repeat)


def graphed_step(runner, repeat: int) -> dict:
    """Each phase's CUDA graphs of ``runner`` (after
    :meth:`protocol.PhaseRunner.time_graphed_phases`, before its replays are
    closed) replayed back to back, one training step per call, in one loop of
    ``repeat`` calls on the capture stream."""
    replays = list(runner.replays.values())

    def one_step():
        for replay in replays:
            replay()

    with runner.graph_stream:
        return time_step(runner.timer, one_step, repeat, "step (CUDA graphs)")


__all__ = ["step_record", "time_step", "opgraph_step", "graphed_step"]
