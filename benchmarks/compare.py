"""``opgraph-bench compare A.json B.json``: what changed between two runs.

For every column the two documents share (model, lowering, precision,
storage dtype, layout and batch) and that both timed, one row per phase (forward,
backward-data, backward-filter or PyTorch's backward, the total, and the
whole step timed as one loop, the only figure of a ``+graph`` peer): A's
and B's median with its spread, the ratio B / A, and whether the change is
beyond both runs' spread, as ``asv compare`` and ``pytest-benchmark
compare`` mark only the changes their statistics support:

* a phase's spread is the interquartile range of its loop's calls
  (:func:`stability.spread`; the step's of its loop), the total's the phases' IQRs summed
  (:func:`stability.total_spread`); both come from ``times_ms``, so files
  written before the spread was recorded compare too;
* a change is ``slower`` or ``faster`` when ``|median_B - median_A|``
  exceeds both A's IQR and B's; otherwise it is within the noise (blank);
  a loop of one call has no spread, and its change is ``?``.

Columns in one file only are listed in a note, and so is a shared column
whose two runs lowered it differently (an op type's algorithms or a fusion
rule's rewrites differ: a cache re-tuned, an engine gone, a rule added or
excluded; or the policies they compiled with differ), since its ratio then
compares two programs, not two timings of one (a fusion rule the policy
turned off shows as ``excluded``). When the files share no timed column
there are no rows to show: the table and Markdown forms print only the notes
that say so (no empty table), the CSV form writes nothing to standard output
(not a header alone); the CSV form's notes always go to standard error, and JSON gives ``rows:
[]`` beside ``only_a`` / ``only_b``. Exit status 0 (rows or none), or 2 when a
file cannot be read, is not an ``opgraph-bench`` benchmark document, has
another ``schema_version`` than the one timing runs write
(:data:`.report.SCHEMA_VERSION`), or a field this comparison reads has a
value of the wrong kind (a hand edit: ``median_ms = "x"``, ``results =
"oops"``): one line naming the file, the field and the value
(:func:`check_document`).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys

from .flag_values import BriefUsageParser, ParagraphFormatter, one_of
from .report import SCHEMA_VERSION, write_tables
from .stability import spread, total_spread
from .tables import Table, fmt_ms, precision_label

PHASES = ("forward", "backward_data", "backward_filter", "backward")
FORMATS = ("table", "markdown", "json", "csv")
#: The name of the command ``compare`` is a subcommand of, as the console script is called
COMMAND = "opgraph-bench"


def usage(command: str = COMMAND) -> str:
    """The subcommand's usage as ``command`` (:data:`COMMAND`, or how it was
    invoked: ``python -m opgraph.benchmarks``) is typed: its short usage-error
    line and the main command's ``--help`` epilog give it."""
    return f"{command} compare A.json B.json [--format {'|'.join(FORMATS)}]"


#: The command's usage, as the ``opgraph-bench`` console script is typed (:func:`usage`)
USAGE = usage()
#: CSV columns, one row per shared column and phase (:func:`compare`'s rows)
CSV_FIELDS = ("model", "lowering", "precision", "layout", "batch", "dtype", "phase", "a_ms", "a_iqr_ms",
              "b_ms", "b_iqr_ms", "ratio", "change")
#: The note of two files that share no timed column (:func:`comparison_table`)
NOTHING_SHARED = ("no column was timed in both files (same model, lowering, precision, layout, batch and "
                  "storage dtype): nothing to compare")


