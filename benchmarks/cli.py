"""``opgraph-bench``: the convnet-benchmarks protocol on opgraph, per lowering, with a PyTorch peer.

Examples::

    opgraph-bench                                   # four models, every lowering (GPU) / gemm (CPU)
    opgraph-bench --model alexnet --lowering gemm,winograd,auto --compare torch
    opgraph-bench --suite layers --lowering cudnn,fft,winograd --precision fp32,tf32
    opgraph-bench --format json --output run.json --plot run.png
    opgraph-bench --model all --summary             # static shapes, params, GFLOP; nothing runs

Exit status: 0 on success; 2 on a usage error (unknown model, lowering,
precision; a negative --seed or --time-limit; --plot with --summary; a
lowering that applies to no convolution of the selected models);
1 when the device is unavailable or building a model fails; 3 when the run
finished but some column is a ``mismatch`` or an ``error`` (the outputs are
written first).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

from opgraph.analysis import summarize, totals
from opgraph.errors import OpgraphError, ParameterError
from opgraph.passes.policy import PRECISIONS, LoweringPolicy

from . import driver, lowerings as lw, report
from .environment import environment
from .models import LAYERS, MODELS, SEED_BATCHES, WINNERS, build, resolve
from .peer_torch import PEERS

#: Names of model groups accepted by --model and --suite.
GROUPS = {"all": WINNERS + LAYERS, "winners": WINNERS, "layers": LAYERS}


def parse_models(text: str) -> list[str]:
    """``--model`` value -> registry names: comma-separated names, aliases
    (``overfeat_fast``, ``googlenet_v1``) or groups (``all``, ``winners``,
    ``layers``), case-insensitive, duplicates dropped.

    Raises:
        argparse.ArgumentTypeError: an unknown name (argparse exits with 2).
    """
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
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


def _list_of(allowed, what: str):
    def parse(text: str) -> list[str]:
        items = list(dict.fromkeys(p.strip().lower() for p in text.split(",") if p.strip()))
        bad = [i for i in items if i not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad)) or '(none)'}; "
                                             f"choose from {', '.join(allowed)}")
        return items
    return parse


def _lowerings(text: str) -> list[lw.Lowering]:
    try:
        return lw.parse_lowerings(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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


def _seconds(text: str) -> float:
    """``--time-limit`` value -> seconds, zero or more (``inf``: no limit).

    Raises:
        argparse.ArgumentTypeError: not a number, negative or NaN (argparse
            exits with 2 naming the flag): such a limit would skip every column.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a time of zero or more seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opgraph-bench",
        description="Time the ImageNet winners of convnet-benchmarks (AlexNet, OverFeat-fast, VGG-A, "
                    "GoogLeNet v1) and its layers L1-L5 built as opgraph graphs: forward, "
                    "backward-data and backward-filter per lowering, per layer and end to end, each "
                    "lowering checked against a float64 reference first; with --compare, PyTorch on "
                    "the same model in the same run.",
        epilog="Exit status: 0 ok; 2 usage error; 1 device or model failure; 3 some column is a "
               "mismatch or an error (outputs written first).")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--model", type=parse_models, default=None, metavar="NAME[,NAME]",
                      help="alexnet, overfeat, vgg_a, googlenet, L1..L5, or a group: winners (default), "
                           "layers, all")
    what.add_argument("--suite", choices=tuple(GROUPS), default=None,
                      help="a group of models: winners (the four ImageNet models), layers (L1-L5), all")
    p.add_argument("--onnx", action="append", default=[], metavar="PATH",
                   help="also benchmark an ONNX network (one image input, one output); repeatable")
    p.add_argument("--batch", type=_count(1), default=None,
                   help="mini-batch (default: the seed's 128 / VGG-A 64 on a GPU and for --summary; "
                        f"{driver.CPU_DEFAULT_BATCH} on the CPU)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the GPU if CuPy sees one, else the CPU (default)")
    p.add_argument("--dtype", choices=("float32", "float64", "float16", "bfloat16"), default="float32",
                   help="storage dtype of inputs, parameters, activations and gradients (default "
                        "float32; bfloat16 with --precision bf16 keeps the whole step in bf16, "
                        "computing in fp32)")
    p.add_argument("--lowering", type=_lowerings, default=None, metavar="LIST",
                   help="columns: convolution algorithms (gemm, fft, winograd, direct, cudnn, ...), "
                        "auto (autotune) or default; default: every algorithm the GPU runs plus "
                        f"auto, or {','.join(lw.CPU_DEFAULT)} on the CPU")
    # None when not given, so that a --policy file's precision and layout are not overridden
    p.add_argument("--precision", type=_list_of(PRECISIONS, "precision"), default=None,
                   metavar="LIST", help=f"comma-separated, from {', '.join(PRECISIONS)} (default: "
                                        "the --policy file's, else fp32)")
    p.add_argument("--layout", choices=("nchw", "nhwc"), default=None, type=str.lower,
                   help="layout the policy asks for (default: the --policy file's, else nchw); "
                        "NHWC applies on cuda only, to opgraph and the peer (channels_last) alike, "
                        "and results record the layout applied")
    p.add_argument("--policy", metavar="TOML", help="a base LoweringPolicy file (passes/policy.py)")
    p.add_argument("--workspace-limit", default=None, metavar="BYTES",
                   help="scratch budget per node, e.g. 512MiB (policy workspace_limit)")
    p.add_argument("--workspace-tolerance", default=None, metavar="FRACTION",
                   help="autotune keeps the smallest workspace among candidates within this "
                        "fraction of the fastest, e.g. 0.03 or 3%% (policy workspace_tolerance; "
                        "default 0.03, 0 keeps the fastest)")
    p.add_argument("--compare", type=_list_of(PEERS, "peer"), default=[], metavar="PEERS",
                   help="torch (PyTorch eager, cudnn.benchmark) and/or torch-compile, same run")
    p.add_argument("--warmup", type=_count(0), default=None,
                   help=f"untimed iterations (default {driver.GPU_WARMUP} on a GPU as the seed, "
                        f"{driver.CPU_WARMUP} on the CPU)")
    p.add_argument("--repeat", type=_count(1), default=None,
                   help=f"timed calls per loop (default {driver.GPU_REPEAT} on a GPU, "
                        f"{driver.CPU_REPEAT} on the CPU)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also replay each phase as CUDA graphs: a column <lowering>+graph per lowering, "
                        "from the same compiled graph (cuda only; steps that cannot be captured, "
                        "e.g. cuBLAS calls, run eagerly between the graphs)")
    p.add_argument("--no-per-layer", dest="per_layer", action="store_false",
                   help="skip timing each layer alone")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the float64 reference check (columns are then unchecked)")
    p.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help="start no new column after this many seconds, counted from the start of the run "
                        "(the peak measurement included; the rest: 'skipped')")
    p.add_argument("--summary", action="store_true",
                   help="print per-layer output shape, parameters and forward GFLOP; run nothing")
    p.add_argument("--format", choices=report.FORMATS, default="table")
    p.add_argument("--output", metavar="PATH", help="write the result there instead of stdout "
                   "(JSON is rewritten after every column, so a killed run keeps what it finished)")
    p.add_argument("--plot", metavar="PATH.png", help="bar chart of forward + backward per model")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.add_argument("--seed", type=_count(0), default=0,
                   help="seed of the random input and weights (0 or more; default 0)")
    return p


