"""The generated batch-norm kernels of a ResNet-50 or DenseNet-121 training
step, or ConvNeXt-tiny's layer norms, alone, against the copy bandwidth, with
the reduction split and the loop unrolling swept: what to tune next. Needs a
CUDA GPU and CuPy (exit status 2 without them, or on a bad argument).

The H200 profile of 2026-12-02 puts ResNet-50's remaining gap to
``torch.compile`` + CUDA graphs in the training batch norm's passes, whose
kernels reach 22 % (statistics), 33 % (backward sums) and 45-50 % (apply +
ReLU, dx) of the copy bandwidth. This script times each of them on every
batch-norm input shape of ResNet-50 (batch 128, NHWC, bf16 by default):

* ``stats``: ``BatchNormStats(x)``; ``sums``: ``BatchNormTrainingBackwardSums(x, stats, gy)``;
* ``apply_relu``: the fused ``Relu(BatchNormTraining(x, stats, w, b))``;
* ``dx``: ``BatchNormTrainingBackwardDataFromSums(gy, x, stats, sums, w)``;
* ``copy``: a device-to-device copy of x, the ceiling at that size;

``--model densenet121`` (batch 64) takes DenseNet-121's shapes instead, each
dense layer's input both as it runs there, a channel prefix of its block's
concat buffer (a strided view at a pitch: ``view_of`` > 0), and dense.

``--model convnext_tiny`` (batch 128) times layer norm instead, over the
``(N*H*W, C)`` rows of ConvNeXt-tiny's four stages (C = 96 ... 768, channels
last): ``layer_norm`` (``LayerNorm(x, w, b)``), ``layer_norm_dx``
(``LayerNormBackwardData(gy, x, w)``) and ``copy``; ``--row-sweep 0,1`` times
each both as one kernel and as a reduction and a sweep (``plan.ROW_SWEEP``).

Each is captured ``--calls`` times into one CUDA graph (no Python dispatch in the
measurement), replayed ``--repeat`` times between CUDA events; the median
per call, the bytes a perfect kernel moves (inputs read once, output written
once), GB/s and the fraction of the copy bandwidth measured at the start of
the run (``opgraph.backends.copy_bandwidth``). Each kernel is timed for
every combination of:

* ``--blocks`` (reductions): ``TARGET_BLOCKS`` (``codegen/plan.py``: how many
  blocks a split reduction aims at), which shows whether the split is the limit;
* ``--sweep-blocks`` (element-wise kernels): ``MAX_SWEEP_BLOCKS`` (the most
  blocks a sweep launches: fewer blocks, more vectors per thread);
* ``--unroll``: ``UNROLL`` (``codegen/kernels.py``: the main loops' ``#pragma unroll``);
* ``--tile-bytes`` (channels-last reductions): ``TILE_BYTES`` (the row bytes a
  block owns: 128 narrow tiles, 4096 the widest);
* ``--finish-bytes`` (split reductions): ``FINISH_BYTES`` (a tile's partial
  sums its last block adds itself; 0: always a ``finalize`` launch);
* ``--row-bytes`` (reductions): ``ROW_LOAD_BYTES`` (the bytes of its run a
  thread loads per iteration: rows of channels-last data, vectors of a C-order
  run; 0: one step at a time);
* ``--row-sweep`` (layer norms): ``ROW_SWEEP`` (1: the row sums and the output
  in one kernel where the rows are short; 0: a reduction, then a sweep).

``--dtype`` takes several dtypes, comma-separated (``bfloat16,float32``).

One JSON object per line on stdout (and ``--json`` writes them all).

    python scripts/gpu_codegen_bench.py [--model densenet121] [--dtype bfloat16] [--layout NHWC] [--json out.json]
    python scripts/gpu_codegen_bench.py --model convnext_tiny --dtype bfloat16,float32 --row-sweep 0,1
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from opgraph import ops
from opgraph.ops.fused import FusedElementwise, FusedStep, Program
from opgraph.types import TensorType

#: ResNet-50's batch-norm input shapes (C, H, W) at batch 128: conv1's, then each stage's.
RESNET50_BN = [(64, 112, 112), (64, 56, 56), (256, 56, 56), (128, 56, 56), (128, 28, 28), (512, 28, 28),
               (256, 28, 28), (256, 14, 14), (1024, 14, 14), (512, 14, 14), (512, 7, 7), (2048, 7, 7)]

#: DenseNet-121's batch-norm inputs (C, H, W, channels of the concat buffer the
#: input is a prefix of, 0: a dense tensor) at batch 64: each block's first,
#: middle and last dense layer (their first batch norm reads the block buffer's
#: prefix), the second batch norm of a layer (128 channels, dense), the
#: transitions' and the last batch norm (a whole block buffer).
DENSENET121_BN = [(64, 56, 56, 256), (160, 56, 56, 256), (224, 56, 56, 256), (128, 56, 56, 0), (256, 56, 56, 0),
                  (128, 28, 28, 512), (320, 28, 28, 512), (480, 28, 28, 512), (128, 28, 28, 0), (512, 28, 28, 0),
                  (256, 14, 14, 1024), (640, 14, 14, 1024), (992, 14, 14, 1024), (128, 14, 14, 0),
                  (1024, 14, 14, 0), (512, 7, 7, 1024), (768, 7, 7, 1024), (992, 7, 7, 1024), (128, 7, 7, 0),
                  (1024, 7, 7, 0)]

#: model -> (batch, shapes as (C, H, W, concat-buffer channels or 0))
MODELS = {"resnet50": (128, [(*s, 0) for s in RESNET50_BN]), "densenet121": (64, DENSENET121_BN)}

#: ConvNeXt-tiny's layer-norm inputs (C, H, W) at batch 128, one per stage: each
#: block's, and the downsampling's before the stage's last (N*H*W rows of C)
CONVNEXT_TINY_LN = [(96, 56, 56), (192, 28, 28), (384, 14, 14), (768, 7, 7)]

#: model -> (batch, layer-norm input shapes as (C, H, W))
LAYER_NORM_MODELS = {"convnext_tiny": (128, CONVNEXT_TINY_LN)}

DTYPES = ("float32", "bfloat16", "float16")

APPLY_RELU = FusedElementwise(Program(4, (FusedStep(ops.BatchNormTraining(), (0, 1, 2, 3)),
                                          FusedStep(ops.Relu(), (4,))), (5,)))


def cases(batch: int, dtype: str, layout: str, shapes=None) -> list[dict]:
    """One dict per (op, shape): ``name``, ``shape``, ``op``, ``types`` (the
    inputs: ``'x'`` full size, ``'stats'``/``'sums'`` (2, C) float32 for half
    storage, ``'c'`` (C,)), ``out`` (the output type), ``reduction``, ``family``
    (the knobs it is timed over: ``reduce`` or ``sweep``), ``copy_of`` (the input
    whose copy is timed after it, or None) and ``view_of`` (x is channels
    ``[0, C)`` of a buffer of that many channels; 0: dense). ``shapes``:
    ``(C, H, W, view_of)``, ResNet-50's by default."""
    from opgraph.ops.batchnorm_training import stats_dtype

    out = []
    for c, h, w, view_of in (shapes if shapes is not None else MODELS["resnet50"][1]):
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
                        "reduction": reduction, "family": "reduce" if reduction else "sweep",
                        "copy_of": 0 if name == "stats" else None, "view_of": view_of})
    return out


