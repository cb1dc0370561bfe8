"""Markdown rendering of benchmark documents (``--format markdown``, ``docs/results-h200.md``).

:func:`render_markdown` writes the tables of :mod:`.tables` as GitHub pipe
tables under headings: environment, measured peak, one end-to-end table per
precision, per-layer milliseconds and TFLOP/s per model and precision, and
memory. :func:`merge` joins several result documents (e.g. one JSON file
per precision from separate runs on the same machine) into one, so that
``scripts/results_to_markdown.py a.json b.json`` renders them together.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .profile_table import profile_tables
from .tables import (Table, end_to_end_tables, environment_table, layer_tables, layout_label,
                     memory_tables, peak_table)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table_markdown(t: Table, heading: str | None = None) -> str:
    """One table: a heading (or the caption in italics), the pipe table, its notes."""
    out = [heading if heading is not None else f"*{_cell(t.caption)}*", ""]
    headers = [h or " " for h in t.headers]
    out.append("| " + " | ".join(_cell(h) for h in headers) + " |")
    out.append("|" + "|".join("---:" if h in t.right else "---" for h in t.headers) + "|")
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    if t.footer:
        out.append("| " + " | ".join(_cell(c) for c in t.footer) + " |")
    if t.notes:
        out.append("")
        out += [f"- {_cell(n)}" for n in t.notes]
    return "\n".join(out) + "\n"


def _section(level: int, title: str, tables: Iterable[Table]) -> list[str]:
    parts = []
    for t in tables:
        parts.append(table_markdown(t, f"{'#' * level} {title}: {t.caption}" if title else
                                    f"{'#' * level} {t.caption}"))
    return parts


def render_markdown(doc: dict, *, level: int = 3, per_layer_tflops: bool = True) -> str:
    """The Markdown of a benchmark document, or of a ``--profile`` one
    (:func:`render_profile_markdown`); ``level``: heading depth of each table.

    Raises:
        ValueError: a ``--summary`` document (its tables are the table and CSV formats').
    """
    if doc.get("mode") == "profile":
        return render_profile_markdown(doc, level=level)
    if doc.get("mode") != "benchmark":
        raise ValueError("--format markdown renders timing runs and profiles only (not --summary)")
    h = "#" * level
    parts = [f"{h} Environment\n\n" + table_markdown(environment_table(doc), "").lstrip("\n")]
    if len(doc.get("runs") or []) > 1:  # a merged document: which run each row may come from
        parts.append(table_markdown(runs_table(doc["runs"]), f"{h} Runs merged (a later run's row replaces an earlier one)"))
    parts.append(table_markdown(peak_table(doc), f"{h} Matrix-multiply peak"))
    if doc.get("notes"):
        parts.append("\n".join(f"- {_cell(n)}" for n in doc["notes"]) + "\n")
    parts += _section(level, "", end_to_end_tables(doc))
    parts += _section(level, "", layer_tables(doc))
    if per_layer_tflops:
        parts += _section(level, "", layer_tables(doc, "tflops"))
    parts += _section(level, "", memory_tables(doc))
    return "\n".join(parts)


def render_profile_markdown(doc: dict, *, level: int = 3) -> str:
    """The Markdown of a ``--profile`` document: its notes, then each model's
    table (:func:`.profile_table.profile_tables`) under a heading, the
    table's notes (the limits it is judged against) below it."""
    parts = ["\n".join(f"- {_cell(n)}" for n in doc["notes"]) + "\n"] if doc.get("notes") else []
    return "\n".join(parts + _section(level, "", profile_tables(doc)))


def runs_table(runs: Sequence[dict]) -> Table:
    """One row per merged run: time stamp, commit, layout, precisions, command line."""
    def command(argv):
        return "`" + (" ".join(map(str, argv)) if isinstance(argv, (list, tuple)) else str(argv)) + "`" if argv else ""

    rows = [[r.get("timestamp") or "", r.get("git_commit") or "", r.get("layout") or "", r.get("precision") or "",
             command(r.get("argv"))] for r in runs]
    return Table("runs merged", ["time stamp", "commit", "layout", "precision", "command"], rows)


def merge(docs: Sequence[dict]) -> dict:
    """One document from several benchmark documents: results concatenated in
    order, a later run of the same (model, storage dtype, precision, layout, lowering, kind)
    replacing an earlier one unless it failed where the earlier did not (a
    re-run of a column, and the peer measured beside it, win); models and
    peaks joined (first occurrence wins), notes joined; the environment is the
    first's, with every run's time stamp and commit listed under ``runs``."""
    if not docs:
        raise ValueError("no document to merge")
    bad = [i for i, d in enumerate(docs) if d.get("mode") != "benchmark"]
    if bad:
        raise ValueError(f"document(s) {bad} are not timing runs (mode != 'benchmark')")
    out = {k: v for k, v in docs[0].items() if k not in ("results", "models", "peak", "notes")}
    out["environment"] = dict(docs[0]["environment"])
    out["environment"]["precision"] = list(dict.fromkeys(
        p for d in docs for p in d["environment"].get("precision", [])))
    out["environment"]["batch"] = {k: v for d in docs for k, v in (d["environment"].get("batch") or {}).items()}
    out["environment"]["layout"] = ", ".join(dict.fromkeys(
        str(d["environment"].get("layout")) for d in docs if d["environment"].get("layout")))
    # files written before layout_requested existed asked for what they ran
    out["environment"]["layout_requested"] = ", ".join(dict.fromkeys(
        str(d["environment"].get("layout_requested") or d["environment"].get("layout"))
        for d in docs if d["environment"].get("layout")))
    out["runs"] = [{"timestamp": d["environment"].get("timestamp"),
                    "git_commit": d["environment"].get("git_commit"),
                    "layout": layout_label(d["environment"]),
                    "precision": ", ".join(d["environment"].get("precision") or []),
                    "argv": d["environment"].get("argv")} for d in docs]
    out["results"] = _latest(r for d in docs for r in d["results"])
    models, peak, notes = {}, {}, []
    for d in docs:
        for m in d.get("models", []):
            models.setdefault(m["model"], m)
        for p, v in d.get("peak", {}).items():
            peak.setdefault(p, v)
        notes += [n for n in d.get("notes", []) if n not in notes]
    out.update(models=list(models.values()), peak=peak, notes=notes)
    return out


def _latest(results) -> list[dict]:
    kept: dict[tuple, dict] = {}
    for r in results:
        key = tuple(r.get(k) for k in ("model", "dtype", "precision", "layout", "lowering", "kind"))
        old = kept.get(key)
        if old is None or r.get("status") == "ok" or old.get("status") != "ok":
            kept.pop(key, None)  # re-insert: keep the order of the latest run
            kept[key] = r
    return list(kept.values())


__all__ = ["render_markdown", "render_profile_markdown", "table_markdown", "merge", "runs_table"]