def model_names(args) -> list[str]:
    """Built-in models to run: ``--model``, else ``--suite``, else the four
    winners -- unless only ``--onnx`` files were asked for."""
    if args.model is not None:
        return args.model
    if args.suite is None and getattr(args, "onnx", None):
        return []
    return list(GROUPS[args.suite or "winners"])


def run_summary(names: list[str], args) -> dict:
    """The summary document of ``names`` (no kernel runs)."""
    models = []
    built = [build(name, batch=args.batch, dtype=args.dtype) for name in names]
    if getattr(args, "onnx", None):
        from .onnx_model import load_model
        built += [load_model(path, batch=args.batch) for path in args.onnx]
    for m in built:
        rows = summarize(m.graph, [m.output])
        models.append(report.model_record(m.key, m.spec_key, m.title, m.batch, m.dtype, rows,
                                          totals(rows, m.graph, [m.output])))
    batch = (f"batch {args.batch} (set with --batch)" if args.batch is not None
             else "the seed benchmark's batch of each model")
    return {"tool": "opgraph-bench", "mode": "summary",
            "environment": environment("none", batch=args.batch, dtype=args.dtype),
            "notes": [f"static summary at {batch}; forward FLOPs from each op's rule, a "
                      "multiply-add counted as 2 (convolution and linear exclude the bias add)"],
            "models": models}