def load(path: str) -> dict:
    """A benchmark document from ``path``.

    Raises:
        ValueError: unreadable, not JSON, or not an ``opgraph-bench`` benchmark document.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror})") from None
    except ValueError as e:
        raise ValueError(f"{path}: is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("tool") != "opgraph-bench" or doc.get("mode") != "benchmark":
        raise ValueError(f"{path}: is not an opgraph-bench benchmark document (--format json of a timing run)")
    check_document(doc, path)
    return doc


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Field:
    """Checks of the fields of one document, each failure a ``ValueError``
    naming the file, the field's path and the value."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, value, what: str):
        raise ValueError(f"{self.path}: {where} = {_shown(value)}: {what}")

    def kind(self, where: str, value, types, what: str, optional: bool = False):
        if value is None and optional:
            return value
        if isinstance(value, bool) or not isinstance(value, types):
            self.fail(where, value, what)
        return value

    def number(self, where: str, value, optional: bool = False):
        self.kind(where, value, (int, float), "must be a number of milliseconds", optional)
        if value is not None and not (math.isfinite(value) and value >= 0):
            self.fail(where, value, "must be a finite number of milliseconds >= 0")
        return value

    def loop(self, where: str, t) -> None:
        """One timed loop: ``times_ms`` (a non-empty list of numbers) and ``median_ms``."""
        self.kind(where, t, dict, "must be an object (a timed loop) or null", optional=True)
        if not t or t.get("times_ms") is None:  # no calls recorded: the comparison skips it
            return
        times = self.kind(f"{where}.times_ms", t["times_ms"], list, "must be a list of milliseconds")
        if not times:
            self.fail(f"{where}.times_ms", times, "must list at least one call")
        for i, x in enumerate(times):
            self.number(f"{where}.times_ms[{i}]", x)
        self.number(f"{where}.median_ms", t.get("median_ms"))


def check_document(doc: dict, path: str) -> None:
    """Refuse a benchmark document whose ``schema_version`` is not
    :data:`.report.SCHEMA_VERSION` or whose fields :func:`compare` reads
    have values of the wrong kind: ``results`` a list of objects, and in each
    timed (``status: ok``) one the key fields (``model``, ``lowering``,
    ``precision``: strings; ``layout``, ``dtype``: strings or null;
    ``batch``: an integer or null), each loop of ``times`` and ``step``
    (``times_ms``: numbers, ``median_ms``: a number) and, where a phase was
    timed, ``totals.total_ms``.

    Raises:
        ValueError: ``'B.json: results[0].times.forward.median_ms = "x": must
            be a number of milliseconds'``.
    """
    f = _Field(path)
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        f.fail("schema_version", version, f"this opgraph-bench compares schema_version {SCHEMA_VERSION}, "
                                          "the version its timing runs write")
    results = f.kind("results", doc.get("results"), list, "must be a list of results (one per column)")
    for i, r in enumerate(results):
        where = f"results[{i}]"
        f.kind(where, r, dict, "must be an object (one column's result)")
        f.kind(f"{where}.status", r.get("status"), str, "must be a status string (ok, n/a, error, ...)")
        if r["status"] != "ok":
            continue
        for key in ("model", "lowering", "precision"):
            f.kind(f"{where}.{key}", r.get(key), str, "must be a string")
        for key in ("layout", "dtype"):
            f.kind(f"{where}.{key}", r.get(key), str, "must be a string or null", optional=True)
        f.kind(f"{where}.batch", r.get("batch"), int, "must be an integer or null", optional=True)
        times = f.kind(f"{where}.times", r.get("times"), dict, "must be an object (phase -> loop) or null",
                       optional=True) or {}
        for phase, t in times.items():
            f.loop(f"{where}.times.{phase}", t)
        f.loop(f"{where}.step", r.get("step"))
        if any(t and t.get("times_ms") for t in times.values()):
            totals = f.kind(f"{where}.totals", r.get("totals"), dict, "must be an object with total_ms")
            f.number(f"{where}.totals.total_ms", totals.get("total_ms"))


def _key(r: dict) -> tuple:
    """What makes two records the same column: model, lowering, precision,
    layout, batch and storage dtype (a batch-2 run is no baseline of a
    batch-1 run, nor float64 storage of float32)."""
    return (r["model"], r["lowering"], precision_label(r), r.get("layout") or "NCHW", r.get("batch"),
            r.get("dtype") or "float32")


