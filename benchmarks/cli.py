"""``opgraph-bench``: summarise or time the benchmark models.

Examples::

    opgraph-bench                                  # the four ImageNet winners, forward, CPU or GPU
    opgraph-bench --model alexnet --device cpu     # one model, timed at the CPU default batch
    opgraph-bench --model all --summary            # per-layer shapes, params, GFLOP of all nine
    opgraph-bench --model L2 --batch 8 --format json --output l2.json

Exit status: 0 on success, 2 on a usage error (unknown model, bad number),
1 when building, compiling or running a model fails.
"""

from __future__ import annotations

import argparse
import sys
import time

from opgraph.analysis import summarize, totals
from opgraph.errors import OpgraphError

from . import driver, report
from .models import LAYERS, MODELS, SEED_BATCHES, WINNERS, build, resolve

#: Names of model groups accepted by --model.
GROUPS = {"all": WINNERS + LAYERS, "winners": WINNERS, "layers": LAYERS}


def parse_models(text: str) -> list[str]:
    """``--model`` value -> registry names: comma-separated names, aliases
    (``overfeat_fast``, ``googlenet_v1``) or groups (``all``, ``winners``,
    ``layers``), case-insensitive, duplicates dropped.

    Raises:
        argparse.ArgumentTypeError: an unknown name (argparse exits with 2).
    """
    names: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.lower() in GROUPS:
            found = list(GROUPS[part.lower()])
        else:
            try:
                found = [resolve(part)]
            except KeyError:
                raise argparse.ArgumentTypeError(
                    f"unknown model {part!r}; choose from {', '.join(MODELS)}, the aliases "
                    f"overfeat_fast and googlenet_v1, or the groups {', '.join(GROUPS)}") from None
        names += [n for n in found if n not in names]
    if not names:
        raise argparse.ArgumentTypeError("no model given")
    return names


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {minimum}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opgraph-bench",
        description="Time or summarise the ImageNet-winner models (AlexNet, OverFeat-fast, "
                    "VGG-A, GoogLeNet v1) and the single-convolution layers L1-L5 of "
                    "convnet-benchmarks, built as opgraph graphs.",
        epilog="Without --summary, each model is compiled (--pipeline, --policy) and its "
               "forward pass is timed (ms per mini-batch, median and min over --repeat calls "
               "after --warmup calls).")
    p.add_argument("--model", type=parse_models, default=list(WINNERS), metavar="NAME[,NAME]",
                   help="alexnet, overfeat, vgg_a, googlenet, L1..L5, or a group: all (all "
                        "nine), winners (the four models, the default), layers (L1-L5)")
    p.add_argument("--batch", type=_count(1), default=None,
                   help="mini-batch size (default: the seed's 128 / 64 for --summary and on a "
                        f"GPU; {driver.CPU_DEFAULT_BATCH} for timing on the CPU)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the GPU if CuPy sees one, else the CPU (default)")
    p.add_argument("--dtype", choices=("float32", "float64", "float16"), default="float32")
    p.add_argument("--summary", action="store_true",
                   help="print per-layer output shape, parameters and forward GFLOP; run nothing")
    p.add_argument("--format", choices=report.FORMATS, default="table")
    p.add_argument("--output", metavar="PATH", help="write the result there instead of stdout")
    p.add_argument("--warmup", type=_count(0), default=None,
                   help=f"untimed calls first (default {driver.CPU_WARMUP} on the CPU, "
                        f"{driver.GPU_WARMUP} on a GPU)")
    p.add_argument("--repeat", type=_count(1), default=None,
                   help=f"timed calls (default {driver.CPU_REPEAT} on the CPU, "
                        f"{driver.GPU_REPEAT} on a GPU)")
    p.add_argument("--pipeline", choices=("default", "reference"), default="default",
                   help="default: the lowering passes choose per the policy; reference: every "
                        "node runs the NumPy/CuPy oracle")
    p.add_argument("--policy", metavar="TOML",
                   help="a LoweringPolicy TOML file (see passes/policy.py) for the default pipeline")
    p.add_argument("--seed", type=int, default=0, help="seed of the random input and weights")
    return p


def run_summary(names: list[str], args) -> dict:
    """The summary document of ``names`` (no kernel runs)."""
    models = []
    for name in names:
        m = build(name, batch=args.batch, dtype=args.dtype)
        rows = summarize(m.graph, [m.output])
        models.append(report.model_record(m.key, m.spec_key, m.title, m.batch, m.dtype, rows,
                                          totals(rows, m.graph, [m.output])))
    batch = (f"batch {args.batch} (set with --batch)" if args.batch is not None
             else "the seed benchmark's batch of each model")
    return {"tool": "opgraph-bench", "mode": "summary",
            "environment": driver.environment("none", batch=args.batch, dtype=args.dtype),
            "notes": [f"static summary at {batch}; forward FLOPs from each op's rule, a "
                      "multiply-add counted as 2 (convolution and linear exclude the bias add)"],
            "models": models}


def run_forward(names: list[str], args, log) -> dict:
    """Time the forward pass of each model; ``log`` gets progress lines."""
    device, why = driver.resolve_device(args.device)
    warmup, repeat = driver.protocol_defaults(device, args.warmup, args.repeat)
    notes = [f"device: {device} ({why})"]
    results = []
    for name in names:
        batch, reason = driver.default_batch(SEED_BATCHES[name], device, args.batch)
        note = f"batch {batch}: {reason}"
        if note not in notes:
            notes.append(note)
        log(f"{name}: building at batch {batch}, compiling for {device}, "
            f"{warmup} warm-up + {repeat} timed calls ...")
        t0 = time.perf_counter()
        model = build(name, batch=batch, dtype=args.dtype)
        res = driver.time_forward(model, device=device, warmup=warmup, repeat=repeat,
                                  seed=args.seed, policy=args.policy, pipeline=args.pipeline,
                                  batch_reason=reason)
        log(f"{name}: median {res.median_ms:.1f} ms, min {res.min_ms:.1f} ms per mini-batch "
            f"({time.perf_counter() - t0:.1f} s in all)")
        results.append(res.as_dict())
    notes.append(f"protocol: {warmup} warm-up call(s), then {repeat} timed call(s); random input, "
                 "He-normal weights; forward only")
    batches = {r["model"]: r["batch"] for r in results}
    batch = next(iter(batches.values())) if len(set(batches.values())) == 1 else batches
    return {"tool": "opgraph-bench", "mode": "forward",
            "environment": driver.environment(device, dtype=args.dtype, warmup=warmup,
                                              repeat=repeat, batch=batch,
                                              pipeline=args.pipeline, policy=args.policy),
            "notes": notes, "results": results}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``opgraph-bench`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        if args.summary:
            doc = run_summary(args.model, args)
        else:
            doc = run_forward(args.model, args, log)
    except (OpgraphError, ValueError, OSError, MemoryError) as e:
        print(f"opgraph-bench: error: {e}", file=sys.stderr)
        return 1
    if args.output:
        with open(args.output, "w", encoding="utf-8", newline="") as f:
            report.write(doc, args.format, f)
        log(f"wrote {args.format} to {args.output}")
    else:
        if args.format != "table":
            for note in doc.get("notes", ()):
                log(f"# {note}")
        report.write(doc, args.format, sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
