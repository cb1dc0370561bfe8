"""fp32 ResNet-50 NHWC backward-data replay (53.5 ms) against eager on the same stream (50.9 ms):
which segment is slower as a graph? Each segment timed alone: its graph, and its steps run
eagerly (outputs not bound); then the whole phase through the replay machinery with every
step eager. Medians of 10 (CUDA events)."""
import json, statistics
import cupy as cp
import opgraph as og
from opgraph.graph_replay import GraphReplay
from opgraph.benchmarks import lowerings as lw
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import PhaseRunner, random_feeds, run_step, schedule, training_graph
from opgraph.benchmarks.timer import make_timer
from opgraph.passes.policy import LoweringPolicy

model = build("resnet50")
tg = training_graph(model)
base = LoweringPolicy(precision="fp32", layout="NHWC")
exe = og.compile(tg.outputs, device="cuda", policy=lw.parse_lowerings("auto")[0].policy(base, "cuda"))
sched = schedule(exe, tg)
feeds = {k: cp.asarray(v) for k, v in random_feeds(model).items()}
timer = make_timer("cuda")
med = lambda fn, label: statistics.median(timer.measure(fn, label=label, repeat=10))
runner = PhaseRunner(sched, exe.feed(feeds), timer)
runner.warmup(3)
t, summary = runner.time_graphed_phases(10, 3)
out = {"replay": {p: statistics.median(v.times_ms) for p, v in t.items() if v}}
rep = runner.replays["backward_data"]
slots, stream = runner.slots, runner.graph_stream
rows = []
with stream:
    for i, seg in enumerate(rep.segments):
        def eager(seg=seg):
            for st in seg.steps:
                run_step(st, slots)
        row = {"seg": i, "steps": len(seg.steps), "graph": seg.graph is not None,
               "first": seg.steps[0].name, "eager_ms": med(eager, f"seg{i} eager")}
        if seg.graph is not None:
            row["graph_ms"] = med(lambda g=seg.graph: g.launch(stream), f"seg{i} graph")
        else:
            def copied(seg=seg):
                for st in seg.steps:
                    slots[st.node][...] = run_step(st, slots)
            row["eager_copy_ms"] = med(copied, f"seg{i} copy")
        rows.append(row)
        print(json.dumps(row), flush=True)
    out["sum_graph_or_copy"] = sum(r.get("graph_ms", r.get("eager_copy_ms", 0)) for r in rows)
    out["sum_eager"] = sum(r["eager_ms"] for r in rows)
    out["replay_bd_again"] = med(rep, "bd replay")
    all_eager = GraphReplay(sched.phases["backward_data"], slots, run_step, stream,
                            eager=frozenset(st.node for st in sched.phases["backward_data"]))
    out["replay_bd_all_eager"] = med(all_eager, "bd all eager")
    out["eager_bd_side"] = med(lambda: runner.run(sched.phases["backward_data"]), "bd eager")
print(json.dumps(out, indent=1), flush=True)