def _timed(doc: dict) -> dict[tuple, dict]:
    return {_key(r): r for r in doc.get("results", ())
            if r.get("status") == "ok" and (r.get("times") or r.get("step"))}


def _figures(r: dict) -> dict[str, tuple[float, float | None]]:
    """Phase -> (median ms, IQR ms or None) of one record, with ``total`` (the
    phases summed) and ``step`` (the whole step as one loop) where it has them."""
    out = {}
    times = r.get("times") or {}
    for p in PHASES:
        t = times.get(p)
        if t and t.get("times_ms"):
            out[p] = (t["median_ms"], spread(t["times_ms"])["iqr_ms"])
    if out:
        total = total_spread(times)
        out["total"] = (r["totals"]["total_ms"], total["iqr_ms"] if total else None)
    step = r.get("step")
    if step and step.get("times_ms"):
        out["step"] = (step["median_ms"], spread(step["times_ms"])["iqr_ms"])
    return out


def change(a: tuple[float, float | None], b: tuple[float, float | None]) -> str:
    """``'slower'``, ``'faster'``, ``''`` (within a spread) or ``'?'`` (no spread)."""
    (ma, ia), (mb, ib) = a, b
    if ia is None or ib is None:
        return "?"
    delta = mb - ma
    if abs(delta) <= ia or abs(delta) <= ib:
        return ""
    return "slower" if delta > 0 else "faster"


def lowering_changes(a: dict, b: dict) -> list[str]:
    """What two records of one column lowered differently, one line each: an op type's
    algorithms (``'Conv2dBackwardData: cudnn 37 -> cudnn 36, fft 1'``, from ``algorithms``:
    op type -> algorithm -> node count; ``-``: no node of that type) or a fusion rule's
    rewrites (``'fusion pool-scan: 13 -> excluded'``, from ``fusion``: rule -> ``applied``, or
    ``excluded`` by the policy, or ``-`` when the record has no entry for the rule: a file
    written before it existed); empty when the records agree or either lacks both fields (a
    peer column, a file written before they were recorded). A rule compares by what it
    rewrote: none, excluded or absent alike, and how often it declined not at all; so the
    records' ``policy`` fields are compared too (``'policy exclude: - -> ['relu-bias-sums']'``):
    a policy that excludes a rule that rewrote nothing (on the CPU without ``fused-reference``)
    still makes another program, if not another step."""
    lines = []
    pol_a, pol_b = a.get("policy"), b.get("policy")
    if isinstance(pol_a, dict) and isinstance(pol_b, dict):
        lines += [f"policy {key}: {_setting(pol_a.get(key))} -> {_setting(pol_b.get(key))}"
                  for key in sorted(set(pol_a) | set(pol_b)) if pol_a.get(key) != pol_b.get(key)]
    alg_a, alg_b = a.get("algorithms"), b.get("algorithms")
    if isinstance(alg_a, dict) and isinstance(alg_b, dict):
        lines += [f"{op}: {_counts(alg_a.get(op))} -> {_counts(alg_b.get(op))}"
                  for op in sorted(set(alg_a) | set(alg_b)) if alg_a.get(op) != alg_b.get(op)]
    fus_a, fus_b = a.get("fusion"), b.get("fusion")
    if isinstance(fus_a, dict) and isinstance(fus_b, dict):
        lines += [f"fusion {rule}: {_fusion(fus_a.get(rule))[1]} -> {_fusion(fus_b.get(rule))[1]}"
                  for rule in sorted(set(fus_a) | set(fus_b))
                  if _fusion(fus_a.get(rule))[0] != _fusion(fus_b.get(rule))[0]]
    return lines


def _setting(value) -> str:
    """A policy setting as a note shows it: ``-`` for none (absent, None or empty)."""
    return "-" if value in (None, [], {}, "") else str(value)


