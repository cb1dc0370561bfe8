"""ConvNeXt-tiny's depthwise 7x7 forwards: cuDNN with and without the bias in its graph, and ours.

On an H100 (``docs/results/h100-2026-12-06b``) the ``cudnn`` lowering of these
layers, whose graph adds the bias after the convolution, built 5 engines that
took 4.18-22.7 ms on 128 x 96 x 56 x 56, while PyTorch's step, on the same
cuDNN 9.19 and without the bias in the convolution call, ran all 18 layers in
2.32 ms (``conv2d_c1_k1_nhwc_specialized``). This script times, per layer
shape (batch 128, channels-last, bf16 by default), every cuDNN engine that
builds with the bias (``cudnn+bias eN``) and without it (``cudnn eN``), and
our stride-1 gather with the bias (``gather``, ``backends/cuda/depthwise_forward.py``):
CUDA events, median of ``--repeat`` calls after ``--warmup``. One JSON line per
candidate; an engine that does not build is a line with its error.

    python scripts/depthwise_bench.py [--dtype float32] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

#: ConvNeXt-tiny's depthwise layers at batch 128, (N, C, H, W): one per stage
SHAPES = [(128, 96, 56, 56), (128, 192, 28, 28), (128, 384, 14, 14), (128, 768, 7, 7)]
KERNEL, PADDING = (7, 7), ((3, 3), (3, 3))
#: engine indices tried (cuDNN's heuristics order; those past the list's end fail to build)
ENGINES = range(12)


def candidates(cp, shape, dtype):
    """``(name, call)`` of every candidate on one layer shape (module docstring), operands made once."""
    import numpy as np

    from opgraph.backends.cuda import cudnn, depthwise_forward
    from opgraph.backends.cuda.storage import host_to_device

    rng = np.random.default_rng(0)
    c = shape[1]
    x = host_to_device(cp, rng.standard_normal(shape), dtype)
    w = host_to_device(cp, rng.standard_normal((c, 1, *KERNEL)), dtype)
    b = host_to_device(cp, rng.standard_normal(c), dtype)
    kw = dict(stride=(1, 1), padding=PADDING, dilation=(1, 1), groups=c)
    rows = [("gather", lambda: depthwise_forward.conv2d(cp, x, w, b, **kw))]
    for e in ENGINES:  # the output has the input's shape: 7x7, padding 3, stride 1
        rows.append((f"cudnn+bias e{e}", lambda e=e: cudnn.conv2d(cp, x, w, b, **kw, out_shape=shape, engine=e)))
        rows.append((f"cudnn e{e}", lambda e=e: cudnn.conv2d(cp, x, w, None, **kw, out_shape=shape, engine=e)))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Needs a CUDA GPU.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", help="write the JSON lines here too")
    a = p.parse_args(argv)
    if a.warmup < 0 or a.repeat < 1:
        p.error(f"--warmup must be >= 0 and --repeat >= 1, got {a.warmup} and {a.repeat}")
    from opgraph.backends.device import cuda_status
    ok, why = cuda_status()
    if not ok:
        p.error(f"needs a CUDA GPU: {why}")
    import cupy as cp

    from opgraph.benchmarks.timer import time_calls

    lines = []
    for shape in SHAPES:
        for name, call in candidates(cp, shape, a.dtype):
            row = {"shape": list(shape), "dtype": a.dtype, "candidate": name}
            try:
                row["ms"] = statistics.median(time_calls(call, warmup=a.warmup, repeat=a.repeat, device="cuda"))
            except Exception as e:  # an engine index past what cuDNN offers for this graph
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            lines.append(json.dumps(row))
            print(lines[-1], flush=True)
    if a.json:
        from opgraph.atomic_file import write_atomic
        write_atomic(a.json, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
