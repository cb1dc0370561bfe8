"""``opgraph-bench``: the convnet-benchmarks protocol on opgraph, per lowering, with a PyTorch peer.

Examples::

    opgraph-bench                                   # four models, every lowering (GPU) / gemm (CPU)
    opgraph-bench --model alexnet --lowering gemm,winograd,auto --compare torch
    opgraph-bench --suite layers --lowering cudnn,fft,winograd --precision fp32,tf32
    opgraph-bench --format json --output run.json --plot run.png
    opgraph-bench --model all --summary             # static shapes, params, GFLOP; nothing runs

Exit status: 0 on success; 2 on a usage error (unknown model, lowering,
precision; a negative --seed or --time-limit; a flag the mode cannot use,
such as --plot with --summary (:mod:`.usage`); a lowering that applies to no
convolution of the selected models);
1 when the device is unavailable or building a model fails; 3 when the run
finished but some column is a ``mismatch`` or an ``error`` (the outputs are
written first); 4 when --time-limit left nothing timed (it skipped every
column that was not n/a or unavailable); 130 on Ctrl-C (the finished columns are written where the run would
have written them, and one line says where).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings

import attrs

from opgraph.analysis import summarize, totals
from opgraph.atomic_file import write_atomic
from opgraph.errors import OpgraphError, ParameterError
from opgraph.passes.policy import LoweringPolicy
from opgraph.passes.policy_names import check_names

from . import driver, lowerings as lw, report, usage
from .arguments import build_parser, model_names, output_format
from .environment import environment
from .models import LAYERS, SEED_BATCHES, build
from .trace import TraceCollector
from .usage import UsageError


def run_summary(names: list[str], args) -> dict:
    """The summary document of ``names`` (no kernel runs)."""
    models = []
    built = [build(name, batch=args.batch, dtype=args.dtype) for name in names] + onnx_models(args)
    for m in built:
        rows = summarize(m.graph, [m.output])
        models.append(report.model_record(m.key, m.spec_key, m.title, m.batch, m.dtype, rows,
                                          totals(rows, m.graph, [m.output])))
    batch = (f"batch {args.batch} (set with --batch)" if args.batch is not None
             else "the seed benchmark's (or the modern suite's) batch of each model")
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
    onnx = onnx_models(args)
    if args.batch is None:
        notes += [f"{m.key}: batch {m.batch}, the file's (a symbolic batch builds 1; set with --batch)"
                  for m in onnx]
    return models + onnx


def onnx_models(args) -> list:
    """The ``--onnx`` files as models, built at ``--batch`` (else the file's) in
    ``--dtype``, each with the ``--onnx-input`` image (else its first graph input).

    Raises:
        UsageError: ``--onnx-input`` without ``--onnx``, or naming no graph
            input of a file (the message lists them).
    """
    from .onnx_model import load_model

    if args.onnx_input is not None and not args.onnx:
        raise UsageError(f"--onnx-input {args.onnx_input}: names the image input of --onnx files, "
                         "and no --onnx file is given")
    models = []
    for path in args.onnx:
        try:
            models.append(load_model(path, batch=args.batch, dtype=args.dtype, input_name=args.onnx_input))
        except ParameterError as e:
            if e.param != "input_name":
                raise
            raise UsageError(f"--onnx-input {args.onnx_input}: {e.why}") from None
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
        self.said: set[str] = set()  # reasons printed already: each is printed once per run
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
        """One line per column without a bar; an error in full (type, message,
        innermost frames) with a bar too, as it would scroll away in the table."""
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        error = r.get("error") if r["status"] == "error" else None
        if self.quiet or (self.bar is not None and error is None):
            return
        tot = (r.get("totals") or {}).get("total_ms")
        reason = r.get("reason") or ""
        repeated = bool(reason) and reason in self.said
        self.said.add(reason)
        what = f"total {tot:.2f} ms" if tot is not None else \
            "(reason above)" if repeated else reason if error else reason[:120]
        line = (f"[{self.done}/{self.total}] {r['model']} {r['precision']} {r['lowering']}: "
                f"{r['status']} {what} ({time.perf_counter() - self.t0:.0f} s)")
        if not repeated:
            line += "".join(f"\n    at {f}" for f in (error or {}).get("frames", ()))
        if self.bar is not None:
            from rich.text import Text

            self.bar.console.print(Text(line))
        else:
            log(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def check_policy_flags(args) -> None:
    """Refuse a bad value of a policy flag (``--workspace-limit``,
    ``--workspace-tolerance``, ``--engine-limit``) in every mode, before any
    work: :func:`base_policy` reads them for a benchmark or a profile, and
    ``--summary`` must not take ``--engine-limit 0`` silently either.

    Raises:
        PolicyError: naming the flag and the value (exit 2).
    """
    LoweringPolicy.from_cli(workspace_limit=args.workspace_limit, workspace_tolerance=args.workspace_tolerance,
                            engine_limit=args.engine_limit)


def base_policy(args, lowerings, device: str) -> LoweringPolicy:
    """The base policy of every column, a benchmark's or ``--profile``'s alike
    (each column puts its lowering's choice on top, :meth:`.lowerings.Lowering.policy`):
    the ``--policy`` file, then the policy items of ``--lowering``
    (``conv=fft+gemm``, ``@conv2=fft``, ``exclude=winograd``) and the policy
    flags (``LoweringPolicy.from_cli``).

    Raises:
        PolicyError: a bad file, policy item, value or include / exclude name
            (exit 2, not a silent no-op).
        UsageError: a flag that only steers autotune while no column of
            ``lowerings`` autotunes on ``device``.
    """
    base = LoweringPolicy.from_cli(lowering=args.lowering_policy, policy_file=args.policy,
                                   workspace_limit=args.workspace_limit,
                                   workspace_tolerance=args.workspace_tolerance,
                                   engine_limit=args.engine_limit)
    check_names(base)
    unused = lw.unused_autotune_flags(autotune_flags(args), lowerings, base, device)
    if unused:
        raise UsageError(unused)
    return base


def precisions_and_layout(args, base: LoweringPolicy) -> tuple[list[str], str]:
    """The precisions and the layout (``'NCHW'`` / ``'NHWC'``) the columns ask
    for: the flags win over the ``--policy`` file, which wins over the
    defaults (fp32, NCHW)."""
    return args.precision or [base.precision], (args.layout.upper() if args.layout else base.layout)


def autotune_flags(args) -> dict:
    """The flags that only steer autotune, by name: their values, None when not given."""
    return {"--engine-limit": args.engine_limit, "--workspace-tolerance": args.workspace_tolerance}


def gpu_library_notes(device: str) -> list[str]:
    """:func:`.environment.missing_gpu_libraries`, each also printed as a
    warning (a profile taken without the cuDNN frontend looked like a cuDNN
    one until its convolutions were read)."""
    from .environment import missing_gpu_libraries

    lines = missing_gpu_libraries(device)
    for line in lines:
        log(f"opgraph-bench: warning: {line}")
    return lines


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check_output_paths(args) -> None:
    """Refuse ``--output`` / ``--plot`` paths that cannot be written, before any
    work is done (a run can take minutes).

    Raises:
        UsageError: the path is a folder, or its folder does not exist.
    """
    for flag, path in (("--output", args.output), ("--plot", args.plot), ("--trace", args.trace)):
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
    notes = [f"device: {device} ({why})", *gpu_library_notes(device)]
    models = build_models(names, args, device, notes)
    lowerings = args.lowering
    cuda_graph = args.cuda_graph
    if lowerings is None:
        lowerings = lw.default_lowerings(device)
        if device == "cpu":
            notes.append(driver.CPU_DEFAULT_NOTE)
        elif not cuda_graph:  # the whole step as CUDA graphs is part of the default GPU run
            cuda_graph = ("auto",)
            notes.append(f"default lowerings on {device}: auto+graph too (--cuda-graph: a +graph "
                         "column for every lowering)")
    base = base_policy(args, lowerings, device)
    tgs = [training_graph(m, input_grad=m.spec_key in LAYERS) for m in models]
    if args.cuda_graph and device != "cuda":
        raise UsageError(f"--cuda-graph replays CUDA graphs: it needs --device cuda (this run: {device})")
    problem = check_applicable(tgs, lowerings, device, base)
    if problem:
        raise UsageError(problem)
    peer_problem = None  # said once here; the peers' columns carry it as their reason
    if args.compare:
        from .peer_torch import PeerError, import_torch

        try:
            import_torch()
        except PeerError as e:
            peer_problem = str(e)
            log(f"opgraph-bench: --compare {','.join(args.compare)}: {e}")
    if device == "cpu" and args.warmup is None and args.repeat is None:
        notes.append(f"protocol: {warmup} warm-up + {repeat} timed calls per loop (CPU defaults; "
                     f"the seed's {driver.GPU_WARMUP} + {driver.GPU_REPEAT} on a GPU)")
    precisions, layout = precisions_and_layout(args, base)
    settings = driver.Settings(device=device, lowerings=lowerings, precisions=precisions,
                               layout=layout, warmup=warmup, repeat=repeat,
                               per_layer=args.per_layer, check=args.check, compare=args.compare,
                               base_policy=base, seed=args.seed, time_limit=args.time_limit,
                               cuda_graph=cuda_graph, adaptive=args.repeat == "auto",
                               trace=TraceCollector() if args.trace else None)
    progress = Progress(driver.unit_count(models, settings), args.quiet)
    if peer_problem is not None:
        progress.said.add(peer_problem)
    incremental = args.output and args.format == "json"

    shown, finished = 0, None

    def on_result(doc: dict) -> None:
        nonlocal shown, finished
        finished = doc  # first: a Ctrl-C from here on keeps this column
        if incremental:
            write_atomic(args.output, report.render_json(doc))
        for r in doc["results"][shown:]:  # a lowering with --cuda-graph adds two records
            progress.result(r)
        shown = len(doc["results"])

    try:
        return driver.run_benchmark(tgs, settings, progress=progress.describe, on_result=on_result,
                                    notes=notes)
    except KeyboardInterrupt:
        raise Interrupted(finished) from None
    finally:
        progress.close()
        if settings.trace is not None and settings.trace.columns:  # what was traced, even on Ctrl-C
            write_atomic(args.trace, settings.trace.render())


def run_profile(names: list[str], args) -> dict:
    """``--profile``: every model x precision x lowering profiled step by step
    (:mod:`.profile`), against the limits measured once at the start."""
    from . import profile as pf
    from .protocol import training_graph
    from .records import release_device
    from .timer import make_timer

    device, why = driver.resolve_device(args.device)
    warmup, repeat = driver.protocol_defaults(device, args.warmup, args.repeat)
    notes = [f"device: {device} ({why})", *gpu_library_notes(device),
             f"profile: each step {warmup} warm-up + {repeat} timed calls, median"]
    models = build_models(names, args, device, notes)
    lowerings = args.lowering or [lw.Lowering("auto" if device == "cuda" else lw.CPU_DEFAULT[0])]
    base = base_policy(args, lowerings, device)  # the benchmark's: a column of either compiles alike
    tgs = [training_graph(m, input_grad=m.spec_key in LAYERS) for m in models]
    problem = check_applicable(tgs, lowerings, device, base)
    if problem:
        raise UsageError(problem)
    precisions, layout = precisions_and_layout(args, base)
    limits = pf.measure_limits(device, precisions)
    timer = make_timer(device)
    records = []
    for tg in tgs:
        m = tg.model
        for precision in precisions:
            policy = attrs.evolve(base, precision=precision, layout=layout)
            for lowering in lowerings:
                if not args.quiet:
                    log(f"opgraph-bench: profiling {m.key} {precision} {lowering.name}")
                records.append(pf.profile_model(tg, lowering, policy, device, timer, limits, warmup=warmup,
                                                repeat=repeat, seed=args.seed))
                release_device(device)
    env = environment(device, precision=list(precisions), layout=layout, warmup=warmup, repeat=repeat,
                             lowerings=[lo.name for lo in lowerings], seed=args.seed)
    return pf.profile_document(env, limits, records, notes)


class Interrupted(Exception):
    """Ctrl-C during a timing run; ``doc`` is the document of the columns
    finished before it (None when none had)."""

    def __init__(self, doc: dict | None):
        super().__init__("interrupted")
        self.doc = doc


#: Exit status of a run interrupted by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: Exit status of a run that timed nothing: --time-limit skipped every column it did not
#: find n/a or unavailable.
EXIT_NOTHING_TIMED = 4


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` of the command: one line naming the tool, as a
    user of the command has no use for the library's file, line and source."""
    print(f"opgraph-bench: warning: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``opgraph-bench`` console script; returns the exit status.
    ``opgraph-bench compare A.json B.json`` compares two runs (:mod:`.compare`).

    Python warnings print as ``opgraph-bench: warning: MESSAGE`` while it runs
    (only here: a library user keeps the usual format).

    Raises:
        SystemExit: a usage error found by argparse (status 2), ``--help``.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:  # opgraph-bench compare A.json B.json
        from .compare import main as compare_main

        return compare_main(argv[1:])
    saved, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        return _main(argv)
    finally:
        warnings.showwarning = saved


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    format_given = args.format is not None
    args.format = output_format(args)
    names = model_names(args)
    try:
        check_policy_flags(args)  # a bad value first: it is wrong whatever the mode
        usage.check_flags(args, parser)
        usage.check_format(args, format_given)
        check_output_paths(args)
        if args.summary:
            doc = run_summary(names, args)
        else:
            doc = run_profile(names, args) if args.profile else run_timing(names, args)
    except (UsageError, ParameterError) as e:  # bad flags, policy files and values
        print(f"opgraph-bench: error: {e}", file=sys.stderr)
        return 2
    except (OpgraphError, ValueError, OSError, MemoryError, ImportError) as e:
        print(f"opgraph-bench: error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        return _interrupted(e.doc, args)
    except KeyboardInterrupt:  # before the first column (building models, the peak, ...)
        return _interrupted(None, args)
    try:
        if getattr(args, "json", None):  # --profile's document (any mode's), beside --output
            write_atomic(args.json, report.render_json(doc))
            if not args.quiet:
                log(f"wrote json to {args.json}")
        write_outputs(doc, args)
    except (ValueError, OSError, ImportError) as e:
        print(f"opgraph-bench: error: {e}", file=sys.stderr)
        return 1
    results = doc.get("results", ())
    bad = [r for r in results if r["status"] in ("mismatch", "error")]
    if bad:
        log(f"opgraph-bench: {len(bad)} column(s) failed: " + "; ".join(
            f"{r['model']} {r['precision']} {r['lowering']}: {r['status']}" for r in bad[:5]))
        return 3
    skipped = [r for r in results if r["status"] == "skipped"]
    if skipped and not any(r["status"] == "ok" for r in results):  # the others n/a or unavailable
        untimed = sorted({r["status"] for r in results} - {"skipped"})
        which = (f"all {len(skipped)} column(s) skipped" if not untimed else
                 f"{len(skipped)} of {len(results)} column(s) skipped and the others {', '.join(untimed)}")
        log(f"opgraph-bench: error: --time-limit {args.time_limit:g} s was reached before any column ran: "
            f"{which}, nothing was timed")
        return EXIT_NOTHING_TIMED
    if skipped and not args.quiet:
        log(f"opgraph-bench: --time-limit {args.time_limit:g} s skipped {len(skipped)} of {len(results)} "
            "column(s)")
    return 0


def write_outputs(doc: dict, args, *, quiet: bool | None = None) -> str:
    """Write ``doc`` where the flags say (``--output`` or standard output, in
    ``--format``; then ``--plot``); returns where the document went.

    Raises:
        ValueError, OSError, ImportError: a file cannot be written, matplotlib is missing.
    """
    quiet = args.quiet if quiet is None else quiet
    if args.output:
        text = io.StringIO()
        report.write(doc, args.format, text)
        write_atomic(args.output, text.getvalue())
        if not quiet:
            log(f"wrote {args.format} to {args.output}")
    else:
        if args.format != "table" and not quiet:
            for note in doc.get("notes", ()):
                log(f"# {note}")
        report.write(doc, args.format, sys.stdout)
    if args.plot:
        from .plot import plot

        plot(doc, args.plot)
        if not quiet:
            log(f"wrote plot to {args.plot}")
    return args.output or "standard output"


def _interrupted(doc: dict | None, args) -> int:
    """Ctrl-C: write the finished columns where the run would have written
    them, say where in one line, and return :data:`EXIT_INTERRUPTED`."""
    done = len(doc["results"]) if doc else 0
    if not done:
        print("opgraph-bench: interrupted before any column finished; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    doc["notes"].append(f"interrupted (Ctrl-C) after {done} column(s); the others did not run")
    try:
        where = write_outputs(doc, argparse.Namespace(**{**vars(args), "plot": None}), quiet=True)
    except (ValueError, OSError) as e:
        print(f"opgraph-bench: interrupted; the {done} finished column(s) could not be written: {e}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"opgraph-bench: interrupted; the {done} finished column(s) were written to {where}",
          file=sys.stderr)
    return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
