"""The whole training step timed as one loop (:mod:`opgraph.benchmarks.whole_step`):
its statistics, and what one call runs for opgraph eager and for its CUDA-graph replay."""

from __future__ import annotations

import types

import pytest

from opgraph.benchmarks.timer import CpuTimer
from opgraph.benchmarks.whole_step import graphed_step, opgraph_step, step_record


def test_step_record_median_and_spread():
    r = step_record([4.0, 1.0, 10.0, 2.0, 3.0])
    assert (r["median_ms"], r["min_ms"], r["max_ms"], r["mean_ms"]) == (3.0, 1.0, 10.0, 4.0)
    assert r["iqr_ms"] == pytest.approx(4.0 - 2.0)  # inclusive quartiles of 1, 2, 3, 4, 10
    assert r["times_ms"] == [4.0, 1.0, 10.0, 2.0, 3.0]
    assert step_record([2.5])["iqr_ms"] == 0
    with pytest.raises(ValueError):
        step_record([])


def test_one_opgraph_step_runs_every_step_of_every_phase_once():
    ran = []
    sched = types.SimpleNamespace(steps=("fwd1", "fwd2", "dgrad", "wgrad"))
    runner = types.SimpleNamespace(sched=sched, timer=CpuTimer(), run=lambda steps: ran.append(tuple(steps)))
    r = opgraph_step(runner, 3)
    assert len(r["times_ms"]) == 3 and ran == [sched.steps] * 3


class Stream:
    def __init__(self):
        self.inside = False

    def __enter__(self):
        self.inside = True

    def __exit__(self, *exc):
        self.inside = False


def test_one_graphed_step_replays_the_phases_back_to_back_on_their_stream():
    stream, ran = Stream(), []

    def replay(phase):
        def call():
            assert stream.inside  # launched on the capture stream
            ran.append(phase)
        return call

    phases = ("forward", "backward_data", "backward_filter")
    runner = types.SimpleNamespace(replays={p: replay(p) for p in phases}, graph_stream=stream, timer=CpuTimer())
    r = graphed_step(runner, 2)
    assert len(r["times_ms"]) == 2 and ran == list(phases) * 2 and not stream.inside
