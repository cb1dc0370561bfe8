"""Short GPU benchmark and fact probe of the cuDNN lowering (run by scripts/gpu_check.sh).

1. Facts: whether cuDNN's native asymmetric padding is right on every engine
   (the legalize pass makes it explicit until it is), which epilogues fuse into
   one graph (conv + bias (+ residual add) (+ ReLU / ReLU6); dgrad + ReLU
   backward), how many engines fp32 (TF32 excluded) and tf32 have, and the
   host cost of one small convolution call.
2. Timings: AlexNet conv2 and layer-suite L2/L5 at batch 128, float32 NCHW,
   TF32 off: every engine screened (1 warm-up + 3 runs), then the heuristic
   engine and the best one timed properly (10 warm-ups, median of 20, CuPy
   events); PyTorch's cuDNN with ``cudnn.benchmark = True`` and TF32 off on
   the same sizes, same protocol.

Usage: ``python scripts/gpu_bench_cudnn.py [--json PATH] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from opgraph.benchmarks.timer import time_calls

CONVS = {  # name: (x shape, w shape, padding)
    "alexnet_conv2": ((128, 64, 27, 27), (192, 64, 5, 5), 2),
    "L2": ((128, 64, 64, 64), (128, 64, 9, 9), 0),
    "L5": ((128, 384, 13, 13), (384, 384, 3, 3), 0),
}


def _params(pad):
    return dict(stride=(1, 1), padding=((pad, pad), (pad, pad)), dilation=(1, 1), groups=1)


def _time(fn, warmup=10, reps=20):
    """Median and min milliseconds of ``fn()`` between CUDA events."""
    times = time_calls(fn, warmup=warmup, repeat=reps, device="cuda")
    return float(np.median(times)), float(np.min(times))


def native_asymmetric_probe(cp, shapes, p):
    """Run every engine of the *native* asymmetric-padding graph (cuDNN pre !=
    post padding, which the legalize pass otherwise makes explicit) on a
    NaN-poisoned output; count the engines whose result is wrong."""
    from opgraph.backends.cuda import cudnn, cudnn_graph as cg
    from opgraph.backends.reference import conv as ref
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shapes["fprop"][0])
    w = rng.standard_normal(shapes["fprop"][1])
    gy = rng.standard_normal(shapes["fprop"][2])
    q = dict(p, groups=1)
    want = {"fprop": ref.conv2d_forward(np, x, w, **q),
            "dgrad": ref.conv2d_backward_data(np, gy, w, **q, input_shape=x.shape),
            "wgrad": ref.conv2d_backward_filter(np, x, gy, **q, weight_shape=w.shape)}
    ins = {"fprop": (x, w), "dgrad": (gy, w), "wgrad": (x, gy)}
    out = {}
    for kind, sh in shapes.items():
        sig = cudnn.signature(kind, "none", sh, "fp32", p["padding"], p["stride"], p["dilation"], False)
        try:
            plan = cg.plan_for(sig)
        except Exception as exc:
            out[f"native_asymmetric_{kind}"] = f"rejected: {exc}"[:200]
            continue
        arrays = [cp.asarray(a, dtype=cp.float32) for a in ins[kind]]
        bad = []
        for i in plan.engines():
            y = cp.full(sh[-1], np.nan, dtype=cp.float32)
            scratch = cg.workspace(plan.ensure(i))
            plan.execute([a.data.ptr for a in arrays] + [y.data.ptr], i, cg.pointer(scratch))
            got = cp.asnumpy(y).astype(np.float64)
            err = np.linalg.norm(got - want[kind]) / np.linalg.norm(want[kind])
            if not err < 1e-4:
                bad.append(f"{i}:{plan.name(i)}:{err:.1e}")
        out[f"native_asymmetric_{kind}"] = (f"{len(plan.engines()) - len(bad)} of {len(plan.engines())} "
                                            f"engines right; wrong: {bad}")
    return out


def facts(cp):
    from opgraph.backends.cuda import cudnn, cudnn_graph as cg
    out = {}
    p = dict(stride=(2, 2), padding=((1, 0), (2, 1)), dilation=(1, 1))
    shapes = {"fprop": [(2, 8, 12, 12), (16, 8, 3, 3), (2, 16, 6, 7)],
              "dgrad": [(2, 16, 6, 7), (16, 8, 3, 3), (2, 8, 12, 12)],
              "wgrad": [(2, 8, 12, 12), (2, 16, 6, 7), (16, 8, 3, 3)]}
    out.update(native_asymmetric_probe(cp, shapes, p))
    for prec, cl in (("fp32", False), ("fp32", True), ("bf16", True), ("fp16", True)):
        y = (8, 64, 28, 28)
        graphs = {epi: ("fprop", [y, (64, 64, 3, 3), (1, 64, 1, 1)] + [y] * ("add" in epi) + [y])
                  for epi in ("bias", "bias_relu", "bias_relu6", "bias_add_relu", "bias_add_relu6")}
        graphs["drelu"] = ("dgrad", [y, (64, 64, 3, 3), y, y])
        for epi, (kind, sh) in graphs.items():
            sig = cudnn.signature(kind, epi, sh, prec, ((1, 1), (1, 1)), (1, 1), (1, 1), cl)
            plan, left = cudnn.route(sig)
            out[f"fused_{kind}_{epi}_{prec}_{'NHWC' if cl else 'NCHW'}"] = (
                f"one graph, {len(plan.engines())} engines" if left == "none" else "unfused (CuPy epilogue)")
    for prec in ("fp32", "tf32", "bf16"):
        x, w, pad = CONVS["alexnet_conv2"]
        sh = [x, w, (x[0], w[0], 27, 27)]
        plan = cudnn.route(cudnn.signature("fprop", "none", sh, prec, ((pad, pad), (pad, pad)),
                                           (1, 1), (1, 1), False))[0]
        n, bs = len(plan.engines()), plan.build_seconds
        barred = sum("eselect" in r for r in plan.failed.values())
        out[f"alexnet_conv2_fprop_{prec}_engines"] = (
            f"{n} of {plan.count} plans build ({barred} deselected by notes) in {sum(bs.values()):.1f} s, "
            f"slowest {max(bs.values()):.2f} s")
        if prec == "fp32":
            out["alexnet_conv2_fprop_fp32_failures"] = sorted(set(plan.failed.values()))[:5]
    x = cp.random.standard_normal((8, 16, 16, 16), dtype=cp.float32)
    w = cp.random.standard_normal((16, 16, 3, 3), dtype=cp.float32)
    kw = dict(_params(1), out_shape=(8, 16, 16, 16))
    for _ in range(20):
        cudnn.conv2d(cp, x, w, **kw)
    cp.cuda.Device().synchronize()
    for label in ("fast", "public"):
        if label == "public":
            for plan in cg._CACHE.values():
                plan._fast = {i: False for i in range(plan.count)}
        t0 = time.perf_counter()
        for _ in range(200):
            cudnn.conv2d(cp, x, w, **kw)
        cp.cuda.Device().synchronize()
        out[f"host_us_per_small_conv2d_call_{label}"] = round((time.perf_counter() - t0) / 200 * 1e6, 1)
    for plan in cg._CACHE.values():
        plan._fast = {}
    t0 = time.perf_counter()
    cudnn.conv2d(cp, x[:, :8], w[:, :8], **dict(kw, out_shape=(8, 8, 16, 16)))
    cp.cuda.Device().synchronize()
    out["first_call_ms_new_signature"] = round((time.perf_counter() - t0) * 1e3, 1)
    builds = [t for plan in cg._CACHE.values() for t in plan.build_seconds.values()]
    out["plan_builds_so_far"] = f"{len(builds)} plans, total {sum(builds):.1f} s, slowest {max(builds):.2f} s"
    return out


def bench_ours(cp, name, quick):
    from opgraph.backends.cuda import cudnn
    from opgraph.backends.reference.conv import conv_geometry
    xs, ws, pad = CONVS[name]
    kw = _params(pad)
    x = cp.random.standard_normal(xs, dtype=cp.float32)
    w = cp.random.standard_normal(ws, dtype=cp.float32)
    ys = conv_geometry(xs, ws, **kw).y_shape
    y = cudnn.conv2d(cp, x, w, **kw, out_shape=ys)
    gy = cp.random.standard_normal(y.shape, dtype=cp.float32)
    calls = {"fprop": (lambda e: cudnn.conv2d(cp, x, w, **kw, out_shape=ys, engine=e), [xs, ws, y.shape]),
             "dgrad": (lambda e: cudnn.conv2d_backward_data(cp, gy, w, **kw, input_shape=xs, engine=e),
                       [y.shape, ws, xs]),
             "wgrad": (lambda e: cudnn.conv2d_backward_filter(cp, x, gy, **kw, weight_shape=ws, engine=e),
                       [xs, y.shape, ws])}
    rows = []
    for kind, (call, shapes) in calls.items():
        plan = cudnn.route(cudnn.signature(kind, "none", shapes, "fp32", kw["padding"], kw["stride"],
                                           kw["dilation"], False))[0]
        engines = plan.engines()
        heur = plan.pick_default()
        screen = {}
        for e in engines:
            if plan.workspace[e] > 16 << 30:
                continue
            screen[e] = _time(lambda: call(e), warmup=1, reps=1 if quick else 3)[0]
        best = min(screen, key=screen.get)
        h_med, h_min = _time(lambda: call(heur))
        b_med, b_min = _time(lambda: call(best))
        rows.append(dict(conv=name, kind=kind, engines=len(engines), heuristic=heur, heuristic_ms=h_med,
                         best=best, best_name=plan.name(best), best_ms=b_med,
                         best_ws_mb=round(plan.workspace[best] / 2 ** 20, 1),
                         worst_screen_ms=max(screen.values())))
    return rows


def bench_torch(name):
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    xs, ws, pad = CONVS[name]
    x = torch.randn(xs, device="cuda")
    w = torch.randn(ws, device="cuda")
    y = torch.nn.functional.conv2d(x, w, padding=pad)
    gy = torch.randn_like(y)
    bwd = torch.ops.aten.convolution_backward

    def run(fn, warmup=10, reps=20):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return float(np.median(times))

    args = ([1, 1], [pad, pad], [1, 1], False, [0, 0], 1)
    return {"fprop": run(lambda: torch.nn.functional.conv2d(x, w, padding=pad)),
            "dgrad": run(lambda: bwd(gy, x, w, None, *args, [True, False, False])),
            "wgrad": run(lambda: bwd(gy, x, w, None, *args, [False, True, False]))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write facts and timings here")
    ap.add_argument("--quick", action="store_true", help="screen engines with one run each")
    args = ap.parse_args()
    import cupy as cp
    from opgraph.backends.device import versions
    result = {"versions": versions(), "facts": facts(cp), "timings": []}
    for k, v in result["facts"].items():
        print(f"{k:42s} {v}")
    for name in CONVS:
        rows = bench_ours(cp, name, args.quick)
        try:
            ref = bench_torch(name)
        except Exception as exc:  # PyTorch absent: still report ours
            ref = {}
            print(f"PyTorch comparison skipped: {exc}")
        for r in rows:
            r["torch_ms"] = ref.get(r["kind"])
        result["timings"] += rows
    print(f"\n{'conv':14s} {'dir':5s} {'engines':>7s} {'heur#':>5s} {'heur ms':>8s} {'best#':>5s} "
          f"{'best ms':>8s} {'ws MB':>7s} {'torch ms':>8s}")
    for r in result["timings"]:
        t = f"{r['torch_ms']:8.3f}" if r["torch_ms"] is not None else "       -"
        print(f"{r['conv']:14s} {r['kind']:5s} {r['engines']:7d} {r['heuristic']:5d} {r['heuristic_ms']:8.3f} "
              f"{r['best']:5d} {r['best_ms']:8.3f} {r['best_ws_mb']:7.1f} {t}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
