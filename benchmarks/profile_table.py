"""The tables of a profile document (``opgraph-bench --profile``, :mod:`.profile`):
one per model, a row per op type and direction, slowest first."""

from __future__ import annotations

from .tables import Table, autotune_note, fmt_ms

HEADERS = ["op", "direction", "steps", "algorithms", "ms", "% of nodes", "MB moved", "GFLOP", "GB/s",
           "TFLOP/s", "% of limit", "limit"]
RIGHT = {"steps", "ms", "% of nodes", "MB moved", "GFLOP", "GB/s", "TFLOP/s", "% of limit"}


def _num(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _limits_line(limits: dict, precision: str) -> str:
    mm, cp = limits.get("matmul", {}).get(precision, {}), limits.get("copy", {})
    tf = mm.get("tflops")
    gb = cp.get("gbps")
    return (f"limits measured in this run: {precision} matrix multiply {_num(tf, 2) if tf else 'n/a'} TFLOP/s "
            f"({mm.get('method') or mm.get('error', '')}); copy {_num(gb, 0) if gb else 'n/a'} GB/s "
            f"({cp.get('method') or cp.get('error', '')})")


def profile_tables(doc: dict) -> list[Table]:
    """A :class:`.tables.Table` per model record of a profile document: per op
    type and direction, the steps, their algorithms, the summed time alone,
    its share of the nodes' sum, MB moved, GFLOP, achieved GB/s and TFLOP/s,
    and the fraction of the limit that bounds it (``matmul`` peak for
    convolutions and GEMMs, ``copy`` bandwidth for the rest)."""
    tables = []
    for rec in doc["models"]:
        total = rec["nodes_ms"] or None
        rows = [[r["op"], r["direction"], str(r["count"]),
                 ", ".join(f"{a} {n}" for a, n in sorted(r["algorithms"].items())),
                 fmt_ms(r["ms"]), _num(100 * r["ms"] / total) if total else "-",
                 _num(r["bytes"] / 1e6), _num(r["flops"] / 1e9, 2), _num(r["gbps"]), _num(r["tflops"], 3),
                 _num(100 * r["fraction"]) if r["fraction"] is not None else "-",
                 "matmul" if r["kind"] == "compute" else "copy"]
                for r in rec["by_op"]]
        caption = (f"{rec['title']} (batch {rec['batch']}, {rec['dtype']}, {rec['layout']}, "
                   f"{rec['precision']}, lowering {rec['lowering']}): whole step {fmt_ms(rec['step_ms'])} ms, "
                   f"steps alone {fmt_ms(rec['nodes_ms'])} ms")
        notes = [_limits_line(doc.get("limits", {}), rec["precision"]),
                 "ms: each step timed alone (median), summed per row; MB: inputs read + output written "
                 "once, in the storage dtype; % of limit: TFLOP/s of the matmul peak (conv, linear) "
                 "or GB/s of the copy bandwidth (every other op)"]
        notes += filter(None, [autotune_note(rec)])
        tables.append(Table(caption, list(HEADERS), rows, set(RIGHT), notes=notes))
    return tables


__all__ = ["profile_tables"]
