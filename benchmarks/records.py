"""The result record of one benchmark column, and what fills it: the
record's skeleton, phase totals, FLOPs, throughput and the per-layer rows
(the document's schema: ``report.py``)."""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
from typing import TYPE_CHECKING

from .protocol import main_step
from .stability import spread

if TYPE_CHECKING:
    from .driver import Settings
    from .models import Model


def release_device(device: str) -> None:
    """Give a finished column's device memory back: collect the cycles that
    may still hold arrays (compiled graphs, CUDA-graph replays), then the
    pool's cached blocks. (The GoogLeNet bf16 ``fft`` column ran out of memory
    on 2026-11-30 after eighteen CUDA-graph columns, with 37.6 GB in the default
    pool of the 139 GB device: something held the rest.)"""
    if device == "cuda":
        import gc

        import cupy

        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()


def new_record(model: Model, precision: str, s: Settings, lowering: str, kind: str) -> dict:
    # ``layout`` is what ran (merging keys on it); the request stays visible beside it
    return {"model": model.key, "batch": model.batch, "dtype": model.dtype, "precision": precision,
            "layout": s.applied_layout, "layout_requested": s.layout, "device": s.device,
            "lowering": lowering, "kind": kind,
            "status": "ok", "reason": None, "notes": []}


#: What a column's note says before a warning raised while compiling it (:func:`warnings_noted`).
WARNING_NOTE = "warning: "
#: The warnings a column's record keeps: ours are RuntimeWarnings (the autotune cache) and
#: UserWarnings (a force key that matches no node or forces nothing: ``passes/lower.py``);
#: libraries' deprecation notices are only shown.
NOTED = (RuntimeWarning, UserWarning)


def _module_of(filename: str):
    """The imported module whose source is ``filename``, or None: what
    ``warnings.showwarning`` is not told and ``warnings.warn_explicit`` needs
    to honour a module-scoped filter and a ``'default'`` filter's memory."""
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == filename:
            return module
    return None


def _issue_traceback(filename: str, lineno: int, caller) -> types.TracebackType | None:
    """The traceback an exception raised where a warning was issued would have had: the
    frames below ``caller`` (the frame of the ``with`` block that is running) on this
    thread's stack, from the block's body down to the frame the warning names
    (``filename:lineno``: the one its ``stacklevel`` chose, ``AutotuneCache.warn`` for the
    autotune cache's). None when that frame is not below ``caller`` (a warning of another
    thread, or one attributed to a caller of the block: ``errors.warn_from_caller``)."""
    stack, frame = [], sys._getframe(1)
    while frame is not None and frame is not caller:
        stack.append((frame, frame.f_lasti, frame.f_lineno))  # the line each frame is at now
        frame = frame.f_back
    issued = next((i for i, (f, _, line) in enumerate(stack)
                   if f.f_code.co_filename == filename and line == lineno), None)
    if frame is None or issued is None:
        return None
    tb = None
    for f, lasti, line in stack[issued:]:  # innermost first: each wraps the one it called
        tb = types.TracebackType(tb, f, lasti, line)
    return tb


