"""fp32 ResNet-50 NHWC: does memory held slow the eager backward-data, and what do the
replays' private pools hold with one pool per replay (new) or one pool for all three phases?
Medians of 10 (CUDA events)."""
import gc, json, statistics
import cupy as cp
import opgraph as og
from opgraph.graph_replay import GraphReplay, capture_stream, release_cached
from opgraph.benchmarks import lowerings as lw
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import PHASES, PhaseRunner, random_feeds, run_step, schedule, training_graph
from opgraph.benchmarks.timer import make_timer
from opgraph.passes.policy import LoweringPolicy

model = build("resnet50")
tg = training_graph(model)
base = LoweringPolicy(precision="fp32", layout="NHWC")
exe = og.compile(tg.outputs, device="cuda", policy=lw.parse_lowerings("auto")[0].policy(base, "cuda"))
sched = schedule(exe, tg)
feeds = {k: cp.asarray(v) for k, v in random_feeds(model).items()}
timer = make_timer("cuda")
pool = cp.get_default_memory_pool()
med = lambda fn, label: statistics.median(timer.measure(fn, label=label, repeat=10))
out = {}
def show():
    print(json.dumps(out, indent=1), flush=True)

runner = PhaseRunner(sched, exe.feed(feeds), timer)
runner.warmup(3)
bd = sched.phases["backward_data"]
out["eager"] = {p: med(lambda s=sched.phases[p]: runner.run(s), p) for p in PHASES}
out["eager_default_pool_bytes"] = int(pool.total_bytes())
# 1. memory held alone: 17 GB of dummy arrays, written once
dummy = [cp.ones(1 << 30, dtype=cp.uint8) for _ in range(17)]
cp.cuda.Device().synchronize()
out["bd_eager_with_17GB_held"] = med(lambda: runner.run(bd), "bd held")
del dummy; release_cached()
out["bd_eager_after_dummy_freed"] = med(lambda: runner.run(bd), "bd freed")
show()
# 2. the runner's replays: one private pool per phase's replay (this tree)
t, summary = runner.time_graphed_phases(10, 3)
out["replay_pool_per_phase"] = {p: statistics.median(v.times_ms) for p, v in t.items() if v}
out["pool_bytes_per_phase"] = {p: s["pool_bytes"] for p, s in summary.items()}
out["graphs"] = {p: s["graphs"] for p, s in summary.items()}
with runner.graph_stream:
    out["bd_eager_after_replays_side"] = med(lambda: runner.run(bd), "bd after")
out["bd_eager_after_replays_default"] = med(lambda: runner.run(bd), "bd after default")
show()
runner.close_replays(); del runner, t; gc.collect(); release_cached()
# 3. one pool for the three phases, launched in build order
runner = PhaseRunner(sched, exe.feed(feeds), timer)
runner.warmup(2)
release_cached()
stream = capture_stream()
shared = cp.cuda.MemoryPool()
with stream:
    reps = {p: GraphReplay(sched.phases[p], runner.slots, run_step, stream, pool=shared) for p in PHASES}
    release_cached()
    for _ in range(3):
        for r in reps.values(): r()
    stream.synchronize()
    out["replay_one_pool"] = {p: med(reps[p], p) for p in PHASES}
    out["one_pool_bytes"] = int(shared.total_bytes())
    out["bd_eager_after_one_pool_side"] = med(lambda: runner.run(bd), "bd after 1")
out["default_pool_bytes_end"] = int(pool.total_bytes())
show()
