"""CUDA-graph replay of the benchmark's phases on the GPU (opgraph/graph_replay.py).

A replay must give what the eager executor gives, for the values it was
built with and, after the input changes in place, for new values: the
graphs read the arrays they captured, and eager steps between graphs (cuBLAS
calls) write into the arrays the next graph reads.
"""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.backends.cuda.cublas import capture_requirement
from opgraph.backends.device import cuda_status
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import PHASES, PhaseRunner, random_feeds, schedule, training_graph
from opgraph.benchmarks.timer import make_timer

GPU_OK, GPU_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_OK, reason=GPU_WHY)]

CASES = [("alexnet", {}, 1e-4), ("googlenet", {}, 1e-4),
         ("googlenet", {"precision": "tf32", "layout": "NHWC"}, 1e-3)]


@pytest.mark.parametrize("key,policy,tol", CASES, ids=["alexnet", "googlenet", "googlenet-tf32-nhwc"])
def test_replay_matches_the_executor_before_and_after_new_input(cp, relerr, replay_phases, key, policy, tol):
    model = build(key, batch=2)
    tg = training_graph(model)
    exe = og.compile(tg.outputs, device="cuda", policy=policy)
    feeds = {k: cp.asarray(v) for k, v in random_feeds(model, seed=1).items()}
    runner = PhaseRunner(schedule(exe, tg), exe.feed(feeds), make_timer("cuda"))
    runner.warmup(1)
    outputs = [v.node for v in exe.outputs]
    replays, stream = replay_phases(runner)
    built = [cp.asnumpy(runner.slots[n]) for n in outputs]
    summary = {p: r.summary() for p, r in replays.items()}
    assert all(s["graphs"] >= 1 for s in summary.values()), summary
    eager_why = [w for s in summary.values() for w in s["eager"].values()]
    missing = capture_requirement()  # the classifier's products capture on our own cuBLAS handle
    assert (not eager_why) if missing is None else any("nvmath" in w for w in eager_why), eager_why
    for got, want in zip(built, exe(**feeds)):
        assert relerr(got, cp.asnumpy(want)) < tol

    x = runner.slots[exe.sources[[s.name for s in exe.sources].index(model.input.name)].id]
    new = cp.asarray(np.random.default_rng(7).standard_normal(x.shape, dtype=np.float32))
    with stream:
        x[...] = new  # in place (the graphs captured this array), in stream order
        for p in PHASES:
            replays[p]()
        stream.synchronize()
        replayed = [cp.asnumpy(runner.slots[n]) for n in outputs]
    feeds[model.input.name] = new
    for got, want in zip(replayed, exe(**feeds)):
        assert relerr(got, cp.asnumpy(want)) < tol
    assert relerr(replayed[0], built[0]) > 1e-2  # the output did follow the new input


def test_timed_replay_reports_every_phase(cp):
    model = build("alexnet", batch=2)
    tg = training_graph(model)
    exe = og.compile(tg.outputs, device="cuda")
    feeds = {k: cp.asarray(v) for k, v in random_feeds(model).items()}
    runner = PhaseRunner(schedule(exe, tg), exe.feed(feeds), make_timer("cuda"))
    runner.warmup(1)
    timings, summary = runner.time_graphed_phases(repeat=3, warmup=1)
    # the replays are closed; the values they left must still be readable and right
    for got, want in zip([runner.slots[v.node] for v in exe.outputs], exe(**feeds)):
        assert float(cp.linalg.norm(got - want) / cp.linalg.norm(want)) < 1e-4
    assert set(timings) == set(PHASES) and all(len(t.times_ms) == 3 for t in timings.values())
    assert all(t.median_ms > 0 for t in timings.values())
    assert sum(s["captured_steps"] for s in summary.values()) > sum(s["eager_steps"]
                                                                      for s in summary.values())


def test_replayed_ms_per_call_times_the_captured_calls():
    """The kernel benchmarks' clock: ``fn`` runs once eagerly and ``calls`` times into the
    capture (never during the replays), and a copy of 256 MiB per call takes at least the time
    the H200's memory allows (under 5 TB/s both ways) and well under a millisecond."""
    import cupy as cp
    from opgraph.benchmarks.timer import replayed_ms_per_call
    src = cp.ones(2 ** 26, dtype=cp.float32)
    dst = cp.empty_like(src)
    seen = []

    def copy():
        seen.append(1)
        dst[...] = src

    ms = replayed_ms_per_call(copy, 4, warmup=2, repeat=5)
    assert len(seen) == 1 + 4
    assert 2 * src.nbytes / 5e12 * 1e3 <= ms < 1.0
    assert bool((dst == 1).all())
