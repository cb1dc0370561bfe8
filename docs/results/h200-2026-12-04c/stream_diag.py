"""fp32 ResNet-50 NHWC backward-data: eager on the default stream, eager on the capture stream,
each FFT step alone on both, and the replay; medians of 10 (CUDA events)."""
import statistics, json
import cupy as cp
import opgraph as og
from opgraph.graph_replay import capture_stream, release_cached
from opgraph.benchmarks import lowerings as lw
from opgraph.benchmarks.models import build
from opgraph.benchmarks.protocol import PHASES, PhaseRunner, random_feeds, schedule, training_graph
from opgraph.benchmarks.timer import make_timer
from opgraph.executable import run_step
from opgraph.passes.policy import LoweringPolicy

model = build("resnet50")
tg = training_graph(model)
base = LoweringPolicy(precision="fp32", layout="NHWC")
exe = og.compile(tg.outputs, device="cuda", policy=lw.parse_lowerings("auto")[0].policy(base, "cuda"))
sched = schedule(exe, tg)
feeds = {k: cp.asarray(v) for k, v in random_feeds(model).items()}
timer = make_timer("cuda")
runner = PhaseRunner(sched, exe.feed(feeds), timer)
runner.warmup(3)
med = lambda fn, label: statistics.median(timer.measure(fn, label=label, repeat=10))
bd = sched.phases["backward_data"]
ffts = [st for st in bd if st.op.algorithm == "fft"]
out = {"fft_steps": len(ffts)}
out["bd_eager_default"] = med(lambda: runner.run(bd), "bd")
side = capture_stream()
with side:
    runner.run(bd); side.synchronize()
    out["bd_eager_side_stream"] = med(lambda: runner.run(bd), "bd side")
out["fft_alone_default"] = {st.name: med(lambda st=st: run_step(st, runner.slots), st.name) for st in ffts[:4]}
with side:
    out["fft_alone_side"] = {st.name: med(lambda st=st: run_step(st, runner.slots), st.name) for st in ffts[:4]}
# the copy into a static output, as the replay's eager step does
st = ffts[0]
static = run_step(st, runner.slots).copy()
def eager_copy():
    static[...] = run_step(st, runner.slots)
out["fft0_with_copy_default"] = med(eager_copy, "copy")
print(json.dumps(out, indent=1), flush=True)
t, summary = runner.time_graphed_phases(10, 3)
out["replay"] = {p: (statistics.median(v.times_ms) if v else None) for p, v in t.items()}
with runner.graph_stream:
    out["bd_eager_after_replays_side"] = med(lambda: runner.run(bd), "bd after")
out["bd_eager_after_replays_default"] = med(lambda: runner.run(bd), "bd after default")
print(json.dumps(out, indent=1), flush=True)
