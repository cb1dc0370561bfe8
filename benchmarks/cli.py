"""``opgraph-bench``: the convnet-benchmarks protocol on opgraph, per lowering, with a PyTorch peer.

This module is the entry point (:func:`main`), the benchmark mode
(:func:`run_timing`) and where a document is written; ``--summary`` and
``--profile`` are in :mod:`.modes`, the parser in :mod:`.arguments`, and
what each mode may take of the command line in :mod:`.usage`.

Examples::

    opgraph-bench                                   # four models, every lowering (GPU) / gemm (CPU)
    opgraph-bench --model alexnet --lowering gemm,winograd,auto --compare torch
    opgraph-bench --suite layers --lowering cudnn,fft,winograd --precision fp32,tf32
    opgraph-bench --format json --output run.json --plot run.png
    opgraph-bench --model all --summary             # static shapes, params, GFLOP; nothing runs
    opgraph-bench compare before.json after.json    # two --format json runs: speedups, regressions
    python -m opgraph.benchmarks --model L5         # the same command, without the console script

Exit status: 0 on success; 2 on a usage error (unknown flag, model, lowering,
precision; a negative --seed or --time-limit; an --output, --json or --trace file whose
suffix names another format than the one written (:func:`.usage.check_suffixes`); a flag the mode cannot use,
such as --plot with --summary (:mod:`.usage`); an --onnx file that does not
exist; a lowering that applies to no convolution of the selected models; a
--lowering force such as ``@conv99=fft`` that names no node of them, or a
--policy file none of whose force keys does);
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

from opgraph.atomic_file import write_atomic, writes_into
from opgraph.errors import OpgraphError, ParameterError

from . import driver, lowerings as lw, report, usage
from .arguments import PolicyColumn, build_parser, model_names, output_format
from .compare import COMMAND as PROG
from .models import LAYERS
# run_timing reads these as this module's names (tests stand in for build_models, check_applicable)
from .modes import (base_policy, build_models, check_applicable, check_forces, check_policy_flags,
                    device_flag_notes,
                    gpu_library_notes, log,
                    precisions_and_layout, run_profile, run_summary)
from .trace import TraceCollector
from .usage import UsageError, check_output_paths


class Progress:
    """A rich progress bar on a terminal, one line per column otherwise (its
    status, total and the seconds elapsed since the run started), nothing
    with --quiet."""

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
                f"{r['status']} {what} ({time.perf_counter() - self.t0:.0f} s elapsed)")
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


def run_timing(names: list[str], args) -> dict:
    """Build, check and time every model x precision x lowering (driver.run_benchmark)."""
    from .protocol import training_graph

    device, why = driver.resolve_device(args.device)
    warmup, repeat = driver.protocol_defaults(device, args.warmup, args.repeat)
    notes = [f"device: {device} ({why})", *gpu_library_notes(device), *device_flag_notes(args, device)]
    models = build_models(names, args, device, notes)
    lowerings = args.lowering
    cuda_graph = args.cuda_graph
    from_file = lw.policy_file_default(args.policy, device) if lowerings is None else None
    if from_file is not None:  # the file's preference, not a default column's algorithm put before it
        lowerings, note = from_file
        notes.append(note)
    elif lowerings is None:
        lowerings = lw.default_lowerings(device)
        if device == "cpu":
            notes.append(driver.CPU_DEFAULT_NOTE)
    if args.lowering is None and device != "cpu" and not cuda_graph:
        cuda_graph = ("auto",)  # the whole step as CUDA graphs is part of the default GPU run
        notes.append(f"default lowerings on {device}: auto+graph too (--cuda-graph: a +graph "
                     "column for every lowering)")
    if args.lowering_policy and not any(isinstance(lo, PolicyColumn) for lo in lowerings):
        # the columns are named by their lowering alone: say what else shapes every one of them
        notes.append(f"--lowering policy items {args.lowering_policy}: applied to every column")
    base = base_policy(args, lowerings, device, notes)
    notes += filter(None, [lw.displaced_preference(lowerings, base, device)])
    tgs = [training_graph(m, input_grad=m.spec_key in LAYERS) for m in models]
    if args.cuda_graph and device != "cuda":
        raise UsageError(f"--cuda-graph replays CUDA graphs: it needs --device cuda (this run: {device})")
    graphed_peers = [p for p in args.compare if p.endswith("+graph")]
    if graphed_peers and device != "cuda":
        raise UsageError(f"--compare {','.join(graphed_peers)} captures CUDA graphs: it needs "
                         f"--device cuda (this run: {device})")
    check_forces(tgs, args, device)
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
                     f"convnet-benchmarks' {driver.GPU_WARMUP} + {driver.GPU_REPEAT} on a GPU)")
    precisions, layout = precisions_and_layout(args, base)
    settings = driver.Settings(device=device, lowerings=lowerings, precisions=precisions,
                               layout=layout, warmup=warmup, repeat=repeat,
                               per_layer=args.per_layer, check=args.check, compare=args.compare,
                               base_policy=base, seed=args.seed, time_limit=args.time_limit,
                               cuda_graph=cuda_graph, adaptive=args.repeat == "auto",
                               trace=TraceCollector() if args.trace else None)
    # every note so far is known before timing (the device, flags it ignores, the defaults
    # taken): said now, not only with the results, minutes later (fresh-user report)
    args.notes_said = [] if args.quiet else list(notes)
    for note in args.notes_said:
        log(f"# {note}")
    progress = Progress(driver.unit_count(models, settings), args.quiet)
    if peer_problem is not None:
        progress.said.add(peer_problem)
    # a regular file holds the finished columns should the run stop; a device, pipe or
    # descriptor (/dev/stdout, even on a file) would receive the document once per column
    incremental = args.output and args.format == "json" and not writes_into(args.output)

    shown, finished = 0, None

    def on_result(doc: dict) -> None:
        nonlocal shown, finished
        finished = doc  # first: a Ctrl-C from here on keeps this column
        if incremental:
            write_file("--output", args.output, report.render_json(doc))
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
            write_file("--trace", args.trace, settings.trace.render())
            if not args.quiet:
                log(f"wrote trace to {args.trace}")


class OutputError(OSError):
    """A file a flag names could not be written after the run (the up-front
    :func:`.usage.check_output_paths` passed: the disk filled, the folder
    went away, ...); the message names the flag, the path and the OS's reason."""