def layer_norm_cases(batch: int, dtype: str, shapes=CONVNEXT_TINY_LN, eps: float = 1e-6) -> list[dict]:
    """One dict per (op, shape), as :func:`cases` (``family`` ``rows``: timed over
    ``--row-sweep``): ``layer_norm`` (x, weight, bias) and ``layer_norm_dx`` (gy,
    x, weight) over the ``(N*H*W, C)`` rows of each ``(C, H, W)`` of ``shapes``
    (a channels-last value normalised over its channels: C-order rows of C),
    their weights ``(C,)`` in the same dtype (ConvNeXt's, eps 1e-6)."""
    out = []
    for c, h, w in shapes:
        rows, vec = TensorType((batch * h * w, c), dtype), TensorType((c,), dtype)
        for name, op, types in (("layer_norm", ops.LayerNorm(normalized_shape=(c,), eps=eps), (rows, vec, vec)),
                                ("layer_norm_dx", ops.LayerNormBackwardData(normalized_shape=(c,), eps=eps),
                                 (rows, rows, vec))):
            out.append({"name": name, "shape": (batch, c, h, w), "op": op, "types": types, "out": op.infer(*types),
                        "reduction": False, "family": "rows", "copy_of": 0 if name == "layer_norm" else None,
                        "view_of": 0})
    return out