def _fusion(entry) -> tuple[int, str]:
    """A fusion record's entry for one rule (``LoweringReport.fusion``) as
    (rewrites, as shown): ``{'applied': 13, ...}`` -> ``(13, '13')``,
    ``{'excluded': True}`` -> ``(0, 'excluded')``, ``{'opt_in': True}`` with no rewrite (a
    rule waiting for ``include=['fused-reference']`` on the CPU's oracle kernels; in a file of
    before 2026-12-05, an opt-in rule not included) -> ``(0, 'opt_in')``, the record's word, as
    the printed table and ``exe.report`` show it; none -> ``(0, '-')``."""
    if not isinstance(entry, dict):
        return (entry, str(entry)) if isinstance(entry, int) and not isinstance(entry, bool) else (0, "-")
    if entry.get("excluded"):
        return 0, "excluded"
    if entry.get("opt_in") and not entry.get("applied"):
        return 0, "opt_in"
    applied = entry.get("applied")
    return (applied, str(applied)) if isinstance(applied, int) and not isinstance(applied, bool) else (0, "-")


def _counts(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{name} {n}" for name, n in sorted(value.items()))
    return str(value)


def _label(k: tuple) -> str:
    return f"{k[0]} / {k[1]} / {k[2]} (batch {k[4]}, {k[5]}, {k[3]})"


def compare(a: dict, b: dict) -> dict:
    """``{rows, only_a, only_b, lowered_differently}``: a row per shared timed
    column and phase (``model``, ``lowering``, ``precision``, ``layout``,
    ``batch``, ``dtype``, ``phase``, ``a_ms``, ``a_iqr_ms``, ``b_ms``,
    ``b_iqr_ms``, ``ratio`` = B / A, ``change``), the columns timed in one
    document only, and per shared column whose runs lowered it differently
    its label -> :func:`lowering_changes`."""
    ta, tb = _timed(a), _timed(b)
    rows = []
    changed = {}
    for key in (k for k in ta if k in tb):
        if differences := lowering_changes(ta[key], tb[key]):
            changed[_label(key)] = differences
        fa, fb = _figures(ta[key]), _figures(tb[key])
        for phase in (p for p in (*PHASES, "total", "step") if p in fa and p in fb):
            (ma, ia), (mb, ib) = fa[phase], fb[phase]
            rows.append(dict(zip(("model", "lowering", "precision", "layout", "batch", "dtype"), key),
                             phase=phase, a_ms=ma, a_iqr_ms=ia, b_ms=mb, b_iqr_ms=ib,
                             ratio=mb / ma if ma > 0 else None, change=change(fa[phase], fb[phase])))
    return {"rows": rows, "only_a": [_label(k) for k in ta if k not in tb],
            "only_b": [_label(k) for k in tb if k not in ta], "lowered_differently": changed}


def _iqr(x) -> str:
    return "?" if x is None else f"±{fmt_ms(x)}"


def comparison_table(result: dict, name_a: str, name_b: str) -> Table:
    """The rows of :func:`compare` as one table, with its notes; the layout in a
    column of its own beside the precision, as in the CSV form."""
    headers = ["model", "batch", "lowering", "precision", "layout", "phase", "A ms", "A IQR", "B ms", "B IQR",
               "B / A", "change"]
    rows = [[r["model"], r["batch"], r["lowering"], r["precision"], r["layout"], r["phase"], fmt_ms(r["a_ms"]),
             _iqr(r["a_iqr_ms"]), fmt_ms(r["b_ms"]), _iqr(r["b_iqr_ms"]), "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
             r["change"]] for r in result["rows"]]
    counts = {c: sum(r["change"] == c for r in result["rows"]) for c in ("slower", "faster", "", "?")}
    notes = [f"A: {name_a}; B: {name_b}; ms per mini-batch, median; IQR: interquartile range of the "
             "calls (total: the phases' summed); B / A above 1: B is slower",
             f"change: beyond both runs' IQR: {counts['slower']} slower, {counts['faster']} faster; "
             f"{counts['']} within the spread" + (f"; {counts['?']} without a spread (one call)"
                                                  if counts["?"] else "")]
    if not result["rows"]:  # nothing the legend and the counts above describe; which file is A still is
        notes = [f"{NOTHING_SHARED} (A: {name_a}; B: {name_b})"]
    for label, differences in result.get("lowered_differently", {}).items():
        notes.append(f"{label}: the runs lowered it differently, so B / A compares two programs: "
                     + "; ".join(differences))
    if result["only_a"]:
        notes.append(f"timed in A only: {', '.join(result['only_a'])}")
    if result["only_b"]:
        notes.append(f"timed in B only: {', '.join(result['only_b'])}")
    return Table(f"{name_b} against {name_a}", headers, rows,
                 right={"batch", "A ms", "A IQR", "B ms", "B IQR", "B / A"}, notes=notes)


#: ``opgraph-bench compare --help``'s epilog: what it prints when nothing is shared, and its exit status.
EPILOG = ("csv: the rows on standard output, the notes on standard error. Files that share no timed column: "
          "table and markdown print only the notes saying so, csv nothing on standard output, json "
          "\"rows\": []. "
          "Exit status 0, rows or none; 2: a file that is no opgraph-bench benchmark document (one line "
          "naming the file and the field).")


def build_parser(command: str = COMMAND) -> argparse.ArgumentParser:
    """The parser of ``COMMAND compare``; ``command`` is how the main command
    was invoked (its ``--help`` and usage errors name it)."""
    p = BriefUsageParser(prog=f"{command} compare", brief=usage(command).removeprefix(f"{command} compare "),
                                description="Speedups and regressions between two opgraph-bench JSON "
                                            "documents, by model, lowering, precision, layout and phase; a "
                                            "change is marked when it exceeds both runs' interquartile range.",
                                epilog=EPILOG, formatter_class=ParagraphFormatter)
    p.add_argument("a", metavar="A.json", help="the baseline (--format json of a timing run)")
    p.add_argument("b", metavar="B.json", help="the run compared with it")
    p.add_argument("--format", choices=FORMATS, type=one_of(FORMATS, "format"), default="table",
                   help="table (default), markdown, json or csv (one row per shared column and phase)")
    return p


def main(argv: list[str], command: str = COMMAND) -> int:
    """``opgraph-bench compare``; returns the exit status (module docstring).
    ``command``: how the main command was invoked (:func:`build_parser`)."""
    args = build_parser(command).parse_args(argv)
    try:
        a, b = load(args.a), load(args.b)
    except ValueError as e:
        print(f"{command} compare: error: {e}", file=sys.stderr)
        return 2
    result = compare(a, b)
    if args.format == "json":
        sys.stdout.write(json.dumps({"a": args.a, "b": args.b, **result}, indent=1) + "\n")
        return 0
    table = comparison_table(result, args.a, args.b)
    if args.format == "csv":  # rows on standard output (none: not even a header), the notes on standard error
        if result["rows"]:
            buf = io.StringIO()
            w = csv.DictWriter(buf, CSV_FIELDS, lineterminator="\n")
            w.writeheader()
            w.writerows(result["rows"])
            sys.stdout.write(buf.getvalue())
        sys.stderr.write("".join(f"opgraph-bench compare: {n}\n" for n in table.notes))
    elif not result["rows"]:  # the notes alone: an empty bordered table says nothing more
        bullet = "- " if args.format == "markdown" else ""
        sys.stdout.write("".join(f"{bullet}{n}\n" for n in table.notes))
    elif args.format == "markdown":
        from .markdown import table_markdown

        sys.stdout.write(table_markdown(table))
    else:
        write_tables([table], sys.stdout)
    return 0


__all__ = ["load", "check_document", "compare", "lowering_changes", "change", "comparison_table", "build_parser", "main",
           "CSV_FIELDS", "NOTHING_SHARED", "EPILOG", "USAGE", "COMMAND", "usage"]