def write_file(flag: str, path: str, text: str) -> None:
    """``write_atomic(path, text)`` (a device, FIFO or descriptor such as
    ``/dev/stdout`` written into), its error
    naming ``flag`` and ``path``.

    Raises:
        OutputError: the file cannot be written, e.g. ``--output /x/run.json:
            cannot be written: No space left on device``.
    """
    try:
        write_atomic(path, text)
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot be written: {e.strerror or e}") from e


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


def _warning_printer():
    """``warnings.showwarning`` of one command: one line naming the tool, as a
    user of the command has no use for the library's file, line and source;
    each message once (the columns' compiles record their warnings,
    ``records.warnings_noted``, which resets Python's once-per-place memory)."""
    said: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if str(message) not in said:
            said.add(str(message))
            print(f"opgraph-bench: warning: {message}", file=sys.stderr, flush=True)

    return show


def python_m(module: str) -> str:
    """How ``python -m MODULE`` names itself in ``--help`` and usage errors:
    the interpreter's name as it was run (``python``, ``python3``) and the
    module (``opgraph.benchmarks``, not its ``__main__``), as Python 3.14's
    argparse names a ``-m`` program by default."""
    py = os.path.basename(sys.executable) or "python"
    return f"{py} -m {module.removesuffix('.__main__')}"


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Entry point of the ``opgraph-bench`` console script; returns the exit status.
    ``opgraph-bench compare A.json B.json`` compares two runs (:mod:`.compare`).
    ``prog``: how the command was invoked, which its ``--help``, its usage
    errors and its error lines name (``python -m opgraph.benchmarks`` passes
    :func:`python_m`'s; a user without the console script cannot type
    ``opgraph-bench --help``).

    Python warnings print as ``opgraph-bench: warning: MESSAGE`` while it runs
    (only here: a library user keeps the usual format).

    Raises:
        SystemExit: a usage error found by argparse (status 2), ``--help``.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:  # opgraph-bench compare A.json B.json
        from .compare import main as compare_main

        return compare_main(argv[1:], prog)
    saved, warnings.showwarning = warnings.showwarning, _warning_printer()
    try:
        return _main(argv, prog)
    finally:
        warnings.showwarning = saved