@contextlib.contextmanager
def warnings_noted(notes: list[str]):
    """Each warning of :data:`NOTED` raised inside (compiling a column: a corrupt or
    unwritable autotune cache, a hand edit of it not used, a variants function
    that failed: ``passes/autotune_cache.py``; a force key that forces nothing)
    appended to ``notes`` as
    ``'warning: MESSAGE'`` (once), so that the column's JSON record says what
    only standard error said. Every warning is also issued again the moment it
    is raised, under the filters and the ``warnings.showwarning`` in force on
    entry (the command prints it as one line, each message once: ``cli.py``),
    not when the compile returns, which an autotune may take minutes to do.

    Every warning reaches the record, even one an earlier column raised (a
    ``'default'`` filter would show it once per place). One that the filters in
    force turn into an error (``python -W error``) does not stop the compile:
    the first is raised once the block ends, unless the block raised an
    exception of its own, which then goes on unmasked (the note is kept). It is
    the warning's own exception (its category and message) with the traceback it
    would have had had it been raised where it was issued (:func:`_issue_traceback`,
    e.g. ``passes/autotune_cache.py`` in ``AutotuneCache.warn`` and its callers),
    below this function's line that raises it: the innermost frame, which the column's
    error record and its reason name (:func:`error_record`), is where it came from,
    not this module. Those frames stay alive until then (only under such a filter)."""
    show_outside, filters_outside = warnings.showwarning, list(warnings.filters)
    errors: list[Warning] = []  # warnings the filters in force make errors: raised after the block
    caller = sys._getframe(1)  # the with statement's frame, past contextlib's __enter__
    while caller is not None and caller.f_code.co_filename == contextlib.__file__:
        caller = caller.f_back

    def note_and_show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, NOTED) and WARNING_NOTE + str(message) not in notes:
            notes.append(WARNING_NOTE + str(message))
        # issued now, as it would have been without this block (swapped by hand: a
        # catch_warnings here would reset the memory of a 'once' filter at each warning)
        filters_inside, warnings.filters = warnings.filters, filters_outside
        show_inside, warnings.showwarning = warnings.showwarning, show_outside
        module = _module_of(filename)  # a filter scoped to a module (-W ignore::UserWarning:opgraph.x) sees it
        # no module found: none passed (warn_explicit drops a warning whose module is None, shown or not)
        scope = {} if module is None else {"module": module.__name__,
                                           "registry": vars(module).setdefault("__warningregistry__", {})}
        try:
            warnings.warn_explicit(message, category, filename, lineno, **scope)
        except Warning as e:  # an 'error' filter: not raised inside the compile
            errors.append(e.with_traceback(_issue_traceback(filename, lineno, caller) or e.__traceback__))
        finally:
            warnings.filters, warnings.showwarning = filters_inside, show_inside

    with warnings.catch_warnings():
        warnings.simplefilter("always")  # every one, even where an earlier column raised it
        warnings.showwarning = note_and_show
        yield
    if errors:  # only once the block has ended without an exception of its own
        raise errors[0]


def forced_nodes(report) -> dict[str, str]:
    """Node name -> the algorithm it ran, for every node the policy forced
    (``NodeReport.how == 'forced'``: ``force`` keys, ``--lowering @NAME=ALGO``),
    so that a column labelled ``gemm`` says which of its nodes ran something else."""
    nodes = getattr(report, "nodes", {}) or {}
    return {name: r.algorithm for name, r in nodes.items() if r.how == "forced"}


#: Innermost frames an error record keeps (file:line and function of each).
ERROR_FRAMES = 5


def error_record(e: BaseException) -> dict:
    """The ``error`` entry of a failed column: exception ``type``, ``message``
    and the :data:`ERROR_FRAMES` innermost ``frames`` (``file:line in
    function``, innermost last, the file relative to the opgraph package or
    the site-packages folder) of its traceback, so that the failing step can
    be found from the JSON or the log alone."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)[-ERROR_FRAMES:]
    return {"type": type(e).__name__, "message": str(e),
            "frames": [f"{_short_path(f.filename)}:{f.lineno} in {f.name}" for f in frames]}


def error_fields(e: BaseException, context: str = "") -> dict:
    """``status: error``, its ``reason`` line (``context`` first) and the
    ``error`` entry (:func:`error_record`) of a column that raised ``e``."""
    err = error_record(e)
    return {"status": "error", "reason": context + error_reason(err), "error": err}


def _short_path(path: str) -> str:
    """``.../site-packages/cupy/_core/core.py`` -> ``cupy/_core/core.py``;
    a file of this repository relative to its root; others as they are."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if path.startswith(root + os.sep):
        return os.path.relpath(path, root)
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def error_reason(err: dict) -> str:
    """One line for a column's ``reason``: ``type: message (at file:line in f)``,
    the innermost frame."""
    where = f" (at {err['frames'][-1]})" if err.get("frames") else ""
    return f"{err['type']}: {err['message']}{where}"


