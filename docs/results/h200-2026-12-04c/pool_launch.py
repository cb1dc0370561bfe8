"""Vector max-pool kernels (bf16 NHWC, GoogLeNet shapes) under launch configurations: threads per block x block cap."""
import statistics, json
import cupy as cp
from opgraph.backends.reference.pool import PoolGeometry, geometry
from opgraph.backends.cuda import pool_vector as pv
from opgraph.backends.cuda.codegen.launch import empty
from opgraph.backends.cuda.storage import bits
from opgraph.benchmarks.timer import time_calls

SHAPES = [("3a", (128, 192, 28, 28), 3, 1, 1, False), ("pool2", (128, 192, 56, 56), 3, 2, 0, True),
          ("4a", (128, 480, 14, 14), 3, 1, 1, False), ("pool1", (128, 64, 112, 112), 3, 2, 0, True)]
CONFIGS = [(256, 1056), (256, 1 << 30), (128, 1 << 30), (512, 1 << 30), (128, 2112)]
med = lambda f: statistics.median(time_calls(f, warmup=3, repeat=20, device="cuda"))
for name, shape, k, s, p, ceil in SHAPES:
    kk, ss, pad, out = geometry(shape[2:], k, s, p, ceil)
    g = PoolGeometry(kk, ss, pad, tuple(shape[2:]), out)
    xb = empty(cp, shape, "bfloat16", "NHWC")
    bits(cp, xb)[...] = (cp.random.randint(0, 0x7f00, shape, dtype=cp.int32) | (cp.random.randint(0, 2, shape, dtype=cp.int32) << 15)).astype(cp.uint16)
    gy = empty(cp, (*shape[:2], *out), "bfloat16", "NHWC")
    bits(cp, gy)[...] = 0x3f80
    n, c = shape[:2]
    mb = (n * c * shape[2] * shape[3] * 2 + n * c * out[0] * out[1]) / 1e6
    for threads, cap in CONFIGS:
        pv.THREADS, pv.MAX_BLOCKS = threads, cap
        row = {"layer": name, "threads": threads, "cap": cap}
        for pix in (1, 2):
            row[f"arg_p{pix}"] = med(lambda: pv.max_pool2d_argmax(cp, xb, g, relu=True, pixels=pix))
        idx = pv.max_pool2d_argmax(cp, xb, g, relu=True, pixels=1)
        row["bwd"] = med(lambda: pv.max_pool2d_backward_indices(cp, idx, gy, g, shape, masked=True))
        row["take"] = med(lambda: pv.max_pool2d_take(cp, xb, idx, g, masked=True))
        row["arg_gbps"] = mb / min(row["arg_p1"], row["arg_p2"])
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
