"""The bfloat16 max-pool ``tile`` variant against the existing ``vector`` kernels,
on GoogLeNet's (batch 128) and VGG-A's (batch 64) pooling shapes, channels-last.

Three kernels per shape, the three a bfloat16 training step runs for a max pool
(the ``pool-argmax`` rewrite: ``MaxPool2dArgmax``, ``MaxPool2dTake`` and
``MaxPool2dBackwardIndices``):

* ``scan``: each window's winner as a 1-byte index, with the ReLU mark (relu=True):
  ``pool_vector.max_pool2d_argmax``; the existing variants are the pair scan
  with 1, 2 and 4 output columns per thread (``pixels``), the new one the tile
  scan (``tile=True``, ``_scan_tile``);
* ``gather``: the input gradient from those indices (masked=True):
  ``pool_vector.max_pool2d_backward_indices``; existing: the pair gather, new:
  the tile gather (``_gather_tile``);
* ``take``: y = x at those indices (masked=True): ``pool_vector.max_pool2d_take``;
  existing: the bits take (``_take_bits``), new: the tile take (``_take_tile``,
  x staged as the tile scan stages it).

For each shape and kernel, first the outputs are compared bit for bit (bytes of
the indices, bits of the bfloat16 gradients): on the timed data (a ReLU's
output: half zeros, so ties and marked windows), then on hard values (few
distinct values with -0.0/+0.0, -inf windows, NaN lanes; gradients with -0.0,
+-inf and NaN), both with and without the ReLU mark (masked and unmasked);
then each kernel is timed: ``--calls`` launches captured into one CUDA graph,
the graph replayed through ``opgraph.benchmarks.timer.replayed_ms_per_call`` (CUDA events,
median of 20 after 3 warm-ups), divided by the calls (so Python dispatch is not
timed); ``eager_ms`` is the same kernel launched from Python each call (as
``docs/results/h200-2026-12-04c/ncu_pool.py`` timed it: Python overhead included).

Bytes (a perfect kernel): the scan reads x once and writes the indices (1 byte
per pooled element); the gather reads the indices and gy and writes gx; the
take reads the indices and x once and writes y. The
copy bandwidth they are measured against is the H200's measured device copy,
4.23 TB/s (``--copy-tbps``); the target is 60 % for each.

Output: one JSON object per line on stdout. The first (``"what": "run"``)
says what the fields mean; then one per shape and kernel (``"what": "kernel"``);
the last (``"what": "summary"``): whether every output was bit-for-bit equal,
and the speed-ups (exit status 1 if any output differed). Expected 40-60 s on
an H200 with an empty CuPy kernel cache, most of it NVRTC compiling the kernels; the
hard-value checks of the shapes reached after ``--budget`` seconds are skipped
(``"hard": null``) so that the run stays under a minute.

    python scripts/pool_variant_bench.py [--calls 10] [--sweep] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

from opgraph.backends.cuda.pool_vector_tile import tile_smem
from opgraph.benchmarks.timer import replayed_ms_per_call

#: (model, layer, x shape (N, C, H, W), kernel, stride, padding, ceil_mode): every max pool
#: of opgraph's GoogLeNet (batch 128: its 3x3/2 pools pad 1) and VGG-A (batch 64), then
#: torchvision's ceil_mode geometry of GoogLeNet's 3x3/2 pools (the same extents, windows
#: one cell further) and a 3x3/1 pool on 14x14x832, which opgraph's GoogLeNet does not have
SHAPES = [
    ("googlenet", "pool1", (128, 64, 112, 112), 3, 2, 1, False),
    ("googlenet", "pool2", (128, 192, 56, 56), 3, 2, 1, False),
    ("googlenet", "pool3", (128, 480, 28, 28), 3, 2, 1, False),
    ("googlenet", "pool4", (128, 832, 14, 14), 3, 2, 1, False),
    ("googlenet", "inception 3a pool", (128, 192, 28, 28), 3, 1, 1, False),
    ("googlenet", "inception 3b pool", (128, 256, 28, 28), 3, 1, 1, False),
    ("googlenet", "inception 4a pool", (128, 480, 14, 14), 3, 1, 1, False),
    ("googlenet", "inception 4b-4d pool", (128, 512, 14, 14), 3, 1, 1, False),
    ("googlenet", "inception 4e pool", (128, 528, 14, 14), 3, 1, 1, False),
    ("googlenet", "inception 5a/5b pool", (128, 832, 7, 7), 3, 1, 1, False),
    ("vgg_a", "pool1", (64, 64, 224, 224), 2, 2, 0, False),
    ("vgg_a", "pool2", (64, 128, 112, 112), 2, 2, 0, False),
    ("vgg_a", "pool3", (64, 256, 56, 56), 2, 2, 0, False),
    ("vgg_a", "pool4", (64, 512, 28, 28), 2, 2, 0, False),
    ("vgg_a", "pool5", (64, 512, 14, 14), 2, 2, 0, False),
    ("googlenet (torchvision ceil_mode)", "pool2", (128, 192, 56, 56), 3, 2, 0, True),
    ("googlenet (torchvision ceil_mode)", "pool3", (128, 480, 28, 28), 3, 2, 0, True),
    ("googlenet (torchvision ceil_mode)", "pool4", (128, 832, 14, 14), 3, 2, 0, True),
    ("extra", "3x3/1 pad 1 on 14x14x832", (128, 832, 14, 14), 3, 1, 1, False),
]

FIELDS = {
    "model, layer": "the pool: opgraph's GoogLeNet (batch 128) or VGG-A (batch 64), then torchvision's ceil_mode "
                    "geometry of GoogLeNet's 3x3/2 pools and one extra shape; bfloat16, channels-last (NHWC)",
    "x": "the pool's input (N, C, H, W); pooled: its output (N, C, OH, OW)",
    "window": "kernel/stride, padding, ceil_mode",
    "kernel": "scan = window winners as 1-byte indices with the ReLU mark (MaxPool2dArgmax relu=True); "
              "gather = input gradient from the indices (MaxPool2dBackwardIndices masked=True); "
              "take = x at the indices (MaxPool2dTake masked=True)",
    "bytes": "what a perfect kernel moves: scan x + indices; gather indices + gy + gx; take indices + x + y",
    "existing_ms": "per existing variant (scan: pair kernel with pixels=1, 2, 4; gather: pair kernel; "
                   "take: bits kernel): "
                   "ms per call, CUDA graph of --calls launches, median of 20 replays after 3 warm-ups",
    "best_existing": "the fastest existing variant and its ms (what autotune would have taken before)",
    "tile_ms": "the new tile variant, timed the same way; tile: its (rows, cols, channel groups)",
    "speedup": "best existing ms / tile ms (> 1: the tile variant is faster and autotune will take it)",
    "copy_fraction_existing, copy_fraction_tile": "bytes / ms against the copy bandwidth (target >= 0.60)",
    "eager_ms": "the first existing kernel (pixels=1 pair scan, pair gather, bits take) and the tile kernel "
                "launched from Python each call (ncu_pool.py's way)",
    "exact": "tile output == existing output bit for bit: 'timed' on the timed data, 'hard' on -0/+0, "
             "-inf windows and NaN lanes with and without the ReLU mark / masking (null: skipped for time)",
    "sweep": "(--sweep only) ms of other tiles 'rows x cols x channel groups', each checked bit for bit first",
}


#: the tile kernels' kinds (``pool_vector.tile_shape``) of the benchmarked kernels
TILE_KINDS = {"scan": "arg", "gather": "bwd", "take": "take"}


def _geometry(shape, k, s, p, ceil):
    from opgraph.backends.cuda.pool import _called  # the geometry of a call outside a graph
    return _called(shape, k, s, p, ceil)


def _nhwc(cp, shape, dtype):
    from opgraph.backends.cuda.codegen.launch import empty
    return empty(cp, shape, dtype, "NHWC")


def _relu_like(cp, shape, seed):
    """A ReLU's output in bfloat16 bits: |normal| with half the values +0.0."""
    from opgraph.backends.cuda.storage import bits
    a = _nhwc(cp, shape, "bfloat16")
    rs = cp.random.RandomState(seed)
    v = rs.standard_normal(shape, dtype=cp.float32)
    v = cp.where(rs.random_sample(shape, dtype=cp.float32) < 0.5, cp.float32(0), cp.abs(v))
    bits(cp, a)[...] = (v.view(cp.uint32) >> 16).astype(cp.uint16)  # truncated to bfloat16: exact values
    return a


