"""Time and (under ncu) profile the vector max-pool kernels on GoogLeNet shapes, bf16 NHWC."""
import sys, statistics, json
import cupy as cp
from opgraph.backends.reference.pool import PoolGeometry, geometry
from opgraph.backends.cuda import pool_vector as pv
from opgraph.benchmarks.timer import time_calls

SHAPES = [("3a", (128, 192, 28, 28), 3, 1, 1, False), ("pool2", (128, 192, 56, 56), 3, 2, 0, True),
          ("4a", (128, 480, 14, 14), 3, 1, 1, False)]
timing = "--time" in sys.argv
rows = []
for name, shape, k, s, p, ceil in SHAPES:
    kk, ss, pad, out = geometry(shape[2:], k, s, p, ceil)
    g = PoolGeometry(kk, ss, pad, tuple(shape[2:]), out)
    # bf16 via the storage helper the tests use
    from opgraph.backends.cuda.codegen.launch import empty
    xb = empty(cp, shape, "bfloat16", "NHWC")
    from opgraph.backends.cuda.storage import bits
    bits(cp, xb)[...] = (cp.random.randint(0, 0x7f00, shape, dtype=cp.int32) | (cp.random.randint(0, 2, shape, dtype=cp.int32) << 15)).astype(cp.uint16)
    for pix in pv.PIXELS:
        f = lambda: pv.max_pool2d_argmax(cp, xb, g, relu=True, pixels=pix)
        idx = f()
        t = statistics.median(time_calls(f, warmup=3, repeat=20 if timing else 1, device="cuda"))
        rows.append({"layer": name, "kernel": "arg", "pixels": pix, "ms": t})
    gy = empty(cp, (*shape[:2], *out), "bfloat16", "NHWC")
    bits(cp, gy)[...] = 0x3f80
    f = lambda: pv.max_pool2d_backward_indices(cp, idx, gy, g, shape, masked=True)
    rows.append({"layer": name, "kernel": "bwd", "ms": statistics.median(time_calls(f, warmup=3, repeat=20 if timing else 1, device="cuda"))})
    f = lambda: pv.max_pool2d_take(cp, xb, idx, g, masked=True)
    rows.append({"layer": name, "kernel": "take", "ms": statistics.median(time_calls(f, warmup=3, repeat=20 if timing else 1, device="cuda"))})
for r in rows:
    print(json.dumps(r))