def phase_totals(times: dict) -> dict:
    med = {p: (t["median_ms"] if t else None) for p, t in times.items()}
    mins = {p: (t["min_ms"] if t else None) for p, t in times.items()}
    back = [p for p in times if p != "forward"]
    bwd = sum(med[p] or 0.0 for p in back)
    bwd_min = sum(mins[p] or 0.0 for p in back)
    return {"forward_ms": med["forward"], "backward_ms": bwd, "total_ms": med["forward"] + bwd,
            "total_min_ms": mins["forward"] + bwd_min}


#: Why a float64-storage record has no ``peak_fraction``.
FLOAT64_PEAK_NOTE = ("peak fraction: none for float64 storage (no float64 matmul peak is measured, and the fp32 "
                     "one is not its ceiling)")


def fill_throughput(rec: dict, peak: dict | None) -> None:
    """Fill ``tflops`` (per phase, backward and total, at the median times) and
    ``peak_fraction`` (total TFLOP/s over the measured matmul peak) of a timed record."""
    tot, times = rec["totals"], rec["times"]
    ms = {"forward": tot["forward_ms"], "backward": tot["backward_ms"], "total": tot["total_ms"]}
    for p in ("backward_data", "backward_filter"):
        if times.get(p):
            ms[p] = times[p]["median_ms"]
    rec["tflops"] = {p: (f / (ms[p] * 1e9) if ms.get(p) else None) for p, f in rec["flops"].items()}
    top = (peak or {}).get("tflops")
    total = rec["tflops"].get("total")
    if rec.get("dtype") == "float64" and top:  # the measured peaks are of fp32 and narrower products
        top = None
        notes = rec.setdefault("notes", [])
        if FLOAT64_PEAK_NOTE not in notes:  # a +graph record starts from its eager record's notes
            notes.append(FLOAT64_PEAK_NOTE)
    rec["peak_fraction"] = total / top if top and total else None


def model_flops(tg) -> dict:
    """FLOPs of one iteration per phase, plus ``backward`` and ``total``: the
    conv/linear layers' forward FLOPs, counted again for backward-filter (every
    layer) and backward-data (every layer but those reading the image)."""
    fwd = sum(tg.layer_flops.values())
    data = sum(tg.layer_flops[k] for k in tg.data_grad_layers)
    return {"forward": fwd, "backward_data": data, "backward_filter": fwd,
            "backward": data + fwd, "total": 2 * fwd + data}


def layer_records(tg, sched, layer_times: dict, na: dict, report) -> list[dict]:
    """One row per conv/linear layer: its algorithm, times (median, min, IQR),
    throughput and workspace per phase, the phases its column's algorithm did not run
    (``not_applicable``) and those the policy forced (``forced``: phase ->
    the algorithm that ran)."""
    nodes = getattr(report, "nodes", {}) or {}
    forced = forced_nodes(report)
    rows = []
    for layer, by_phase in sched.layers.items():
        f = tg.layer_flops[layer]
        row = {"layer": layer, "op": tg.layers[layer], "flops": f, "algorithm": {}, "ms": {},
               "min_ms": {}, "iqr_ms": {}, "tflops": {}, "workspace_bytes": {}, "not_applicable": {},
               "forced": {}, "fused_relu": False}
        for p, steps in by_phase.items():
            main = main_step(steps)
            if main is not None:
                row["algorithm"][p] = main.op.algorithm
                row["fused_relu"] |= main.op.op.fused and main.op.family == "conv"
                rec = nodes.get(main.name)
                row["workspace_bytes"][p] = int(rec.workspace) if rec is not None else 0
                if main.name in na:
                    row["not_applicable"][p] = na[main.name]
                if main.name in forced:
                    row["forced"][p] = forced[main.name]
            t = layer_times.get(layer, {}).get(p)
            if t is not None:
                row["ms"][p], row["min_ms"][p] = t.median_ms, t.min_ms
                row["iqr_ms"][p] = spread(t.times_ms)["iqr_ms"]
                row["tflops"][p] = f / (t.median_ms * 1e9) if t.median_ms > 0 else None
        rows.append(row)
    return rows


__all__ = ["WARNING_NOTE", "warnings_noted", "release_device", "new_record", "forced_nodes", "error_record", "error_reason", "error_fields", "ERROR_FRAMES",
           "phase_totals", "fill_throughput", "model_flops", "layer_records"]