def _hard(cp, shape, seed, gradient=False):
    """Few distinct bfloat16 values (ties), -0.0 and +0.0, -inf regions (whole windows),
    NaN in single lanes; ``gradient``: normal values with -0.0, +-inf and NaN among them."""
    from opgraph.backends.cuda.storage import bits
    a = _nhwc(cp, shape, "bfloat16")
    rs = cp.random.RandomState(seed)
    if gradient:
        table = cp.asarray([0x8000, 0x0000, 0x3f00, 0xc000, 0x4040, 0x7f80, 0xff80, 0x7fc0], cp.uint16)
        normal = (rs.standard_normal(shape, dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
        pick = table[rs.randint(0, len(table), shape)]
        bits(cp, a)[...] = cp.where(rs.random_sample(shape, dtype=cp.float32) < 0.6, normal, pick)
        return a
    table = cp.asarray([0x8000, 0x0000, 0xbf80, 0x3f80, 0x4000, 0x7f80, 0xff80], cp.uint16)  # -0 +0 -1 1 2 inf -inf
    b = bits(cp, a)
    b[...] = table[rs.randint(0, len(table), shape)]
    b[0, :, :5, :5] = 0xff80
    b[-1, :, -4:, -4:] = 0x8000
    nan = rs.random_sample(shape, dtype=cp.float32) < 1e-3
    b[...] = cp.where(nan, cp.uint16(0x7fc0), b)
    return a


def _signalling(cp, a):
    """A copy of bfloat16 ``a`` with its NaNs signalling (0x7fc0 → 0x7f81) in every other image."""
    from opgraph.backends.cuda.storage import bits
    out = _nhwc(cp, a.shape, "bfloat16")
    b = bits(cp, out)
    b[...] = bits(cp, a)
    b[::2] = cp.where(b[::2] == 0x7fc0, cp.uint16(0x7f81), b[::2])
    return out


def _equal(cp, a, b) -> bool:
    from opgraph.backends.cuda.storage import bits
    return bool(cp.array_equal(bits(cp, a), bits(cp, b)))


def _eager_ms(fn) -> float:
    from opgraph.benchmarks.timer import time_calls
    return statistics.median(time_calls(fn, warmup=3, repeat=20, device="cuda"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10, help="launches per captured graph (default 10)")
    ap.add_argument("--copy-tbps", type=float, default=4.23, help="copy bandwidth, TB/s (default 4.23: H200)")
    ap.add_argument("--budget", type=float, default=35.0,
                    help="seconds after which the hard-value checks are skipped (default 35)")
    ap.add_argument("--sweep", action="store_true",
                    help="also time other tiles (rows, columns or channel groups halved, rows doubled): "
                         "the sweep field; about a minute more")
    ap.add_argument("--json", help="also write the lines to this file")
    args = ap.parse_args(argv)

    import cupy as cp

    from opgraph.backends.cuda import pool_vector as pv

    start = time.perf_counter()
    lines = []

    def emit(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        lines.append(line)

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    emit({"what": "run", "script": "scripts/pool_variant_bench.py", "device": props["name"].decode(),
          "pool_vector_revision": pv.REVISION, "copy_tbps": args.copy_tbps, "calls_per_graph": args.calls,
          "fields": FIELDS})
    all_exact, speedups = True, {"scan": [], "gather": [], "take": []}
    for model, layer, shape, k, s, p, ceil in SHAPES:
        g = _geometry(shape, k, s, p, ceil)
        n, c, h, w = shape
        pooled = (n, c, *g.out)
        x = _relu_like(cp, shape, 1)
        gy = _relu_like(cp, pooled, 2)  # any values: the gather's time does not depend on them
        arg = cp.empty((n, *g.out, c), dtype=cp.uint8)
        arg_t = cp.empty_like(arg)
        gx, gx_t = _nhwc(cp, shape, "bfloat16"), _nhwc(cp, shape, "bfloat16")
        y, y_t = _nhwc(cp, pooled, "bfloat16"), _nhwc(cp, pooled, "bfloat16")
        scans = {f"pixels={q}": (lambda q=q: pv._forward(cp, "arg", x, arg, g, relu=True, pixels=q))
                 for q in pv.PIXELS}
        scan_tile = lambda: pv._forward(cp, "arg", x, arg_t, g, relu=True, tile=True)  # noqa: E731
        gathers = {"pair": lambda: pv._backward(cp, "bwd", [arg], gy, gx, g, masked=True)}
        gather_tile = lambda: pv._backward(cp, "bwd", [arg], gy, gx_t, g, masked=True, tile=True)  # noqa: E731
        takes = {"bits": lambda: pv._forward(cp, "take", x, y, g, before=[arg], masked=True)}
        take_tile = lambda: pv._forward(cp, "take", x, y_t, g, before=[arg], masked=True, tile=True)  # noqa: E731
        results = {"scan": (arg, arg_t), "gather": (gx, gx_t), "take": (y, y_t)}
        window = f"{k}x{k}/{s} pad {p}{' ceil' if ceil else ''}"
        cv = c // pv.lanes("bfloat16")
        for kernel, existing, tile_fn, nbytes in (
                ("scan", scans, scan_tile, n * h * w * c * 2 + math.prod(pooled)),
                ("gather", gathers, gather_tile, math.prod(pooled) * 3 + n * h * w * c * 2),
                ("take", takes, take_tile, math.prod(pooled) * 3 + n * h * w * c * 2)):
            # exactness on the timed data (the scan's indices feed the gathers and the takes)
            next(iter(existing.values()))()
            tile_fn()
            exact = {"timed": _equal(cp, *results[kernel]), "hard": None}
            if time.perf_counter() - start < args.budget:
                exact["hard"] = _hard_check(cp, pv, kernel, shape, pooled, g)
            all_exact &= exact["timed"] and exact["hard"] is not False
            times = {name: replayed_ms_per_call(fn, args.calls) for name, fn in existing.items()}
            tile_ms = replayed_ms_per_call(tile_fn, args.calls)
            best = min(times, key=times.get)
            tbps = args.copy_tbps * 1e12
            t = pv.tile_shape(TILE_KINDS[kernel], (k, k, s, s), pv.tile_extent(TILE_KINDS[kernel], g), cv)
            speedups[kernel].append(times[best] / tile_ms)
            sweep = _sweep(cp, pv, args, kernel, t, (k, k, s, s), cv, x, arg, gy, results, g) \
                if args.sweep else None
            all_exact &= sweep is None or "NOT EXACT" not in sweep.values()
            emit({"what": "kernel", "model": model, "layer": layer, "x": list(shape), "pooled": list(pooled),
                  "window": window, "kernel": kernel, "bytes": nbytes,
                  "existing_ms": {name: round(v, 5) for name, v in times.items()},
                  "best_existing": [best, round(times[best], 5)], "tile_ms": round(tile_ms, 5),
                  "tile": [t.rows, t.cols, t.groups], "speedup": round(times[best] / tile_ms, 3),
                  "copy_fraction_existing": round(nbytes / (times[best] * 1e-3) / tbps, 3),
                  "copy_fraction_tile": round(nbytes / (tile_ms * 1e-3) / tbps, 3),
                  "eager_ms": {"existing": round(_eager_ms(next(iter(existing.values()))), 5),
                               "tile": round(_eager_ms(tile_fn), 5)},
                  "exact": exact, **({"sweep": sweep} if sweep is not None else {})})
        del x, gy, arg, arg_t, gx, gx_t, y, y_t, scans, gathers, takes, scan_tile, gather_tile, take_tile, results
        cp.get_default_memory_pool().free_all_blocks()
    geo = {k: round(math.exp(statistics.fmean(map(math.log, v))), 3) for k, v in speedups.items() if v}
    emit({"what": "summary", "all_bit_exact": all_exact,
          "geomean_speedup": geo, "min_speedup": {k: round(min(v), 3) for k, v in speedups.items() if v},
          "seconds": round(time.perf_counter() - start, 1),
          "reading": "speedup > 1: the tile variant wins that shape in autotune; all_bit_exact must be true "
                     "(else the tile kernels are wrong on this GPU and must not be offered)"})
    if args.json:
        with open(args.json, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0 if all_exact else 1


def _alternatives(pv, kind, t, window, cv):
    """Other tiles than ``t``: rows, columns or channel groups halved, rows doubled
    (the gather's rows and columns multiples of the stride; at most 48 KiB, the
    static shared memory of a block)."""
    step = (window[2], window[3]) if kind == "bwd" else (1, 1)

    def fit(n, s):
        return max(s, n // s * s)
    groups = max(d for d in range(1, max(1, t.groups // 2) + 1) if cv % d == 0)
    out = []
    for alt in (pv.TileShape(fit(t.rows // 2, step[0]), t.cols, t.groups),
                pv.TileShape(fit(t.rows * 2, step[0]), t.cols, t.groups),
                pv.TileShape(t.rows, fit(t.cols // 2, step[1]), t.groups),
                pv.TileShape(t.rows, t.cols, groups)):
        if alt != t and alt not in out and tile_smem(kind, window, alt) <= 48 * 1024:
            out.append(alt)
    return out


def _sweep(cp, pv, args, kernel, t, window, cv, x, arg, gy, results, g) -> dict:
    """ms of each of :func:`_alternatives`' tiles, checked bit for bit first
    (``results[kernel]``: the existing kernel's output and the tile kernel's)."""
    out = {}
    want, got = results[kernel]
    for alt in _alternatives(pv, TILE_KINDS[kernel], t, window, cv):
        if kernel == "scan":
            def fn(alt=alt):
                pv._forward(cp, "arg", x, got, g, relu=True, tile=alt)
        elif kernel == "take":
            def fn(alt=alt):
                pv._forward(cp, "take", x, got, g, before=[arg], masked=True, tile=alt)
        else:
            def fn(alt=alt):
                pv._backward(cp, "bwd", [arg], gy, got, g, masked=True, tile=alt)
        fn()
        same = _equal(cp, want, got)
        timed = round(replayed_ms_per_call(fn, args.calls), 5) if same else "NOT EXACT"
        out[f"{alt.rows}x{alt.cols}x{alt.groups}"] = timed
    return out


def _hard_check(cp, pv, kernel, shape, pooled, g) -> bool:
    """The tile kernel against the existing kernel on hard values, with and without
    the ReLU mark (scan) or the masking (gather; take: x with signalling NaNs,
    which both quiet, at the indices with and without the mark), bit for bit."""
    n, c = shape[:2]
    x = _hard(cp, shape, 3)
    ok = True
    for flag in (True, False):
        a = pv.max_pool2d_argmax(cp, x, g, relu=flag)
        if kernel == "scan":
            ok &= _equal(cp, a, pv.max_pool2d_argmax(cp, x, g, relu=flag, tile=True))
            continue
        if kernel == "take":
            xs = _signalling(cp, x)
            for masked in (True, False):
                ok &= _equal(cp, pv.max_pool2d_take(cp, xs, a, g, masked=masked),
                             pv.max_pool2d_take(cp, xs, a, g, masked=masked, tile=True))
            continue
        gy = _hard(cp, pooled, 4, gradient=True)
        ok &= _equal(cp, pv.max_pool2d_backward_indices(cp, a, gy, g, shape, masked=flag),
                     pv.max_pool2d_backward_indices(cp, a, gy, g, shape, masked=flag, tile=True))
    return ok


if __name__ == "__main__":
    sys.exit(main())