def build_models(names, args, device: str, notes: list[str]) -> list:
    models = []
    for name in names:
        batch, reason = driver.default_batch(SEED_BATCHES[name], device, args.batch)
        note = f"batch {batch}: {reason}"
        if note not in notes:
            notes.append(note)
        models.append(build(name, batch=batch, dtype=args.dtype))
    for path in args.onnx:
        from .onnx_model import load_model

        models.append(load_model(path, batch=args.batch))
    return models


def check_applicable(tgs, lowerings, device: str, base: LoweringPolicy) -> str | None:
    """A message when some explicit lowering applies to no convolution of any
    of the models (a usage error: its column would only repeat the fallback),
    else None."""
    for lo in lowerings:
        if lo.algorithm is None:
            continue
        policy = lo.policy(base, device)
        reasons: dict[str, list[str]] = {}
        usable = False
        for tg in tgs:
            app = lw.applicability(tg, lo, device, policy)
            if any(why is None for why in app.values()):
                usable = True
                break
            for why in app.values():
                reasons.setdefault(why, [])
                if tg.model.key not in reasons[why]:
                    reasons[why].append(tg.model.key)
        if not usable and reasons:
            detail = "; ".join(f"{', '.join(ms)}: {why}" for why, ms in list(reasons.items())[:4])
            return (f"lowering {lo.name!r} cannot run any convolution of the selected models on "
                    f"{device} ({detail}); choose other lowerings or models")
    return None


class Progress:
    """A rich progress bar on a terminal, one line per column otherwise, nothing with --quiet."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.done, self.quiet, self.bar = total, 0, quiet, None
        self.t0 = time.perf_counter()
        if not quiet and sys.stderr.isatty():
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                           TextColumn, TimeElapsedColumn)
            except ImportError:
                return
            self.bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
            self.task = self.bar.add_task("starting", total=total)
            self.bar.start()

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=text)

    def result(self, r: dict) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        elif not self.quiet:
            tot = (r.get("totals") or {}).get("total_ms")
            what = f"total {tot:.2f} ms" if tot is not None else (r.get("reason") or "")[:120]
            log(f"[{self.done}/{self.total}] {r['model']} {r['precision']} {r['lowering']}: "
                f"{r['status']} {what} ({time.perf_counter() - self.t0:.0f} s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder."""
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".opgraph-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_output_paths(args) -> None:
    """Refuse ``--output`` / ``--plot`` paths that cannot be written, before any
    work is done (a run can take minutes).

    Raises:
        UsageError: the path is a folder, or its folder does not exist.
    """
    for flag, path in (("--output", args.output), ("--plot", args.plot)):
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise UsageError(f"{flag} {path}: is a folder; give a file name")
        if not os.path.isdir(folder):
            raise UsageError(f"{flag} {path}: folder {folder} does not exist")
        if not os.access(folder, os.W_OK):
            raise UsageError(f"{flag} {path}: folder {folder} is not writable")
    if args.plot:
        kinds = _plot_formats()
        ext = os.path.splitext(args.plot)[1].lstrip(".").lower()
        if kinds and ext not in kinds:
            what = ext or "a file without an extension"
            raise UsageError(f"--plot {args.plot}: matplotlib cannot write {what}; "
                             f"use one of {', '.join(sorted(kinds))}")


