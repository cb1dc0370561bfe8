"""Which step of a CUDA-graph replay disagrees with the eager executor on a new input.

    python scripts/graph_diag.py --model overfeat --precision tf32 --layout NHWC [--batch 128]

Builds the model's training graph as ``opgraph-bench --lowering auto`` does
(autotune decisions from ``OPGRAPH_CACHE``), runs the warm-up, builds the
replays of every phase (``PhaseRunner.graph_phases``), writes a new image into
the captured input array, replays, and compares every step's value with a
run of the same steps on the new image that keeps every value (eager, default
stream). Prints the first steps whose values differ, with their algorithm and
phase, and whether each runs inside a graph or eagerly.
"""

from __future__ import annotations

import argparse
import time

import cupy as cp
import numpy as np

import opgraph as og
from opgraph.graph_replay import capture_stream, release_cached
from opgraph.benchmarks import lowerings as lw
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import PHASES, PhaseRunner, random_feeds, schedule, training_graph
from opgraph.benchmarks.timer import make_timer
from opgraph.executable import run_step
from opgraph.op import abstract_of
from opgraph.passes.autotune import relative_error
from opgraph.passes.policy import LoweringPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--layout", default="NCHW")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--lowering", default="auto")
    ap.add_argument("--timed", action="store_true", help="run the timed replay loops before the check")
    ap.add_argument("--show", type=int, default=12)
    a = ap.parse_args()
    for key in a.model:
        t0 = time.perf_counter()
        model = build(key, **({"batch": a.batch} if a.batch else {}))
        tg = training_graph(model)
        base = LoweringPolicy(precision=a.precision, layout=a.layout.upper())
        lowering = lw.parse_lowerings(a.lowering)[0]
        exe = og.compile(tg.outputs, device="cuda", policy=lowering.policy(base, "cuda"))
        sched = schedule(exe, tg)
        phase_of = {st.node: p for p in PHASES for st in sched.phases[p]}
        feeds = {k: cp.asarray(v) for k, v in random_feeds(model).items()}
        timer = make_timer("cuda")
        runner = PhaseRunner(sched, exe.feed(feeds), timer)
        runner.warmup(2)
        if a.timed:
            runner.time_graphed_phases(3, 2)
        else:
            release_cached()
            stream = capture_stream()
            with stream:
                runner.graph_phases(stream)
                release_cached()
                runner.replay_all()
        eager_nodes = {}
        for p, r in runner.replays.items():
            for seg in r.segments:
                for st in seg.steps:
                    eager_nodes[st.node] = seg.graph is None
        name = model.input.name
        src = next(s.id for s in exe.sources if s.name == name)
        x = runner.slots[src]
        with runner.graph_stream:  # the replay stream does not wait for the default one
            new = -x.copy()
            x[...] = new
        runner.replay_all()
        keep = exe.feed({**feeds, name: new})
        for st in sched.steps:
            keep[st.node] = run_step(st, keep)
        cp.cuda.Device().synchronize()
        bad = []
        for st in sched.steps:
            err = relative_error(cp, runner.slots[st.node], keep[st.node])
            if not err <= 1e-3:
                bad.append((st, err))
        print(f"== {key} {a.precision} {a.layout} batch {model.batch} ({time.perf_counter() - t0:.0f} s): "
              f"{len(bad)} of {len(sched.steps)} steps differ")
        for st, err in bad[:a.show]:
            args = [sched_name(sched, i) for i in st.args]
            print(f"  {phase_of[st.node]:15s} {'eager' if eager_nodes.get(st.node) else 'graph'} "
                  f"{st.name:45s} {abstract_of(st.op).name}/{st.op.algorithm} err={err:.3g} args={args}")
        direct = exe(**{**feeds, name: new})  # what the benchmark's check compares with
        errs = [relative_error(cp, runner.slots[v.node], d) for v, d in zip(exe.outputs, direct)]
        print("  outputs against exe(...):", np.round(np.array(errs, dtype=float), 5).tolist()[:12])
        runner.close_replays()
        del runner, keep, exe
        cp.get_default_memory_pool().free_all_blocks()


def sched_name(sched, node) -> str:
    for st in sched.steps:
        if st.node == node:
            return st.name
    return f"source {node}"


if __name__ == "__main__":
    main()