def _as_prefix(cp, x, channels: int):
    """``x``'s values as channels ``[0, C)`` of a new buffer of ``channels``
    channels in ``x``'s storage order (a DenseNet layer's input)."""
    from opgraph.backends.cuda.codegen.launch import empty
    from opgraph.types import is_channels_last

    n, c, h, w = x.shape
    wide = empty(cp, (n, channels, h, w), x.dtype, "NHWC" if is_channels_last(x) else "NCHW")
    view = wide[:, :c]
    view[...] = x
    return view


def _nbytes(t) -> int:
    from opgraph.types import numpy_dtype
    return int(np.prod(t.shape)) * np.dtype(numpy_dtype(t.dtype)).itemsize


def _inputs(cp, case, seed: int):
    """Device inputs: standard normal, the statistics of x where a node reads them."""
    from opgraph.backends.registry import KernelContext, rules_for
    from opgraph.passes.autotune_inputs import InputPool

    arrays = InputPool(cp, seed).inputs(case["types"])
    if case["family"] == "rows":  # layer norm: its operands alone
        return arrays
    if case["view_of"]:
        k = 1 if case["name"] == "dx" else 0
        arrays[k] = _as_prefix(cp, arrays[k], case["view_of"])
    if case["name"] != "stats":
        x = arrays[1] if case["name"] == "dx" else arrays[0]
        st = case["types"][2 if case["name"] == "dx" else 1]
        stats = rules_for(ops.BatchNormStats)["codegen"].kernel(KernelContext(cp, "cuda", {}, st),
                                                                ops.BatchNormStats(), x)
        arrays[2 if case["name"] == "dx" else 1] = stats
    return arrays


def graph_ms(cp, fn, calls: int, repeat: int) -> float:
    """Median milliseconds per call of ``fn``, ``calls`` of it captured into one
    CUDA graph and replayed ``repeat`` times between CUDA events
    (``opgraph.benchmarks.timer.replayed_ms_per_call``)."""
    from opgraph.benchmarks.timer import replayed_ms_per_call
    return replayed_ms_per_call(fn, calls, repeat=repeat)


def _dtypes(text: str) -> list[str]:
    """``--dtype``'s comma-separated dtypes, each one of :data:`DTYPES`."""
    out = text.split(",")
    bad = [d for d in out if d not in DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"dtype {', '.join(bad)} not among {', '.join(DTYPES)}")
    return out


def _ints(minimum: int, allowed=None):
    """argparse type: comma-separated ints, each ``>= minimum`` (and in ``allowed`` where given)."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: comma-separated ints expected") from None
        bad = [v for v in values if v < minimum or (allowed is not None and v not in allowed)]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad}: each must be {' or '.join(map(str, allowed))}" if allowed
                                             else f"{bad}: each must be >= {minimum}")
        return values
    return parse


def _positive(text: str) -> int:
    """argparse type: one int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: an int >= 1 expected") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


#: the knobs each family of models has kernels for (the others would be silently ignored: refused)
BATCH_NORM_ONLY = ("layout", "blocks", "sweep_blocks", "tile_bytes", "finish_bytes")
LAYER_NORM_ONLY = ("row_sweep",)