def _plot_formats() -> set[str]:
    """File extensions matplotlib can write, or an empty set without matplotlib
    (the plot step then says that matplotlib is missing)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return set()
    return set(Figure().canvas.get_supported_filetypes())


def run_timing(names: list[str], args) -> dict:
    """Build, check and time every model x precision x lowering (driver.run_benchmark)."""
    from .protocol import training_graph

    device, why = driver.resolve_device(args.device)
    warmup, repeat = driver.protocol_defaults(device, args.warmup, args.repeat)
    notes = [f"device: {device} ({why})"]
    models = build_models(names, args, device, notes)
    lowerings = args.lowering
    if lowerings is None:
        lowerings = lw.default_lowerings(device)
        if device == "cpu":
            notes.append(driver.CPU_DEFAULT_NOTE)
    base = LoweringPolicy.from_cli(policy_file=args.policy, workspace_limit=args.workspace_limit,
                                   workspace_tolerance=args.workspace_tolerance)
    tgs = [training_graph(m, input_grad=m.spec_key in LAYERS) for m in models]
    if args.cuda_graph and device != "cuda":
        raise UsageError(f"--cuda-graph replays CUDA graphs: it needs --device cuda (this run: {device})")
    problem = check_applicable(tgs, lowerings, device, base)
    if problem:
        raise UsageError(problem)
    if args.compare:
        from .peer_torch import PeerError, import_torch

        try:
            import_torch()
        except PeerError as e:
            log(f"opgraph-bench: --compare {','.join(args.compare)}: {e}")
            notes.append(f"--compare {','.join(args.compare)}: {e}")
    if device == "cpu" and args.warmup is None and args.repeat is None:
        notes.append(f"protocol: {warmup} warm-up + {repeat} timed calls per loop (CPU defaults; "
                     f"the seed's {driver.GPU_WARMUP} + {driver.GPU_REPEAT} on a GPU)")
    # flags win over the --policy file, which wins over the defaults (fp32, NCHW)
    precisions = args.precision or [base.precision]
    layout = args.layout.upper() if args.layout else base.layout
    settings = driver.Settings(device=device, lowerings=lowerings, precisions=precisions,
                               layout=layout, warmup=warmup, repeat=repeat,
                               per_layer=args.per_layer, check=args.check, compare=args.compare,
                               base_policy=base, seed=args.seed, time_limit=args.time_limit,
                               cuda_graph=args.cuda_graph)
    progress = Progress(driver.unit_count(models, settings), args.quiet)
    incremental = args.output and args.format == "json"

    shown = 0

    def on_result(doc: dict) -> None:
        nonlocal shown
        for r in doc["results"][shown:]:  # a lowering with --cuda-graph adds two records
            progress.result(r)
        shown = len(doc["results"])
        if incremental:
            _write_atomic(args.output, report.render_json(doc))

    try:
        return driver.run_benchmark(tgs, settings, progress=progress.describe, on_result=on_result,
                                    notes=notes)
    finally:
        progress.close()


class UsageError(Exception):
    """A bad combination of arguments found after parsing (exit status 2)."""


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` of the command: one line naming the tool, as a
    user of the command has no use for the library's file, line and source."""
    print(f"opgraph-bench: warning: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``opgraph-bench`` console script; returns the exit status.

    Python warnings print as ``opgraph-bench: warning: MESSAGE`` while it runs
    (only here: a library user keeps the usual format).

    Raises:
        SystemExit: a usage error found by argparse (status 2), ``--help``.
    """
    saved, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        return _main(argv)
    finally:
        warnings.showwarning = saved


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    names = model_names(args)
    try:
        if args.summary and args.format == "markdown":
            raise UsageError("--format markdown renders timing runs; use table, json or csv with --summary")
        if args.summary and args.plot:
            raise UsageError("--plot charts timing runs; --summary runs nothing: drop --summary or --plot")
        if args.summary and args.cuda_graph:
            raise UsageError("--cuda-graph replays timing runs; --summary runs nothing: drop one of them")
        check_output_paths(args)
        doc = run_summary(names, args) if args.summary else run_timing(names, args)
    except (UsageError, ParameterError) as e:  # bad flags, policy files and values
        print(f"opgraph-bench: error: {e}", file=sys.stderr)
        return 2
    except (OpgraphError, ValueError, OSError, MemoryError, ImportError) as e:
        print(f"opgraph-bench: error: {e}", file=sys.stderr)
        return 1
    try:
        if args.output:
            if args.format == "json":
                _write_atomic(args.output, report.render_json(doc))
            else:
                with open(args.output, "w", encoding="utf-8", newline="") as f:
                    report.write(doc, args.format, f)
            if not args.quiet:
                log(f"wrote {args.format} to {args.output}")
        else:
            if args.format != "table" and not args.quiet:
                for note in doc.get("notes", ()):
                    log(f"# {note}")
            report.write(doc, args.format, sys.stdout)
        if args.plot:
            from .plot import plot

            plot(doc, args.plot)
            if not args.quiet:
                log(f"wrote plot to {args.plot}")
    except (ValueError, OSError, ImportError) as e:
        print(f"opgraph-bench: error: {e}", file=sys.stderr)
        return 1
    bad = [r for r in doc.get("results", ()) if r["status"] in ("mismatch", "error")]
    if bad:
        log(f"opgraph-bench: {len(bad)} column(s) failed: " + "; ".join(
            f"{r['model']} {r['precision']} {r['lowering']}: {r['status']}" for r in bad[:5]))
        return 3
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
