"""What each mode of ``opgraph-bench`` can use of its command line, checked
once after parsing, before any work.

The project's rule: no flag is ever silently ignored. A benchmark (the
default mode) uses every flag; ``--summary`` runs nothing, so every flag that
steers a run is refused with it; ``--profile`` compiles and times each step
alone, so the flags of a benchmark's checking, replaying, tracing, charting,
comparing and time limit are refused with it. Each refusal is a
:class:`UsageError` (exit status 2) naming the flag, what it does and why
the mode cannot use it. Only flags the user gave are refused: a value equal
to the parser's default (``--device auto``) changes nothing.

The output format is ``--format``, else the one ``--output``'s suffix names
(``arguments.output_format``); a format the mode does not write is refused
in the terms the user typed: the ``--format`` value, or the suffix of the
``--output`` file when ``--format`` was not given. So is an ``--output``,
``--plot`` or ``--trace`` path that cannot be written, and a ``--plot``
format matplotlib cannot write (:func:`check_output_paths`); so is a file
whose suffix names another format than the one written into it,
``--format csv --output x.json`` or ``--json run.csv`` (:func:`check_suffixes`).
"""

from __future__ import annotations

import os

from opgraph.atomic_file import check_writable

from .arguments import SUFFIX_FORMATS
from .report import FORMATS


class UsageError(Exception):
    """A bad combination of arguments found after parsing (exit status 2)."""


#: Flag -> (its name in the parsed arguments, what it does), for the flags some mode cannot use.
FLAGS = {
    "--profile": ("profile", "profiles the training step"),
    "--device": ("device", "picks the device that computes"),
    "--lowering": ("lowering", "picks how the convolutions are compiled"),
    "--precision": ("precision", "sets the precision the kernels compute in"),
    "--layout": ("layout", "sets the layout the compiled graph computes in"),
    "--policy": ("policy", "is the base lowering policy of each compile"),
    "--workspace-limit": ("workspace_limit", "limits the scratch memory of each compiled node"),
    "--workspace-tolerance": ("workspace_tolerance", "steers autotune"),
    "--peak-tolerance": ("peak_tolerance", "steers autotune"),
    "--engine-limit": ("engine_limit", "steers autotune"),
    "--compare": ("compare", "times PyTorch peers beside the columns"),
    "--warmup": ("warmup", "sets the untimed calls before timing"),
    "--repeat": ("repeat", "sets the timed calls"),
    "--cuda-graph": ("cuda_graph", "replays timing runs"),
    "--no-per-layer": ("per_layer", "skips timing each layer alone"),
    "--no-check": ("check", "skips the float64 reference check"),
    "--time-limit": ("time_limit", "stops a timing run from starting new columns"),
    "--trace": ("trace", "records a timed step"),
    "--plot": ("plot", "charts timing runs"),
    "--seed": ("seed", "seeds the random inputs and weights"),
    "--quiet": ("quiet", "silences the progress lines of a run"),
}

_SUMMARY_RUNS_NOTHING = "--summary runs nothing"
#: Mode flag -> flag it cannot use -> why (the mode's side of the message).
UNUSED = {
    "--summary": dict.fromkeys(FLAGS, _SUMMARY_RUNS_NOTHING),
    "--profile": {
        "--compare": "--profile profiles opgraph's steps only",
        "--cuda-graph": "--profile has no +graph columns (how it times each step is set per device)",
        "--no-per-layer": "--profile always times each step alone",
        "--no-check": "--profile checks no output",
        "--time-limit": "--profile has no time limit",
        "--trace": "--profile writes no trace",
        "--plot": "--profile draws no chart",
    },
}
#: Mode flag (None: a benchmark) -> the formats it writes (``report.FORMATS`` order).
MODE_FORMATS = {None: FORMATS, "--summary": ("table", "json", "csv"), "--profile": ("table", "json", "markdown")}


def mode_of(args) -> str | None:
    """``'--summary'``, ``'--profile'`` or None (a benchmark); ``--summary``
    first, so that ``--summary --profile`` is refused as ``--profile`` with
    ``--summary``."""
    return "--summary" if args.summary else "--profile" if args.profile else None


def given(args, parser, flag: str) -> bool:
    """Whether ``flag`` (a key of :data:`FLAGS`) was given a value other than its default."""
    dest = FLAGS[flag][0]
    return getattr(args, dest) != parser.get_default(dest)


def check_flags(args, parser) -> None:
    """Refuse the flags the mode cannot use (module docstring).

    Raises:
        UsageError: the first such flag, what it does and why not, e.g.
            ``--plot charts timing runs; --summary runs nothing: drop --summary or --plot``.
    """
    mode = mode_of(args)
    for flag, why in UNUSED.get(mode, {}).items():
        if flag != mode and given(args, parser, flag):
            raise UsageError(f"{flag} {FLAGS[flag][1]}; {why}: drop {mode} or {flag}")
    if mode == "--profile" and args.repeat == "auto":
        raise UsageError("--repeat auto repeats a benchmark's timed loops until their spread is small; "
                         "--profile times each step a fixed number of calls: give --repeat a count")


