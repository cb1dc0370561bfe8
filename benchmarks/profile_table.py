"""The tables of a profile document (``opgraph-bench --profile``, :mod:`.profile`):
one per model, a row per op type and direction, slowest first. The caption
gives the whole step twice (one loop of eager calls; replayed as CUDA graphs,
on a GPU) beside the sum of the steps alone, and the notes say how the steps
were timed (:mod:`.step_clock`)."""

from __future__ import annotations

from .profile import SLOWER_FACTOR
from .tables import Table, autotune_note, fmt_ms

HEADERS = ["op", "direction", "steps", "algorithms", "ms", "% of nodes", "MB moved", "GFLOP", "GB/s",
           "TFLOP/s", "% of limit", "limit"]
RIGHT = {"steps", "ms", "% of nodes", "MB moved", "GFLOP", "GB/s", "TFLOP/s", "% of limit"}
#: Reasons for eager steps listed in a table's note (the JSON document has them all).
NOTE_REASONS = 3


def _num(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _limits_line(limits: dict, precision: str) -> str:
    mm, cp = limits.get("matmul", {}).get(precision, {}), limits.get("copy", {})
    tf = mm.get("tflops")
    gb = cp.get("gbps")
    return (f"limits measured in this run: {precision} matrix multiply {_num(tf, 2) if tf else 'n/a'} TFLOP/s "
            f"({mm.get('method') or mm.get('error', '')}); copy {_num(gb, 0) if gb else 'n/a'} GB/s "
            f"({cp.get('method') or cp.get('error', '')})")


def _caption(rec: dict) -> str:
    whole = f"whole step eager {fmt_ms(rec['step_ms'])} ms"
    if rec.get("graph_step_ms") is not None:
        whole += f", as CUDA graphs {fmt_ms(rec['graph_step_ms'])} ms"
    alone = f"sum of the steps alone {fmt_ms(rec['nodes_ms'])} ms"
    timing = rec.get("timing") or {}  # absent from schema-1 documents
    if timing.get("clock") == "graph":
        alone += f" ({timing['graph_steps']} graph-timed, {timing['eager_steps']} eager)"
    return (f"{rec['title']} (batch {rec['batch']}, {rec['dtype']}, {rec['layout']}, "
            f"{rec['precision']}, lowering {rec['lowering']}): {whole}; {alone}")


def _timing_notes(rec: dict) -> list[str]:
    """How the steps alone and the whole step as graphs were timed, with the
    reasons for eager steps (most frequent first)."""
    timing = rec.get("timing")
    if not timing:
        return []
    notes = [f"steps alone timed by {timing['method']}"]
    if timing["clock"] == "graph" and timing["eager_steps"]:
        reasons = sorted(timing["eager_reasons"].items(), key=lambda kv: -kv[1])
        shown = "; ".join(f"{why} ({n})" for why, n in reasons[:NOTE_REASONS])
        more = f"; {len(reasons) - NOTE_REASONS} more reasons in the JSON document" \
            if len(reasons) > NOTE_REASONS else ""
        notes.append(f"{timing['eager_steps']} steps timed eagerly: {shown}{more}")
    capture = rec.get("graph_step_capture")
    if capture and "error" in capture:
        notes.append(f"whole step as CUDA graphs: not timed ({capture['error']})")
    elif capture:
        notes.append(f"whole step as CUDA graphs: {capture['captured_steps']} of {capture['steps']} steps "
                     f"captured in {capture['graphs']} graphs, the others run eagerly between them")
    return notes


def _slower_note(rec: dict) -> str | None:
    """The steps that ran well above their autotuned median (``profile.slower_than_tuned``)."""
    slow = rec.get("slower_than_tuned") or []
    if not slow:
        return None
    shown = ", ".join(f"{r['name']} ({fmt_ms(r['ms'])} vs {fmt_ms(r['tuned_ms'])})" for r in slow[:5])
    return (f"{len(slow)} step(s) ran above {SLOWER_FACTOR:g}x the median autotune measured for their choice "
            f"(in place vs tuned, ms): {shown}{' ...' if len(slow) > 5 else ''}")


def _steps_cell(r: dict, graph_timed: bool) -> str:
    eager = r.get("eager_steps", 0)
    return f"{r['count']} ({eager} eager)" if graph_timed and eager else str(r["count"])


#: the limit column per step kind (``profile.group_by_op``)
_LIMIT = {"compute": "matmul", "memory": "copy", "view": "none (zero-copy)"}


def profile_tables(doc: dict) -> list[Table]:
    """A :class:`.tables.Table` per model record of a profile document: per op
    type and direction, the steps (with how many were timed eagerly when others
    were graph-timed), their algorithms, the summed time alone, its share of
    the nodes' sum, MB moved, GFLOP, achieved GB/s and TFLOP/s, and the
    fraction of the limit that bounds it (``matmul`` peak for convolutions and
    GEMMs, ``copy`` bandwidth for the rest; none for zero-copy steps that
    copy nothing)."""
    tables = []
    for rec in doc["models"]:
        total = rec["nodes_ms"] or None
        graph_timed = (rec.get("timing") or {}).get("clock") == "graph"
        rows = [[r["op"], r["direction"], _steps_cell(r, graph_timed),
                 ", ".join(f"{a} {n}" for a, n in sorted(r["algorithms"].items())),
                 fmt_ms(r["ms"]), _num(100 * r["ms"] / total) if total else "-",
                 _num(r["bytes"] / 1e6), _num(r["flops"] / 1e9, 2), _num(r["gbps"]), _num(r["tflops"], 3),
                 _num(100 * r["fraction"]) if r["fraction"] is not None else "-",
                 _LIMIT[r["kind"]]]
                for r in rec["by_op"]]
        notes = [_limits_line(doc.get("limits", {}), rec["precision"]), *_timing_notes(rec),
                 "ms: each step timed alone (median), summed per row; MB: inputs read + output written "
                 "once, in the storage dtype (a zero-copy step: what it copies); % of limit: TFLOP/s of "
                 "the matmul peak (conv, linear) or GB/s of the copy bandwidth (every other op; none for a "
                 "zero-copy step that copies nothing); a step on tensors that stay in cache can pass 100 %"]
        notes += filter(None, [autotune_note(rec), _slower_note(rec)])
        notes += rec.get("notes", [])  # what was asked and not applied (precision, layout)
        tables.append(Table(_caption(rec), list(HEADERS), rows, set(RIGHT), notes=notes))
    return tables


__all__ = ["profile_tables"]
