"""The classifiers' flatten copies, tiled against the element kernel, beside a plain device copy.

For each shape of :data:`SHAPES` (the ``Flatten`` input of AlexNet and OverFeat at batch 128
and VGG-A at batch 64, as ``opgraph-bench`` builds them) in ``--dtype`` (default bfloat16, moved
as its 16 bits), both directions of the step:

* ``flatten`` (forward): the NHWC activation copied into C order, as ``torch.flatten`` gives it;
* ``reshape`` (backward): the C-ordered ``(N, C*H*W)`` gradient copied back into NHWC;

four ways:

* ``tiled``: ``codegen.copies.copy_into``, the shared-memory tiled transpose (``TILED = True``);
* ``element``: the same call with ``copies.TILED = False``, the element kernel that ran before
  (one element per thread in the destination's order, the source read at its stride);
* ``cupy``: ``cupy.copyto`` of the same strided views (CuPy's own element-wise copy: what the
  executor's ``to_layout`` ran for the backward ``Reshape`` before it wrote NHWC itself);
* ``memcpy``: a device-to-device copy (``cudaMemcpyAsync``) of the same bytes between two
  dense buffers: the ceiling for this size, measured in the same run.

Each result is first checked bit for bit against the source (the destination filled with
0xFF bytes first; ``memcpy`` excepted), then timed as the profile times a step: ``--calls``
copies captured into one CUDA graph, the graph replayed ``--warmup`` times untimed and
``--repeat`` times (default 100) between CUDA events, each replay divided by the calls;
reported: the median and the interquartile range of those per-call times.

Fields: ``bytes`` (read and written: 2 x the tensor), ``gbps``, ``of_copy`` (the fraction of
the device's copy bandwidth, ``copy_bandwidth.measure_copy_bandwidth``: 1 GiB, measured in the
run; the issue's target is 0.6), ``of_memcpy`` (the same-bytes ``memcpy``'s time over this
one's), ``profile_ms`` (the step in the H200 profile of 2026-12-04,
``docs/results/h200-2026-12-04/call1-b-profile-bf16-*.json``, bf16, before the tiled kernel).

Output: one JSON object per line: ``"what": "run"`` (device, copy bandwidth, what the fields
mean), then ``"what": "copy"`` per shape, direction and way (and a ``"what": "pair"`` line: the
tiled kernel's speed-up over the element kernel and fraction of the copy bandwidth), then ``"what": "summary"``
(every result correct?, per way the summed median ms and fraction of the copy bandwidth).
Exit status 1 if a result is wrong, 2 without a GPU or on a bad argument. About 10 s on an
H200 (most of it NVRTC compiling the kernels once).

    python scripts/copy_bench.py [--models alexnet,overfeat,vgg_a] [--dtype bfloat16] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from opgraph.benchmarks.timer import replayed_times_per_call

#: model -> (Flatten input (N, C, H, W), profile ms of the flatten, of its gradient's reshape)
SHAPES = {
    "alexnet": ((128, 256, 6, 6), 0.006299, 0.007128),
    "overfeat": ((128, 1024, 6, 6), 0.020732, 0.024020),
    "vgg_a": ((64, 512, 7, 7), 0.007964, 0.009550),
}
#: storage dtype -> the unsigned type of its bits (the copy moves bits)
BITS = {"bfloat16": "uint16", "float16": "uint16", "float32": "uint32", "float64": "uint64"}
WAYS = ("tiled", "element", "cupy", "memcpy")


def parse(argv=None):
    """The arguments (``ap.error``, exit 2, on a bad one)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(SHAPES), help=f"models, comma-separated (default {','.join(SHAPES)})")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(BITS))
    ap.add_argument("--calls", type=int, default=20, help="copies per captured graph (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed replays first (default 3)")
    ap.add_argument("--repeat", type=int, default=100, help="timed replays, at least 50 (default 100)")
    ap.add_argument("--json", help="also write the lines to this file")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in SHAPES]
    if not models or unknown:
        ap.error(f"--models {args.models!r}: give some of {', '.join(SHAPES)}")
    if args.calls < 1:
        ap.error(f"--calls {args.calls}: must be at least 1")
    if args.warmup < 0:
        ap.error(f"--warmup {args.warmup}: must be 0 or more")
    if args.repeat < 50:
        ap.error(f"--repeat {args.repeat}: must be at least 50 (median and quartiles of the replays)")
    args.models = models
    return ap, args


def quartiles(times) -> tuple[float, float, float]:
    """``(q1, median, q3)`` of ``times`` (inclusive method: within the samples' range)."""
    q1, q2, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, q2, q3


