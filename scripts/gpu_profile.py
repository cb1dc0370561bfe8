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

For the per op type and direction table with bytes moved, FLOPs and the
fraction of the copy bandwidth or matmul peak measured in the same run, for
any model (DSL or ONNX) on the GPU or the CPU, use ``opgraph-bench --profile``
(benchmarks/profile.py); this script keeps the per-node input diagnostics.

Usage (on a GPU machine)::

    python scripts/gpu_profile.py --model alexnet --precision tf32 --layout NHWC --json out.json
    python scripts/gpu_profile.py --model vgg_a --dtype bfloat16 --precision bf16 --layout NHWC --autotune
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


def _stats(cp, a) -> dict:
    """Value statistics of a float array: zero and tiny (|x| < 1e-30) fractions, max |x|."""
    v = cp.abs(a.astype(cp.float32))
    return dict(zero=round(float((v == 0).mean()), 4), tiny=round(float(((v > 0) & (v < 1e-30)).mean()), 4),
                max=float(v.max()) if v.size else 0.0)


def _like(cp, a, values):
    """``values`` (host float32, a's shape) in a's dtype and memory layout (channels-last or not)."""
    out = cp.asarray(values).astype(a.dtype)
    if a.ndim == 4 and a.strides[1] == a.itemsize and a.shape[1] > 1:
        out = cp.ascontiguousarray(out.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return out


def _describe(a) -> str:
    return f"{a.dtype}{tuple(a.shape)} strides {tuple(s // a.itemsize for s in a.strides)}"


def compare_inputs(cp, st, args, types=None) -> dict:
    """ms of one step's kernel on its real inputs, on copies of them (fresh
    buffers, same layout) and on standard-normal inputs of the same types (what
    the autotuner timed), with the real inputs' value statistics: tells a
    value-dependent slowdown from a layout or alignment one."""
    rng = np.random.default_rng(0)
    copies = [_like(cp, a, cp.asnumpy(a.astype(cp.float32))) if a.dtype.kind in "fV" or a.dtype.name == "bfloat16"
              else a for a in args]
    normal = [_like(cp, a, rng.standard_normal(a.shape).astype(np.float32))
              if a.dtype.kind in "fV" or a.dtype.name == "bfloat16" else a for a in args]
    variants = [("real", args), ("real_copied", copies), ("normal", normal)]
    if types is not None:  # exactly what the autotuner builds for this node
        from opgraph.passes.autotune import random_inputs
        variants.append(("tuner", random_inputs(types, cp, 0)))
    out = {}
    for label, arrays in variants:
        out[label + "_ms"] = round(time_steps(lambda: st.kernel(st.ctx, st.op.op, *arrays), 2, 5), 4)
        out[label + "_arrays"] = [_describe(a) for a in arrays]
    out["stats"] = [_stats(cp, a) for a in args if a.dtype.kind in "fV" or a.dtype.name == "bfloat16"]
    return out


def profile(model_key: str, batch: int | None, policy, warmup: int, repeat: int,
            dtype: str = "float32", compare: int = 0) -> dict:
    import cupy as cp

    model = build(model_key, batch=batch, dtype=dtype)
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
    if compare:
        slowest = sorted(range(len(rows)), key=lambda i: -rows[i]["ms"])[:compare]
        for i in slowest:
            st = exe.steps[i]
            rows[i]["same_kernel_on"] = compare_inputs(cp, st, [env[a] for a in st.args],
                                                       exe.graph.node(st.node).input_types)
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
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                    help="storage dtype of the model (inputs, parameters, activations, gradients)")
    ap.add_argument("--autotune", action="store_true")
    ap.add_argument("--compare-inputs", type=int, default=0, metavar="K",
                    help="for the K slowest nodes, also time the kernel on copies of its inputs and on "
                         "standard-normal inputs (what the autotuner timed), with value statistics")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    policy = og.LoweringPolicy(precision=args.precision, layout=args.layout, autotune=args.autotune)
    results = []
    for key in args.model or ["alexnet"]:
        r = profile(key, args.batch, policy, args.warmup, args.repeat, args.dtype, args.compare_inputs)
        results.append(r)
        cl = sum(n["channels_last"] for n in r["nodes"])
        print(f"{key} b{r['batch']} {args.dtype} {args.precision} {args.layout} autotune={args.autotune}: "
              f"step {r['step_ms']} ms, nodes {r['sum_of_nodes_ms']} ms, host {r['host_overhead_ms']} ms, "
              f"compile {r['compile_s']} s, channels-last outputs {cl}/{len(r['nodes'])}; "
              f"{r['by_phase']}")
        for k, v in r["top_ops"][:6]:
            print(f"    {v:9.3f} ms  {k}")
        for n in r["nodes"]:
            if "same_kernel_on" in n:
                c = n["same_kernel_on"]
                print(f"    {n['name']}: real {c['real_ms']} ms, copied {c['real_copied_ms']} ms, "
                      f"normal {c['normal_ms']} ms, tuner's inputs {c.get('tuner_ms')} ms; "
                      f"inputs {c['stats']}")
                print(f"      real {c['real_arrays']}; tuner's {c.get('tuner_arrays')}")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
