"""Rendering of ``opgraph-bench`` documents: table, JSON, CSV, Markdown.

A result is a plain dict (a *document*) so that it round-trips through JSON:

* ``{"tool", "mode": "summary", "schema_version", "environment", "notes", "models": [...]}``
  (``--summary``) where each model holds ``layers`` (one dict per node:
  ``name``, ``op``, ``output_shape``, ``params``, ``flops``, ``gflop``,
  ``out_bytes``, ``detail``) and ``totals``;
* ``{"tool", "mode": "benchmark", "schema_version", "environment",
  "protocol", "peak", "lowerings", "notes", "models", "results",
  "elapsed_s"}`` (a timing run, :func:`driver.run_benchmark`): one entry
  of ``results`` per model x precision x column; its keys are listed in
  :data:`RESULT_KEYS` and described in README.md ("JSON schema").

Tables use ``rich`` when it is installed (the ``bench`` extra) and aligned
plain text otherwise; both show the same columns (:mod:`.tables`).
"""

from __future__ import annotations

import csv
import io
import json
from typing import Sequence, TextIO

from opgraph.analysis import LayerRow, Totals

from .tables import Table, all_tables

FORMATS = ("table", "json", "csv", "markdown")
#: ``schema_version`` of a timing run's document (``driver.run_benchmark``; README "JSON schema"),
#: the one ``opgraph-bench compare`` reads.
SCHEMA_VERSION = 1
#: ``schema_version`` of a ``--summary`` document (README, "opgraph-bench"; ``--profile``'s:
#: ``profile.PROFILE_SCHEMA_VERSION``).
SUMMARY_SCHEMA_VERSION = 1

#: Keys of every benchmark result (timed ones add the optional keys).
RESULT_KEYS = ("model", "batch", "dtype", "precision", "layout", "layout_requested", "device",
               "lowering", "kind", "status", "reason", "notes")
#: Keys a timed (``status: ok``) opgraph result adds.
TIMED_KEYS = ("policy", "compile_s", "autotune", "fusion", "forced", "algorithms", "precision_applied", "not_applicable",
              "check", "memory", "times", "totals", "step", "flops", "tflops", "peak_fraction", "layers")
#: Statuses of a result.
STATUSES = ("ok", "n/a", "mismatch", "error", "unavailable", "skipped")


def layer_record(row: LayerRow) -> dict:
    """The JSON form of one summary row."""
    return {"name": row.name, "op": row.op, "output_shape": list(row.shape),
            "params": row.params, "flops": row.flops, "gflop": row.gflop,
            "out_bytes": row.out_bytes, "detail": row.detail}


def model_record(key: str, spec_key: str, title: str, batch: int, dtype: str,
                 rows: Sequence[LayerRow], total: Totals) -> dict:
    """The JSON form of one model's summary."""
    return {"model": key, "spec_key": spec_key, "title": title, "batch": batch,
            "dtype": dtype, "layers": [layer_record(r) for r in rows],
            "totals": total.as_dict()}


# ---- formatting helpers ----------------------------------------------------
def _shape(shape) -> str:
    return "x".join(str(s) for s in shape) if shape else "scalar"


def _int(n: int) -> str:
    return f"{n:,}"


def _gflop(x: float) -> str:
    return f"{x:.3f}"


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f}"


def _summary_tables(doc: dict):
    """(caption, headers, rows, footer) for each model of a summary document."""
    headers = ["layer", "op", "output shape", "params", "GFLOP", "out MiB"]
    for m in doc["models"]:
        rows = [[r["name"], r["op"], _shape(r["output_shape"]), _int(r["params"]),
                 _gflop(r["gflop"]), _mb(r["out_bytes"])] for r in m["layers"]]
        t = m["totals"]
        footer = [f"total ({t['layers']} node{'' if t['layers'] == 1 else 's'})", "", "", _int(t["params"]), _gflop(t["gflop"]),
                  _mb(t["activation_bytes"])]
        per_image = t["flops"] / m["batch"] / 1e9 if m["batch"] else 0.0
        caption = (f"{m['title']} [{m['model']}, spec {m['spec_key']}]: batch {m['batch']}, "
                   f"{m['dtype']}; {t['params'] / 1e6:.3f} M params, "
                   f"{t['gflop']:.2f} GFLOP forward per batch ({per_image:.4f} per image), "
                   f"peak live activations {_mb(t['peak_bytes'])} MiB")
        yield caption, headers, rows, footer


_RIGHT = {"params", "GFLOP", "out MiB"}


def summary_tables(doc: dict) -> list[Table]:
    """The tables of a ``--summary`` document."""
    return [Table(caption, headers, rows, _RIGHT, footer=footer)
            for caption, headers, rows, footer in _summary_tables(doc)]