def check_format(args, format_given: bool) -> None:
    """Refuse an output format (``args.format``, already inferred) the mode
    does not write: named as ``--format`` when it was given, else as the
    suffix of ``--output`` that picked it.

    Raises:
        UsageError: the format, the mode, and the formats it writes.
    """
    mode = mode_of(args)
    writes = MODE_FORMATS[mode]
    if args.format in writes:
        return
    formats = f"{', '.join(writes[:-1])} or {writes[-1]}"
    if format_given:
        raise UsageError(f"--format {args.format}: {mode} writes {formats}; choose one of them")
    suffix = os.path.splitext(args.output)[1]
    names = " or ".join(s for s, f in SUFFIX_FORMATS.items() if f in writes)
    raise UsageError(f"--output {args.output}: its {suffix} suffix asks for {args.format}, which {mode} does "
                     f"not write; it writes {formats}: end the file name in {names}, or give --format")


def check_suffixes(args, format_given: bool) -> None:
    """Refuse a file whose suffix names another format than the one written
    into it (fresh-user report: ``--format csv --output x.json`` wrote CSV into
    ``x.json`` without a word): ``--output`` with ``--format`` given, and
    ``--json``, which writes JSON whatever its name, and ``--trace``, which
    writes JSON trace events (``--trace t.csv`` was taken while ``--json
    x.csv`` was refused). A suffix that names no format (``.txt``, none) is
    taken as the user's choice.

    Raises:
        UsageError: the flag, the path, the format its suffix names, the one
            written, and the names that would fit.
    """
    output_suffix = os.path.splitext(args.output or "")[1].lower()
    named = SUFFIX_FORMATS.get(output_suffix)
    if format_given and named not in (None, args.format):
        fits = [s for s, f in SUFFIX_FORMATS.items() if f == args.format] or [".txt"]  # a table: text
        raise UsageError(f"--output {args.output}: its {output_suffix} suffix names {named}, but --format "
                         f"{args.format} writes {args.format}: end the file name in {fits[0]}, or give "
                         f"--format {named}")
    json_suffix = os.path.splitext(getattr(args, "json", None) or "")[1].lower()
    named = SUFFIX_FORMATS.get(json_suffix)
    if named not in (None, "json"):
        raise UsageError(f"--json {args.json}: its {json_suffix} suffix names {named}, but --json writes json: "
                         f"end the file name in .json" + ("" if args.output else f", or give --output {args.json}"))
    trace_suffix = os.path.splitext(getattr(args, "trace", None) or "")[1].lower()
    named = SUFFIX_FORMATS.get(trace_suffix)
    if named not in (None, "json"):  # trace.py: the JSON trace-event format, whatever the name
        raise UsageError(f"--trace {args.trace}: its {trace_suffix} suffix names {named}, but --trace writes json "
                         "(Chrome trace events): end the file name in .json")


def check_output_paths(args) -> None:
    """Refuse ``--output`` / ``--json`` / ``--plot`` / ``--trace`` paths that
    cannot be written, before any work is done (a run can take minutes: a
    ``--json`` path found bad at the end lost every result), and a ``--plot``
    format matplotlib cannot write. Writing is tried
    (:func:`opgraph.atomic_file.check_writable`: a temporary file created and
    removed in the folder, an existing file opened for appending), so that
    root, whom ``os.access`` never refuses, is refused ``/proc/x.json``; a
    device or FIFO (``/dev/null``) is written into directly and not opened
    here; a descriptor's path (``/dev/stdout``, ``/dev/fd/3``) must be open
    for writing.

    Raises:
        UsageError: the path is a folder, its folder does not exist or is a
            file, no file can be created in it or the existing file cannot be
            opened for writing (with the OS's reason); two of the flags name
            one file (the second write replaced the first); the plot's
            extension is not one matplotlib writes.
    """
    named: dict[str, str] = {}
    for flag, path in (("--output", args.output), ("--json", args.json), ("--plot", args.plot),
                       ("--trace", args.trace)):
        if not path:
            continue
        same = named.setdefault(os.path.realpath(path), flag)
        if same != flag:
            raise UsageError(f"{flag} {path}: {same} writes the same file; give each its own")
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise UsageError(f"{flag} {path}: is a folder; give a file name")
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise UsageError(f"{flag} {path}: {folder} is a file, not a folder")
        if not os.path.isdir(folder):
            raise UsageError(f"{flag} {path}: folder {folder} does not exist")
        try:  # tried, not os.access: that says yes to root where nothing can be created (/proc)
            check_writable(path, beside=flag != "--plot")  # matplotlib rewrites a plot in place
        except OSError as e:
            raise UsageError(f"{flag} {path}: {_why_not(e, path)}") from None
    if args.plot:
        kinds = _plot_formats()
        ext = os.path.splitext(args.plot)[1].lstrip(".").lower()
        if kinds and ext not in kinds:
            what = ext or "a file without an extension"
            raise UsageError(f"--plot {args.plot}: matplotlib cannot write {what}; "
                             f"use one of {', '.join(sorted(kinds))}")


def _why_not(e: OSError, path: str) -> str:
    """Why ``path`` cannot be written, from the OS's error ``e`` of
    ``check_writable``: the path itself, or the temporary file in its folder."""
    reason = e.strerror or str(e)
    if e.filename is not None and os.fspath(e.filename) != path:  # the temporary file
        return f"no file can be created in folder {os.path.dirname(os.fspath(e.filename))}: {reason}"
    return f"cannot be written: {reason}"


def _plot_formats() -> set[str]:
    """File extensions matplotlib can write, or an empty set without matplotlib
    (the plot step then says that matplotlib is missing)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return set()
    return set(Figure().canvas.get_supported_filetypes())


__all__ = ["UsageError", "FLAGS", "UNUSED", "MODE_FORMATS", "mode_of", "given", "check_flags", "check_format",
           "check_suffixes", "check_output_paths"]
