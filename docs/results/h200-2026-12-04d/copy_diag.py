"""fp32 ResNet-50 NHWC backward-data replay: each eager FFT step's copy into its static output
costs 0.02-0.50 ms (call 2). Strides of static and output, and the copy timed alone, CuPy's
elementwise copy against a raw device-to-device memcpy. Medians of 10 (CUDA events)."""
import json, statistics
import cupy as cp
import opgraph as og
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
rep = runner.replays["backward_data"]
slots, stream = runner.slots, runner.graph_stream
with stream:
    for seg in rep.segments:
        if seg.graph is not None:
            continue
        st = seg.steps[0]
        out = run_step(st, slots)
        static = slots[st.node]
        row = {"step": st.name, "shape": out.shape, "dtype": str(out.dtype), "out_strides": out.strides,
               "static_strides": static.strides, "out_c": out.flags.c_contiguous,
               "static_c": static.flags.c_contiguous, "out_mem": str(type(out.data.mem)),
               "static_mem": str(type(static.data.mem)), "nbytes": out.nbytes}
        row["setitem_ms"] = med(lambda: static.__setitem__(Ellipsis, out), "setitem")
        row["copyto_ms"] = med(lambda: cp.copyto(static, out), "copyto")
        if static.strides == out.strides:
            row["memcpy_ms"] = med(lambda: static.data.copy_from_device_async(out.data, out.nbytes, stream), "memcpy")
        fresh = cp.empty_like(out)
        row["setitem_fresh_ms"] = med(lambda: fresh.__setitem__(Ellipsis, out), "fresh")
        row["run_ms"] = med(lambda: run_step(st, slots), "run")
        def run_copy():
            static[...] = run_step(st, slots)
        row["run_copy_ms"] = med(run_copy, "run+copy")
        print(json.dumps(row), flush=True)
