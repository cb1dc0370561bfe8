"""The generated batch-norm kernels of a ResNet-50 training step, alone, against
the copy bandwidth, with the reduction split swept: what to tune next.

The H200 profile of 2026-12-02 puts ResNet-50's remaining gap to
``torch.compile`` + CUDA graphs in the training batch norm's passes, whose
kernels reach 22 % (statistics), 33 % (backward sums) and 45-50 % (apply +
ReLU, dx) of the copy bandwidth. This script times each of them on every
batch-norm input shape of ResNet-50 (batch 128, NHWC, bf16 by default):

* ``stats``: ``BatchNormStats(x)``; ``sums``: ``BatchNormTrainingBackwardSums(x, stats, gy)``;
* ``apply_relu``: the fused ``Relu(BatchNormTraining(x, stats, w, b))``;
* ``dx``: ``BatchNormTrainingBackwardDataFromSums(gy, x, stats, sums, w)``;
* ``copy``: a device-to-device copy of x, the ceiling at that size;

each captured ``--calls`` times into one CUDA graph (no Python dispatch in the
measurement), replayed ``--repeat`` times between CUDA events; the median
per call, the bytes a perfect kernel moves (inputs read once, output written
once), GB/s and the fraction of the copy bandwidth measured at the start of
the run (``opgraph.backends.copy_bandwidth``). The reductions are timed again
for each ``TARGET_BLOCKS`` of ``--blocks`` (``codegen/plan.py``: how many
blocks a split reduction aims at), which shows whether the split is the
limit. One JSON object per line on stdout (and ``--json`` writes them all).

    python scripts/gpu_codegen_bench.py [--dtype bfloat16] [--layout NHWC] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from opgraph import ops
from opgraph.ops.fused import FusedElementwise, FusedStep, Program
from opgraph.types import TensorType

#: ResNet-50's batch-norm input shapes (C, H, W) at batch 128: conv1's, then each stage's.
RESNET50_BN = [(64, 112, 112), (64, 56, 56), (256, 56, 56), (128, 56, 56), (128, 28, 28), (512, 28, 28),
               (256, 28, 28), (256, 14, 14), (1024, 14, 14), (512, 14, 14), (512, 7, 7), (2048, 7, 7)]

APPLY_RELU = FusedElementwise(Program(4, (FusedStep(ops.BatchNormTraining(), (0, 1, 2, 3)),
                                          FusedStep(ops.Relu(), (4,))), (5,)))


def cases(batch: int, dtype: str, layout: str) -> list[dict]:
    """One dict per (op, shape): ``name``, ``shape``, ``op``, ``types`` (the
    inputs: ``'x'`` full size, ``'stats'``/``'sums'`` (2, C) float32 for half
    storage, ``'c'`` (C,)), ``out`` (the output type) and ``reduction``."""
    from opgraph.ops.batchnorm_training import stats_dtype

    out = []
    for c, h, w in RESNET50_BN:
        full = TensorType((batch, c, h, w), dtype, layout)
        two = TensorType((2, c), stats_dtype(dtype))
        vec = TensorType((c,), dtype)
        for name, op, types, reduction in (
                ("stats", ops.BatchNormStats(), (full,), True),
                ("sums", ops.BatchNormTrainingBackwardSums(), (full, two, full), True),
                ("apply_relu", APPLY_RELU, (full, two, vec, vec), False),
                ("dx", ops.BatchNormTrainingBackwardDataFromSums(), (full, full, two, two, vec), False)):
            result = op.infer(*types)
            if result.shape == full.shape:
                result = TensorType(result.shape, result.dtype, layout)
            out.append({"name": name, "shape": (batch, c, h, w), "op": op, "types": types, "out": result,
                        "reduction": reduction})
    return out


def _nbytes(t) -> int:
    from opgraph.types import numpy_dtype
    return int(np.prod(t.shape)) * np.dtype(numpy_dtype(t.dtype)).itemsize


def _inputs(cp, case, seed: int):
    """Device inputs: standard normal, the statistics of x where a node reads them."""
    from opgraph.backends.registry import KernelContext, rules_for
    from opgraph.passes.autotune_inputs import InputPool

    arrays = InputPool(cp, seed).inputs(case["types"])
    if case["name"] != "stats":
        x = arrays[1] if case["name"] == "dx" else arrays[0]
        st = case["types"][2 if case["name"] == "dx" else 1]
        stats = rules_for(ops.BatchNormStats)["codegen"].kernel(KernelContext(cp, "cuda", {}, st),
                                                                ops.BatchNormStats(), x)
        arrays[2 if case["name"] == "dx" else 1] = stats
    return arrays


def graph_ms(cp, fn, calls: int, repeat: int) -> float:
    """Median milliseconds per call of ``fn``, ``calls`` of it captured into one
    CUDA graph and replayed ``repeat`` times between CUDA events."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # plans, compiled kernels, pool blocks
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            fn()
        graph = stream.end_capture()
        for _ in range(3):
            graph.launch(stream)
        times = []
        for _ in range(repeat):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / calls)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--layout", default="NHWC", choices=["NCHW", "NHWC"])
    ap.add_argument("--calls", type=int, default=20, help="calls captured per graph (default 20)")
    ap.add_argument("--repeat", type=int, default=10, help="timed replays (default 10)")
    ap.add_argument("--blocks", default="264,528,1056,2112,4224",
                    help="TARGET_BLOCKS values to time the reductions with (default %(default)s)")
    ap.add_argument("--json", help="also write every result to this file")
    args = ap.parse_args(argv)

    import cupy as cp

    from opgraph.backends.copy_bandwidth import measure_copy_bandwidth
    from opgraph.backends.cuda.codegen import launch, plan
    from opgraph.backends.registry import KernelContext, rules_for

    copy_gbps = measure_copy_bandwidth("cuda")["gbps"]
    default_blocks = plan.TARGET_BLOCKS
    results = []

    def emit(rec):
        results.append(rec)
        print(json.dumps(rec), flush=True)

    emit({"copy_bandwidth_gbps": copy_gbps, "dtype": args.dtype, "layout": args.layout, "batch": args.batch,
          "default_target_blocks": default_blocks})
    for case in cases(args.batch, args.dtype, args.layout):
        arrays = _inputs(cp, case, seed=0)
        rule = rules_for(type(case["op"]))["codegen"]
        ctx = KernelContext(cp, "cuda", {}, case["out"])
        moved = sum(_nbytes(t) for t in case["types"]) + _nbytes(case["out"])
        for blocks in ([int(b) for b in args.blocks.split(",")] if case["reduction"] else [default_blocks]):
            plan.TARGET_BLOCKS = blocks
            launch._PLANS.clear()
            try:
                ms = graph_ms(cp, lambda: rule.kernel(ctx, case["op"], *arrays), args.calls, args.repeat)
                p = launch.plan_for(case["op"], arrays, case["out"])
                emit({"kernel": case["name"], "shape": case["shape"], "target_blocks": blocks, "ms": ms,
                      "bytes": moved, "gbps": moved / ms / 1e6, "of_copy": moved / ms / 1e6 / copy_gbps,
                      "launches": [{"name": x.name.split("_")[2], "grid": list(x.grid)} for x in p.launches]})
            finally:
                plan.TARGET_BLOCKS = default_blocks
                launch._PLANS.clear()
        x = arrays[1] if case["name"] == "dx" else arrays[0]
        if case["name"] == "stats":  # the ceiling at this size: a copy of x
            dst = cp.empty(x.nbytes, dtype=cp.uint8)  # bytes as x stores them: one memcpy
            ms = graph_ms(cp, lambda: dst.data.copy_from_device_async(x.data, x.nbytes), args.calls, args.repeat)
            emit({"kernel": "copy", "shape": case["shape"], "ms": ms, "bytes": 2 * x.nbytes,
                  "gbps": 2 * x.nbytes / ms / 1e6, "of_copy": 2 * x.nbytes / ms / 1e6 / copy_gbps})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
