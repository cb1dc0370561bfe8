"""Rendering of ``opgraph-bench`` results as a table, JSON or CSV.

A result is a plain dict (a *document*) so that it round-trips through JSON:

* ``{"tool", "mode": "summary", "environment", "notes", "models": [...]}``
  where each model holds ``layers`` (one dict per node: ``name``, ``op``,
  ``output_shape``, ``params``, ``flops``, ``gflop``, ``out_bytes``,
  ``detail``) and ``totals``;
* ``{"tool", "mode": "forward", "environment", "notes", "results": [...]}``
  with one :meth:`ForwardTiming.as_dict` per model.

Tables use ``rich`` when it is installed (the ``bench`` extra) and aligned
plain text otherwise; both show the same columns.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Sequence, TextIO

from opgraph.analysis import LayerRow, Totals

FORMATS = ("table", "json", "csv")


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


def _ms(x: float) -> str:
    return f"{x:.2f}" if x < 1000 else f"{x:.0f}"


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f}"


def _summary_tables(doc: dict):
    """(caption, headers, rows, footer) for each model of a summary document."""
    headers = ["layer", "op", "output shape", "params", "GFLOP", "out MiB"]
    for m in doc["models"]:
        rows = [[r["name"], r["op"], _shape(r["output_shape"]), _int(r["params"]),
                 _gflop(r["gflop"]), _mb(r["out_bytes"])] for r in m["layers"]]
        t = m["totals"]
        footer = [f"total ({t['layers']} nodes)", "", "", _int(t["params"]), _gflop(t["gflop"]),
                  _mb(t["activation_bytes"])]
        per_image = t["flops"] / m["batch"] / 1e9 if m["batch"] else 0.0
        caption = (f"{m['title']} [{m['model']}, spec {m['spec_key']}]: batch {m['batch']}, "
                   f"{m['dtype']}; {t['params'] / 1e6:.3f} M params, "
                   f"{t['gflop']:.2f} GFLOP forward per batch ({per_image:.4f} per image), "
                   f"peak live activations {_mb(t['peak_bytes'])} MiB")
        yield caption, headers, rows, footer


def _forward_table(doc: dict):
    headers = ["model", "batch", "device", "lowering", "median ms", "min ms", "GFLOP",
               "GFLOP/s", "warmup+repeat"]
    rows = [[r["model"], str(r["batch"]), r["device"], r["lowering"], _ms(r["median_ms"]),
             _ms(r["min_ms"]), _gflop(r["gflop"]), f"{r['gflops_per_s']:.1f}",
             f"{r['warmup']}+{r['repeat']}"] for r in doc["results"]]
    caption = "forward pass, milliseconds per mini-batch (median and min over the timed calls)"
    return caption, headers, rows


_RIGHT = {"params", "GFLOP", "out MiB", "batch", "median ms", "min ms", "GFLOP/s"}


def _plain(caption: str, headers, rows, footer=None) -> str:
    body = rows + ([footer] if footer else [])
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *body)]

    def line(cells):
        return "  ".join(str(c).rjust(w) if h in _RIGHT else str(c).ljust(w)
                         for c, w, h in zip(cells, widths, headers)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [caption, line(headers), rule] + [line(r) for r in rows]
    if footer:
        out += [rule, line(footer)]
    return "\n".join(out) + "\n"


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
        return True
    except ImportError:
        return False


def _rich_write(stream: TextIO, tables) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    tty = hasattr(stream, "isatty") and stream.isatty()
    console = Console(file=stream, width=None if tty else 140, highlight=False,
                      color_system="auto" if tty else None)
    for caption, headers, rows, footer in tables:
        # Text() keeps names such as "[alexnet]" from being read as rich markup.
        table = Table(show_footer=footer is not None)
        for i, h in enumerate(headers):
            table.add_column(h, footer=Text(footer[i] if footer else ""),
                             justify="right" if h in _RIGHT else "left", no_wrap=True)
        for r in rows:
            table.add_row(*(Text(c) for c in r))
        console.print(Text(caption))
        console.print(table)


def write_table(doc: dict, stream: TextIO, *, use_rich: bool | None = None) -> None:
    """Write ``doc`` as human-readable tables (notes first) to ``stream``."""
    for note in doc.get("notes", ()):
        stream.write(f"# {note}\n")
    if doc["mode"] == "summary":
        tables = list(_summary_tables(doc))
    else:
        caption, headers, rows = _forward_table(doc)
        tables = [(caption, headers, rows, None)]
    if use_rich is None:
        use_rich = _rich_available()
    if use_rich:
        _rich_write(stream, tables)
    else:
        for i, t in enumerate(tables):
            stream.write(("\n" if i else "") + _plain(*t))


def render_json(doc: dict) -> str:
    return json.dumps(doc, indent=1) + "\n"


def render_csv(doc: dict) -> str:
    """CSV: one row per layer (summary, with a ``(total)`` row per model) or
    one row per model (forward timings)."""
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
        cols = ["model", "batch", "dtype", "device", "lowering", "warmup", "repeat",
                "median_ms", "min_ms", "mean_ms", "gflop", "gflops_per_s"]
        w.writerow(cols)
        for r in doc["results"]:
            w.writerow([r[c] for c in cols])
    return buf.getvalue()


def write(doc: dict, fmt: str, stream: TextIO) -> None:
    """Write ``doc`` in format ``fmt`` (``table``, ``json`` or ``csv``).

    Raises:
        ValueError: unknown format.
    """
    if fmt == "table":
        write_table(doc, stream)
    elif fmt == "json":
        stream.write(render_json(doc))
    elif fmt == "csv":
        stream.write(render_csv(doc))
    else:
        raise ValueError(f"format {fmt!r}: must be one of {FORMATS}")


__all__ = ["FORMATS", "layer_record", "model_record", "write", "write_table",
           "render_json", "render_csv"]