def render_plain(t: Table) -> str:
    """One table as aligned plain text (caption first, notes after)."""
    body = t.rows + ([t.footer] if t.footer else [])
    widths = [max(len(str(c)) for c in col) for col in zip(t.headers, *body)]

    def line(cells):
        return "  ".join(str(c).rjust(w) if h in t.right else str(c).ljust(w)
                         for c, w, h in zip(cells, widths, t.headers)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [t.caption, line(t.headers), rule] + [line(r) for r in t.rows]
    if t.footer:
        out += [rule, line(t.footer)]
    out += [f"  {n}" for n in t.notes]
    return "\n".join(out) + "\n"


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
        return True
    except ImportError:
        return False


def _rich_write(stream: TextIO, tables: list[Table]) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    tty = hasattr(stream, "isatty") and stream.isatty()
    # every column in full (no truncation, no folding of numbers): a table wider than the
    # terminal overflows it, as plain text would
    need = max((sum(max(len(str(c)) for c in col) + 3 for col in zip(t.headers, *t.rows)) + 4
                for t in tables if t.rows), default=80)
    width = max(Console(file=stream).width if tty else 100, need)
    # height too: on a TERM=dumb terminal rich ignores a width given alone (80 columns: every cell cut)
    console = Console(file=stream, width=width, height=25, highlight=False, color_system="auto" if tty else None)
    # captions and notes are prose: wrapped at the terminal's width (the console above may be
    # wider, for the table), and in a file or pipe one line each, not cut at the table's width
    prose = Console(file=stream, highlight=False, color_system="auto") if tty else None

    def say(text: str) -> None:
        if prose is not None:
            prose.print(Text(text))
        else:
            console.print(Text(text), soft_wrap=True)

    for t in tables:
        # Text() keeps names such as "[alexnet]" from being read as rich markup.
        table = RichTable(show_footer=t.footer is not None, show_header=any(t.headers))
        for i, h in enumerate(t.headers):
            table.add_column(h, footer=Text(t.footer[i] if t.footer else ""),
                             justify="right" if h in t.right else "left", no_wrap=True)
        for r in t.rows:
            table.add_row(*(Text(str(c)) for c in r))
        say(t.caption)
        console.print(table)
        for n in t.notes:
            say(f"  {n}")


def tables_of(doc: dict) -> list[Table]:
    """The tables of any document (summary, profile or benchmark)."""
    if doc["mode"] == "profile":
        from .profile_table import profile_tables
        return profile_tables(doc)
    return summary_tables(doc) if doc["mode"] == "summary" else all_tables(doc)


def write_table(doc: dict, stream: TextIO, *, use_rich: bool | None = None) -> None:
    """Write ``doc`` as human-readable tables (notes first) to ``stream``."""
    for note in doc.get("notes", ()):
        stream.write(f"# {note}\n")
    write_tables(tables_of(doc), stream, use_rich=use_rich)


def write_tables(tables: list[Table], stream: TextIO, *, use_rich: bool | None = None) -> None:
    """Write ``tables`` with ``rich`` when it is installed, else as aligned plain text."""
    if use_rich is None:
        use_rich = _rich_available()
    if use_rich:
        _rich_write(stream, tables)
    else:
        for i, t in enumerate(tables):
            stream.write(("\n" if i else "") + render_plain(t))


def render_json(doc: dict) -> str:
    return json.dumps(doc, indent=1) + "\n"


#: CSV columns of a benchmark document (one row per result and layer, plus a
#: ``(total)`` row per result).
CSV_COLUMNS = ("model", "batch", "precision", "layout", "device", "lowering", "kind", "status",
               "layer", "op", "algorithm", "forward_ms", "backward_data_ms", "backward_filter_ms",
               "backward_ms", "total_ms", "total_min_ms", "gflop", "tflops_forward",
               "tflops_backward_data", "tflops_backward_filter", "tflops_total", "peak_fraction",
               "vs_torch", "planned_peak_bytes", "live_peak_bytes", "measured_peak_bytes",
               "reserved_peak_bytes", "workspace_bytes", "max_rel_error", "reason", "step_ms",
               "step_iqr_ms", "vs_best_peer", "best_peer", "first_call_s", "forced")


def _benchmark_csv_rows(doc: dict):
    for r in doc["results"]:
        head = {k: r.get(k) for k in ("model", "batch", "precision", "layout", "device", "lowering",
                                      "kind", "status")}
        times, tot, mem = r.get("times") or {}, r.get("totals") or {}, r.get("memory") or {}
        tf, flops = r.get("tflops") or {}, r.get("flops") or {}
        yield {**head, "layer": "(total)", "forward_ms": tot.get("forward_ms"),
               "backward_data_ms": (times.get("backward_data") or {}).get("median_ms"),
               "backward_filter_ms": (times.get("backward_filter") or {}).get("median_ms"),
               "backward_ms": tot.get("backward_ms"), "total_ms": tot.get("total_ms"),
               "total_min_ms": tot.get("total_min_ms"),
               "gflop": flops["total"] / 1e9 if flops.get("total") else None,
               "tflops_forward": tf.get("forward"), "tflops_backward_data": tf.get("backward_data"),
               "tflops_backward_filter": tf.get("backward_filter"), "tflops_total": tf.get("total"),
               "peak_fraction": r.get("peak_fraction"),
               "vs_torch": (r.get("vs_torch") or {}).get("step"),
               "step_ms": (r.get("step") or {}).get("median_ms"),
               "step_iqr_ms": (r.get("step") or {}).get("iqr_ms"),
               "vs_best_peer": (r.get("vs_best_peer") or {}).get("ratio"),
               "best_peer": (r.get("vs_best_peer") or {}).get("peer"),
               "first_call_s": r.get("first_call_s"),
               "planned_peak_bytes": mem.get("planned_peak_bytes"),
               "live_peak_bytes": mem.get("live_peak_bytes"),
               "measured_peak_bytes": mem.get("measured_peak_bytes"),
               "reserved_peak_bytes": mem.get("reserved_peak_bytes"),
               "workspace_bytes": mem.get("workspace_total_bytes"),
               "max_rel_error": (r.get("check") or {}).get("max_rel_error"), "reason": r.get("reason"),
               "forced": "; ".join(f"{n}={a}" for n, a in (r.get("forced") or {}).items()) or None}
        for x in r.get("layers") or ():
            if not x["ms"]:  # not timed per layer (--no-per-layer, a +graph record): no row
                continue
            yield {**head, "layer": x["layer"], "op": x["op"],
                   "algorithm": "/".join(x["algorithm"].get(p, "-") for p in
                                         ("forward", "backward_data", "backward_filter")),
                   "forward_ms": x["ms"].get("forward"),
                   "backward_data_ms": x["ms"].get("backward_data"),
                   "backward_filter_ms": x["ms"].get("backward_filter"),
                   "gflop": x["flops"] / 1e9, "tflops_forward": x["tflops"].get("forward"),
                   "tflops_backward_data": x["tflops"].get("backward_data"),
                   "tflops_backward_filter": x["tflops"].get("backward_filter"),
                   "workspace_bytes": sum(x["workspace_bytes"].values()),
                   "reason": "; ".join(f"{p}: {w}" for p, w in x["not_applicable"].items()) or None,
                   "forced": "; ".join(f"{p}={a}" for p, a in x.get("forced", {}).items()) or None}


def render_csv(doc: dict) -> str:
    """CSV: one row per layer (summary, with a ``(total)`` row per model), or
    for a benchmark one ``(total)`` row per result then one per layer
    (:data:`CSV_COLUMNS`; empty cells where a value does not apply)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if doc["mode"] == "summary":
        w.writerow(["model", "batch", "dtype", "layer", "op", "output_shape", "params",
                    "flops", "out_bytes"])
        for m in doc["models"]:
            head = [m["model"], m["batch"], m["dtype"]]
            for r in m["layers"]:
                w.writerow(head + [r["name"], r["op"], _shape(r["output_shape"]), r["params"],
                                   r["flops"], r["out_bytes"]])
            t = m["totals"]
            w.writerow(head + ["(total)", "", "", t["params"], t["flops"], t["activation_bytes"]])
    else:
        w.writerow(CSV_COLUMNS)
        for row in _benchmark_csv_rows(doc):
            w.writerow(["" if row.get(c) is None else row[c] for c in CSV_COLUMNS])
    return buf.getvalue()


def write(doc: dict, fmt: str, stream: TextIO) -> None:
    """Write ``doc`` in format ``fmt`` (:data:`FORMATS`).

    Raises:
        ValueError: unknown format, or ``markdown`` of a summary document.
    """
    if fmt == "table":
        write_table(doc, stream)
    elif fmt == "json":
        stream.write(render_json(doc))
    elif fmt == "csv":
        stream.write(render_csv(doc))
    elif fmt == "markdown":
        from .markdown import render_markdown

        stream.write(render_markdown(doc))
    else:
        raise ValueError(f"format {fmt!r}: must be one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "RESULT_KEYS", "TIMED_KEYS", "STATUSES", "CSV_COLUMNS", "layer_record",
           "model_record", "summary_tables", "render_plain", "tables_of", "write", "write_table", "write_tables",
           "render_json", "render_csv"]
