"""Where the time goes: a per-node, per-direction profile of one training step.

For each model and setting (precision, layout, autotune), compile the
benchmark graph (forward + parameter gradients, the model output fed back as
the output gradient, as convnet-benchmarks does), then

* time the whole step (all nodes in schedule order) with device events,
  median of ``--repeat`` after ``--warmup``;
* time every node alone (its kernel in a loop, device events, median), and
  group the times by phase (forward / backward-data / backward-filter) and op;
* record whether each 4-D output is stored channels-last (layout check).

The difference between the whole step and the sum of the nodes is the host
side: Python dispatch and launch gaps the GPU could not hide.

Usage (on a GPU machine)::

    python scripts/gpu_profile.py --model alexnet --precision tf32 --layout NHWC --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import opgraph as og
from opgraph.benchmarks.models import build
from opgraph.benchmarks.timer import time_calls

WEIGHT_GRAD_OPS = {"Conv2dBackwardFilter", "BiasAddBackward"}


def phase_of(exe, step, param_grads: set[int]) -> str:
    """forward, backward-data or backward-filter (the seed's split)."""
    name = step.op.op.name
    if step.node in param_grads or name in WEIGHT_GRAD_OPS:
        return "backward-filter"
    return "backward-data" if ".grad" in step.name else "forward"


def time_steps(run_once, warmup: int, repeat: int) -> float:
    """Median ms of ``run_once`` between two CUDA events."""
    return statistics.median(time_calls(run_once, warmup=warmup, repeat=repeat, device="cuda"))


def profile(model_key: str, batch: int | None, policy, warmup: int, repeat: int) -> dict:
    import cupy as cp

    model = build(model_key, batch=batch)
    grads = og.grad(model.output, model.params)
    t0 = time.perf_counter()
    exe = og.compile([model.output, *grads], device="cuda", policy=policy)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    feeds = {model.input.name: rng.standard_normal(model.input.shape).astype(np.float32)}
    for p in model.params:
        feeds[p.name] = (rng.standard_normal(p.shape) * 0.01).astype(np.float32)
    y = exe.execute(exe.feed(feeds, {model.output: np.zeros(model.output.shape, np.float32)}),
                    [s for s in exe.steps if ".grad" not in s.name])[exe.outputs[0].node]
    slots = exe.feed(feeds, {model.output: cp.asnumpy(y)})
    param_grads = {v.node for v in exe.outputs[1:]}

    whole = time_steps(lambda: exe.execute(dict(slots)), warmup, repeat)
    env = dict(slots)  # every intermediate kept, for single-node timing
    for st in exe.steps:
        env[st.node] = st.kernel(st.ctx, st.op.op, *[env[a] for a in st.args])
    rows = []
    for st in exe.steps:
        args = [env[a] for a in st.args]
        ms = time_steps(lambda: st.kernel(st.ctx, st.op.op, *args), 2, max(5, repeat // 2))
        out = env[st.node]
        cl = bool(getattr(out, "ndim", 0) == 4 and out.strides[1] == out.itemsize and out.shape[1] > 1)
        rows.append(dict(name=st.name, op=st.op.op.name, algorithm=st.op.algorithm,
                         options=dict(st.op.options), phase=phase_of(exe, st, param_grads),
                         ms=round(ms, 4), channels_last=cl))
    by_phase: dict[str, float] = {}
    by_op: dict[str, float] = {}
    for r in rows:
        by_phase[r["phase"]] = by_phase.get(r["phase"], 0.0) + r["ms"]
        key = f'{r["phase"]}:{r["op"]}:{r["algorithm"]}'
        by_op[key] = by_op.get(key, 0.0) + r["ms"]
    nodes_ms = sum(r["ms"] for r in rows)
    return dict(model=model_key, batch=model.batch, policy=policy.to_dict(), compile_s=round(compile_s, 2),
                step_ms=round(whole, 3), sum_of_nodes_ms=round(nodes_ms, 3),
                host_overhead_ms=round(whole - nodes_ms, 3),
                by_phase={k: round(v, 3) for k, v in by_phase.items()},
                top_ops=sorted(((k, round(v, 3)) for k, v in by_op.items()), key=lambda kv: -kv[1])[:12],
                nodes=rows, notes=list(exe.report.notes),
                peak_pool_bytes=int(cp.get_default_memory_pool().total_bytes()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    ap.add_argument("--layout", default="NCHW", choices=["NCHW", "NHWC"])
    ap.add_argument("--autotune", action="store_true")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    policy = og.LoweringPolicy(precision=args.precision, layout=args.layout, autotune=args.autotune)
    results = []
    for key in args.model or ["alexnet"]:
        r = profile(key, args.batch, policy, args.warmup, args.repeat)
        results.append(r)
        cl = sum(n["channels_last"] for n in r["nodes"])
        print(f"{key} b{r['batch']} {args.precision} {args.layout} autotune={args.autotune}: "
              f"step {r['step_ms']} ms, nodes {r['sum_of_nodes_ms']} ms, host {r['host_overhead_ms']} ms, "
              f"compile {r['compile_s']} s, channels-last outputs {cl}/{len(r['nodes'])}; "
              f"{r['by_phase']}")
        for k, v in r["top_ops"][:6]:
            print(f"    {v:9.3f} ms  {k}")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