def _main(argv: list[str] | None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    format_given = args.format is not None
    args.format = output_format(args)
    names = model_names(args)
    try:
        check_policy_flags(args)  # a bad value first: it is wrong whatever the mode
        usage.check_flags(args, parser)
        usage.check_format(args, format_given)
        check_output_paths(args)
        usage.check_suffixes(args, format_given)  # after: two flags naming one file say that first
        if args.summary:
            doc = run_summary(names, args)
        else:
            doc = run_profile(names, args) if args.profile else run_timing(names, args)
    except (UsageError, ParameterError) as e:  # bad flags, policy files and values
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (OpgraphError, ValueError, OSError, MemoryError, ImportError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        return _interrupted(e.doc, args)
    except KeyboardInterrupt:  # before the first column (building models, the peak, ...)
        return _interrupted(None, args)
    try:
        if getattr(args, "json", None):  # --profile's document (any mode's), beside --output
            write_file("--json", args.json, report.render_json(doc))
            if not args.quiet:
                log(f"wrote json to {args.json}")
        write_outputs(doc, args)
    except (ValueError, OSError, ImportError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
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


def _one_destination() -> bool:
    """Whether standard output and standard error write to the same place: one
    terminal, file or pipe (``> log 2>&1``, ``2>&1 | tee log``). POSIX only:
    elsewhere a null device and a console both say they are terminals, so the
    notes are kept."""
    try:
        return os.name == "posix" and os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno()))
    except (AttributeError, OSError, ValueError):  # replaced streams (tests, notebooks)
        return False


def write_outputs(doc: dict, args, *, quiet: bool | None = None) -> str:
    """Write ``doc`` where the flags say (``--output`` or standard output, in
    ``--format``; then ``--plot``); returns where the document went.

    Raises:
        OutputError: a file cannot be written (the message names flag, path and reason).
        ValueError, ImportError: ``--plot`` of a --summary document, matplotlib is missing.
    """
    quiet = args.quiet if quiet is None else quiet
    if args.output:
        text = io.StringIO()
        report.write(doc, args.format, text)
        write_file("--output", args.output, text.getvalue())
        if not quiet:
            log(f"wrote {args.format} to {args.output}")
    else:
        said = set(getattr(args, "notes_said", ()))  # before the run started (run_timing)
        if args.format != "table" and not quiet:
            for note in doc.get("notes", ()):
                if note not in said:
                    log(f"# {note}")
        elif args.format == "table" and said and _one_destination():
            # the notes said on stderr are there already: not twice (a stdout of its own
            # keeps them all, so the saved tables say how they were made)
            doc = {**doc, "notes": [n for n in doc.get("notes", ()) if n not in said]}
        report.write(doc, args.format, sys.stdout)
    if args.plot:
        from .plot import plot

        try:
            plot(doc, args.plot)
        except OSError as e:
            raise OutputError(f"--plot {args.plot}: cannot be written: {e.strerror or e}") from e
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
    sys.exit(main(prog=python_m(__spec__.name if __spec__ else "opgraph.benchmarks.cli")))