def memcpy(cp, dst, src) -> None:
    """``src``'s bytes into ``dst`` (dense, same size): one ``cudaMemcpyAsync`` on the current stream."""
    dst.data.copy_from_device_async(src.data, src.nbytes)


def main(argv=None) -> int:
    ap, args = parse(argv)
    try:
        import cupy as cp
    except ImportError as e:
        ap.exit(2, f"{ap.prog}: error: it times CUDA kernels: it needs an NVIDIA GPU and CuPy "
                   f"(pip install -e \".[bench,cuda13]\", or cuda12); here: {e}\n")
    from opgraph.backends.device import cuda_status
    usable, why = cuda_status()
    if not usable:
        ap.exit(2, f"{ap.prog}: error: it times CUDA kernels: it needs an NVIDIA GPU; here: {why}\n")

    from opgraph.backends.copy_bandwidth import measure_copy_bandwidth
    from opgraph.backends.cuda.codegen import copies

    lines = []

    def emit(rec):
        lines.append(rec)
        print(json.dumps(rec), flush=True)

    copy_gbps = measure_copy_bandwidth("cuda")["gbps"]
    emit({"what": "run", "device": why, "dtype": args.dtype, "copy_gbps": copy_gbps, "calls": args.calls,
          "repeat": args.repeat, "fields": "ms: median per-call time of the replays (graph of `calls` copies), "
          "iqr_ms: its quartiles; bytes: read + written; of_copy: bytes / ms / copy_gbps; "
          "of_memcpy: the same bytes' memcpy ms / ms; profile_ms: the step in the 2026-12-04 H200 profile"})
    bits = getattr(cp, BITS[args.dtype])
    full = np.iinfo(np.dtype(BITS[args.dtype])).max  # 0xFF bytes: what no correct copy leaves
    ok = True
    totals = {way: 0.0 for way in WAYS}
    moved = 0
    for model in args.models:
        (n, c, h, w), *profile = SHAPES[model]
        rs = cp.random.RandomState(n * c + h)
        logical = rs.randint(0, 2 ** 31 - 1, size=(n, c, h, w)).astype(bits)  # random bit patterns
        nhwc = cp.ascontiguousarray(logical.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        c_order = cp.ascontiguousarray(logical)
        nbytes = 2 * logical.nbytes
        for direction, src, make_dst, before in (
                ("flatten", nhwc, lambda: cp.empty((n, c, h, w), bits), profile[0]),
                ("reshape", c_order, lambda: cp.empty((n, h, w, c), bits).transpose(0, 3, 1, 2), profile[1])):
            moved += nbytes
            dst = make_dst()
            flat_src, flat_dst = cp.ascontiguousarray(src), cp.empty(src.size, bits)

            def tiled(dst=dst, src=src):
                copies.TILED = True
                copies.copy_into(cp, dst, src)

            def element(dst=dst, src=src):
                copies.TILED = False
                copies.copy_into(cp, dst, src)

            ways = {"tiled": tiled, "element": element,
                    "cupy": lambda dst=dst, src=src: cp.copyto(dst, src),
                    "memcpy": lambda a=flat_dst, b=flat_src: memcpy(cp, a, b)}
            results = {}
            for way, fn in ways.items():
                good = None
                if way != "memcpy":
                    dst.fill(full)
                    fn()
                    good = bool((dst == logical).all())
                    ok &= good
                times = replayed_times_per_call(fn, args.calls, warmup=args.warmup, repeat=args.repeat)
                results[way] = (good, quartiles(times))
            memcpy_ms = results["memcpy"][1][1]
            for way, (good, (q1, ms, q3)) in results.items():
                totals[way] += ms
                emit({"what": "copy", "model": model, "shape": [n, c, h, w], "direction": direction, "way": way,
                      "ms": ms, "iqr_ms": [q1, q3], "bytes": nbytes, "gbps": nbytes / ms / 1e6,
                      "of_copy": nbytes / ms / 1e6 / copy_gbps, "of_memcpy": memcpy_ms / ms, "correct": good,
                      "profile_ms": before})
            emit({"what": "pair", "model": model, "direction": direction,
                  "speedup_tiled_over_element": results["element"][1][1] / results["tiled"][1][1],
                  "tiled_of_copy": nbytes / results["tiled"][1][1] / 1e6 / copy_gbps})
    copies.TILED = True
    emit({"what": "summary", "correct": ok, "bytes": moved, "ms": totals,
          "of_copy": {way: moved / ms / 1e6 / copy_gbps for way, ms in totals.items()}})
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