def _refuse_inapplicable(ap, args, layer_norm: bool) -> None:
    """Exit 2 for a flag the chosen model's kernels do not read (``--row-sweep`` beside a batch-norm
    model, ``--blocks`` ... beside a layer-norm one), rather than running without it."""
    for name in (BATCH_NORM_ONLY if layer_norm else LAYER_NORM_ONLY):
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            ap.error(f"{flag}: the kernels of --model {args.model} do not read it "
                     f"({'batch-norm models only' if layer_norm else 'layer-norm models only'})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50", choices=sorted({**MODELS, **LAYER_NORM_MODELS}),
                    help="whose batch-norm (or layer-norm) shapes (default %(default)s)")
    ap.add_argument("--batch", type=_positive, help="default: 128 (ResNet-50, ConvNeXt-tiny), 64 (DenseNet-121)")
    ap.add_argument("--dtype", default="bfloat16", type=_dtypes,
                    help=f"one or more of {', '.join(DTYPES)}, comma-separated (default %(default)s)")
    ap.add_argument("--layout", default=None, choices=["NCHW", "NHWC"], help="batch-norm models (default NHWC)")
    ap.add_argument("--calls", type=_positive, default=20, help="calls captured per graph (default 20)")
    ap.add_argument("--repeat", type=_positive, default=10, help="timed replays (default 10)")
    ap.add_argument("--blocks", type=_ints(1), default=None,
                    help="TARGET_BLOCKS values to time the reductions with (batch-norm models; "
                         "default 264,528,1056,2112,4224)")
    ap.add_argument("--sweep-blocks", type=_ints(1), default=None,
                    help="MAX_SWEEP_BLOCKS values to time the element-wise kernels with (batch-norm models; "
                         "default 4224)")
    ap.add_argument("--unroll", type=_ints(1), default=[1, 4],
                    help="UNROLL values (codegen/kernels.py) to time every kernel with (default 1,4)")
    ap.add_argument("--tile-bytes", type=_ints(1), default=None,
                    help="TILE_BYTES values to time the reductions with (batch-norm models; default: plan.py's)")
    ap.add_argument("--finish-bytes", type=_ints(0), default=None,
                    help="FINISH_BYTES values to time the reductions with (batch-norm models; default: plan.py's)")
    ap.add_argument("--row-bytes", type=_ints(0), default=None,
                    help="ROW_LOAD_BYTES values (codegen/plan.py) to time the reductions with (default: plan.py's)")
    ap.add_argument("--row-sweep", type=_ints(0, allowed=(0, 1)), default=None,
                    help="ROW_SWEEP values (codegen/plan.py; 1 one kernel, 0 two) to time the layer norms with "
                         "(layer-norm models; default: plan.py's)")
    ap.add_argument("--json", help="also write every result to this file")
    args = ap.parse_args(argv)
    layer_norm = args.model in LAYER_NORM_MODELS
    _refuse_inapplicable(ap, args, layer_norm)
    batch, shapes = (LAYER_NORM_MODELS if layer_norm else MODELS)[args.model]
    batch = args.batch or batch
    layout = args.layout or "NHWC"
    from opgraph.backends.device import cuda_status
    ok, why = cuda_status()
    if not ok:
        ap.exit(2, f"{ap.prog}: error: it times CUDA kernels: it needs an NVIDIA GPU and CuPy; here: {why}\n")

    import cupy as cp

    from opgraph.backends.copy_bandwidth import measure_copy_bandwidth
    from opgraph.backends.cuda.codegen import kernels, launch, plan
    from opgraph.backends.registry import KernelContext, rules_for

    copy_gbps = measure_copy_bandwidth("cuda")["gbps"]
    knobs = ((plan, "TARGET_BLOCKS"), (plan, "MAX_SWEEP_BLOCKS"), (kernels, "UNROLL"), (plan, "TILE_BYTES"),
             (plan, "FINISH_BYTES"), (plan, "ROW_LOAD_BYTES"), (plan, "ROW_SWEEP"))
    defaults = tuple(getattr(m, name) for m, name in knobs)
    default_blocks, default_sweep, default_unroll, default_tile, default_finish, default_rows, default_rs = defaults

    def values(given, default):
        return given if given else [default]

    def set_knobs(variant):
        for (m, name), v in zip(knobs, variant):
            setattr(m, name, v)
    results = []

    def emit(rec):
        results.append(rec)
        print(json.dumps(rec), flush=True)

    emit({"copy_bandwidth_gbps": copy_gbps, "model": args.model, "dtype": ",".join(args.dtype),
          "layout": None if layer_norm else layout, "batch": batch, "default_target_blocks": default_blocks,
          "default_sweep_blocks": default_sweep, "default_unroll": default_unroll, "default_tile_bytes": default_tile,
          "default_finish_bytes": default_finish, "default_row_bytes": default_rows, "default_row_sweep": default_rs})
    unrolls = args.unroll
    variants = {
        "reduce": [(b, default_sweep, u, t, f, r, default_rs) for u in unrolls
                   for b in args.blocks or [264, 528, 1056, 2112, 4224]
                   for t in values(args.tile_bytes, default_tile) for f in values(args.finish_bytes, default_finish)
                   for r in values(args.row_bytes, default_rows)],
        "sweep": [(default_blocks, b, u, default_tile, default_finish, default_rows, default_rs)
                  for u in unrolls for b in args.sweep_blocks or [4224]],
        "rows": [(default_blocks, default_sweep, u, default_tile, default_finish, r, bool(rs)) for u in unrolls
                 for r in values(args.row_bytes, default_rows) for rs in values(args.row_sweep, int(default_rs))]}
    for dtype in args.dtype:
        for case in (layer_norm_cases(batch, dtype, shapes) if layer_norm else
                     cases(batch, dtype, layout, shapes)):
            arrays = _inputs(cp, case, seed=0)
            rule = rules_for(type(case["op"]))["codegen"]
            ctx = KernelContext(cp, "cuda", {}, case["out"])
            moved = sum(_nbytes(t) for t in case["types"]) + _nbytes(case["out"])
            for variant in variants[case["family"]]:
                blocks, sweep_blocks, unroll, tile_bytes, finish_bytes, row_bytes, row_sweep = variant
                set_knobs(variant)
                launch._PLANS.clear()
                try:
                    ms = graph_ms(cp, lambda: rule.kernel(ctx, case["op"], *arrays), args.calls, args.repeat)
                    p = launch.plan_for(case["op"], arrays, case["out"])
                    emit({"kernel": case["name"], "dtype": dtype, "shape": case["shape"], "view_of": case["view_of"],
                          "target_blocks": blocks, "sweep_blocks": sweep_blocks, "unroll": unroll,
                          "tile_bytes": tile_bytes, "finish_bytes": finish_bytes, "row_bytes": row_bytes,
                          "row_sweep": int(row_sweep), "ms": ms, "bytes": moved, "gbps": moved / ms / 1e6,
                          "of_copy": moved / ms / 1e6 / copy_gbps,
                          "launches": [{"name": x.name.split("_")[2], "grid": list(x.grid)} for x in p.launches]})
                finally:
                    set_knobs(defaults)
                    launch._PLANS.clear()
            if case["copy_of"] is not None:  # the ceiling at this size: a copy of x
                x = arrays[case["copy_of"]]
                dst = cp.empty(x.nbytes, dtype=cp.uint8)  # bytes as x stores them: one memcpy
                ms = graph_ms(cp, lambda: dst.data.copy_from_device_async(x.data, x.nbytes), args.calls, args.repeat)
                emit({"kernel": "copy", "dtype": dtype, "shape": case["shape"], "view_of": case["view_of"], "ms": ms,
                      "bytes": 2 * x.nbytes,
                      "gbps": 2 * x.nbytes / ms / 1e6, "of_copy": 2 * x.nbytes / ms / 1e6 / copy_gbps})
    if args.json:
        from opgraph.atomic_file import write_atomic
        write_atomic(args.json, json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
