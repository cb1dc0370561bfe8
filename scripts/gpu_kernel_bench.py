"""Our CUDA kernels, variant against variant, on the shapes of the winners.

* max pooling: 64- vs 32-bit index arithmetic, and the geometry compiled in
  as constants (``specialize``), forward and backward (which recomputes the
  argmax), on the pooling layers of GoogLeNet (batch 128) and VGG-A (batch 64);
* bias gradient: the kernel in use (``current``), the previous one (one long
  matrix-vector product), and a CuPy sum, on conv outputs of AlexNet,
  GoogLeNet and VGG-A; in NHWC also each ``method``: our two-pass column-sum
  kernel (``columns``, the default, capturable into a CUDA graph) and the
  cuBLAS matrix-vector product (``gemv``, the autotune variant), in float32
  and float16;

each in NCHW and NHWC, CUDA events, median of 20 after 5 warm-ups; one JSON
line per case.

    python scripts/gpu_kernel_bench.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import cupy as cp

from opgraph.backends.cuda import colsum as cuda_colsum
from opgraph.backends.cuda import pool as cuda_pool
from opgraph.benchmarks.timer import time_calls

#: (name, x shape, kernel, stride, padding, ceil_mode)
POOLS = [
    ("googlenet pool1", (128, 64, 112, 112), 3, 2, 0, True),
    ("googlenet pool2", (128, 192, 56, 56), 3, 2, 0, True),
    ("googlenet inception 3a pool", (128, 192, 28, 28), 3, 1, 1, False),
    ("googlenet inception 4a pool", (128, 480, 14, 14), 3, 1, 1, False),
    ("googlenet inception 5a pool", (128, 832, 7, 7), 3, 1, 1, False),
    ("vgg_a pool1", (64, 64, 224, 224), 2, 2, 0, False),
    ("vgg_a pool2", (64, 128, 112, 112), 2, 2, 0, False),
]

#: (name, conv output shape)
BIASES = [
    ("alexnet conv1", (128, 64, 55, 55)),
    ("googlenet conv1", (128, 64, 112, 112)),
    ("googlenet 3a 5x5_reduce", (128, 16, 28, 28)),
    ("googlenet 4a 1x1", (128, 192, 14, 14)),
    ("googlenet 5b 3x3", (128, 384, 7, 7)),
    ("vgg_a conv1", (64, 64, 224, 224)),
]


def median_ms(fn, warmup=5, repeat=20):
    """Median CUDA-event milliseconds of ``repeat`` calls after ``warmup``."""
    return statistics.median(time_calls(fn, warmup=warmup, repeat=repeat, device="cuda"))


def in_layout(a, layout):
    return cp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if layout == "NHWC" else a


def previous_bias_grad(gy):
    """The kernel before 2026-11-30: one matrix-vector product per layout."""
    c = gy.shape[1]
    if not gy.flags.c_contiguous:
        return cp.ones(gy.shape[0] * gy.shape[2] * gy.shape[3], gy.dtype) @ gy.transpose(0, 2, 3, 1).reshape(-1, c)
    g = gy.reshape(gy.shape[0], c, -1)
    return (g @ cp.ones(g.shape[2], gy.dtype)).sum(axis=0)


def emit(rows, row):
    rows.append(row)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


def bench_pools(rows):
    for name, shape, k, s, p, ceil in POOLS:
        kw = dict(kernel_size=(k, k), stride=(s, s), padding=((p, p), (p, p)), ceil_mode=ceil)
        for layout in ("NCHW", "NHWC"):
            x = in_layout(cp.random.standard_normal(shape, dtype=cp.float32), layout)
            y = cuda_pool.max_pool2d(cp, x, **kw)
            gy = in_layout(cp.random.standard_normal(y.shape, dtype=cp.float32), layout)
            row = {"kernel": "max_pool2d", "layer": name, "layout": layout, "x": list(shape)}
            for width, limit in (("i64", 1), ("i32", cuda_pool._INT32_LIMIT)):
                saved, cuda_pool._INT32_LIMIT = cuda_pool._INT32_LIMIT, limit
                try:
                    row[f"fwd_{width}_ms"] = median_ms(lambda: cuda_pool.max_pool2d(cp, x, **kw))
                    row[f"bwd_{width}_ms"] = median_ms(lambda: cuda_pool.max_pool2d_backward(cp, x, gy, **kw))
                    row[f"bwd_{width}"] = cuda_pool.max_pool2d_backward(cp, x, gy, **kw)
                finally:
                    cuda_pool._INT32_LIMIT = saved
            row["fwd_const_ms"] = median_ms(lambda: cuda_pool.max_pool2d(cp, x, **kw, specialize=True))
            row["bwd_const_ms"] = median_ms(
                lambda: cuda_pool.max_pool2d_backward(cp, x, gy, **kw, specialize=True))
            const = cuda_pool.max_pool2d_backward(cp, x, gy, **kw, specialize=True)
            row["widths_equal"] = bool(cp.array_equal(row.pop("bwd_i64"), row["bwd_i32"]))
            row["const_equal"] = bool(cp.array_equal(row.pop("bwd_i32"), const))
            emit(rows, row)


def bench_bias_grads(rows):
    for name, shape in BIASES:
        for layout, dtype in (("NCHW", cp.float32), ("NHWC", cp.float32), ("NHWC", cp.float16)):
            gy = in_layout(cp.random.standard_normal(shape, dtype=cp.float32).astype(dtype), layout)
            want = gy.astype(cp.float64).sum(axis=(0, 2, 3))
            row = {"kernel": "bias_add_backward", "layer": name, "layout": layout, "x": list(shape),
                   "dtype": cp.dtype(dtype).name, "gbytes": gy.nbytes / 1e9}
            cases = [("current", lambda: cuda_colsum.bias_add_backward(cp, gy))]
            if layout == "NHWC":  # the methods differ only for channels-last input
                cases += [(m, lambda m=m: cuda_colsum.bias_add_backward(cp, gy, method=m))
                          for m in cuda_colsum.BIAS_GRAD_METHODS]
            cases += [("previous", lambda: previous_bias_grad(gy)),
                      ("cupy_sum", lambda: gy.sum(axis=(0, 2, 3)))]
            for label, fn in cases:
                row[f"{label}_ms"] = median_ms(fn)
                err = float(cp.abs(fn().astype(cp.float64) - want).max() / cp.abs(want).max())
                row[f"{label}_relerr"] = err
            emit(rows, row)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args(argv)
    rows = []
    bench_pools(rows)
    bench_bias_grads(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
