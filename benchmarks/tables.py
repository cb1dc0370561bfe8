"""The tables of a benchmark document, shared by the terminal and Markdown renderers.

Each builder turns the result document of :func:`driver.run_benchmark` into
:class:`Table` records (caption, headers, rows of strings, footnotes), so the
rich/plain terminal output and ``--format markdown`` (``docs/results-h200.md``)
show the same numbers:

* :func:`environment_table`: where and how it ran;
* :func:`peak_table`: the matmul peak of each precision, measured in the run;
* :func:`end_to_end_tables`: one per precision, a row per model and column,
  convnet-benchmarks README style (forward, backward, total ms per
  mini-batch; median, min), the whole step timed as one loop (median and
  interquartile range), TFLOP/s, fraction of peak, ratios of the whole step
  to PyTorch eager and to the fastest peer, compile / first-call seconds,
  peak memory and the check's largest relative error;
* :func:`layer_tables`: per model and precision, a row per conv/linear layer
  and a column per lowering: forward / backward-data / backward-filter ms
  (``-`` where the layer has no such phase, ``†`` where the lowering did not
  apply and the footnote says why and what ran instead, ``?`` where the
  loop's spread is too wide to trust, :func:`.stability.unstable_phases`);
* :func:`memory_tables`: planned (with and without workspace), live and
  measured peaks, workspace totals.
"""

from __future__ import annotations

from typing import Iterable

import attrs

from opgraph.passes.autotune_clock import describe as describe_autotune
from opgraph.passes.fuse import OPT_IN_RULES
from opgraph.passes.report import describe_fusion

from .peer_run import PEERS as PEER_KINDS
from .stability import SPREAD_LIMIT, total_spread, unstable_phases
MARK = "†"
#: Marks a column with nodes the policy forced, and each forced layer cell.
FORCED_MARK = "‡"
#: The most unstable cells a per-layer table's note names, widest spread first (a loaded
#: machine marked every cell of GoogLeNet's table: a 6 KB line).
UNSTABLE_LISTED = 6
#: Marks a per-layer time whose loop's spread is too wide to trust (:func:`.stability.unstable_phases`).
UNSTABLE_MARK = "?"
#: A column whose autotune took longer than this (seconds) gets a note saying
#: where that time went (:func:`autotune_note`); shorter ones are not worth a line.
AUTOTUNE_NOTE_SECONDS = 5.0


@attrs.define
class Table:
    """A rendered-to-strings table."""

    caption: str
    headers: list[str]
    rows: list[list[str]]
    right: set = attrs.field(factory=set)
    notes: list[str] = attrs.field(factory=list)
    footer: list[str] | None = None


def fmt_ms(x) -> str:
    """Milliseconds with about three significant digits; ``-`` for None."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def fmt_num(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_rate(x) -> str:
    """A FLOP rate with three significant digits (``47.4``, ``0.0641``); ``-`` for None."""
    return "-" if x is None else f"{x:.3g}"


def fmt_mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f}"


def fmt_err(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def precision_label(r: dict) -> str:
    """A result's precision as tables group it: ``'bf16'``, or with the storage
    dtype when that is not float32 (``'bf16, bfloat16 storage'``, ``'fp32,
    float64 storage'``), so that a ``--dtype bfloat16`` (or float64) run never
    shares a table with a float32-storage run of the same precision."""
    dtype = r.get("dtype") or "float32"
    return r["precision"] if dtype == "float32" else f"{r['precision']}, {dtype} storage"


def precisions(doc: dict) -> list[str]:
    """The precision labels of ``doc``'s results (:func:`precision_label`), in run order."""
    return list(dict.fromkeys(precision_label(r) for r in doc["results"]))


def ordered(doc: dict, precision: str) -> list[dict]:
    """The results of the precision label ``precision`` (:func:`precision_label`): by model (run order), opgraph columns in
    run order, each ``<lowering>+graph`` right after its ``<lowering>``, then
    the peers."""
    models = [m["model"] for m in doc["models"]]
    res = [r for r in doc["results"] if precision_label(r) == precision]
    def column(r):  # a +graph record belongs with its eager lowering
        return r["model"], r["lowering"].removesuffix("+graph")

    first: dict[tuple, int] = {}  # column -> rank of its first record
    for i, r in enumerate(res):
        first.setdefault(column(r), i)
    return sorted(res, key=lambda r: (models.index(r["model"]) if r["model"] in models else len(models),
                                      r["kind"] != "opgraph", first[column(r)],
                                      r["lowering"].endswith("+graph")))


def _status_cell(r: dict, columns: dict[str, list[str]]) -> str:
    """``n/a [1]``-style marker for an untimed result: note 1 is its status and
    reason (``columns``: each such text -> the columns it stands for, so that a
    reason shared by many columns, e.g. PyTorch missing, is written once)."""
    reason = f"{r['status']}: {r.get('reason') or ''}".rstrip(": ")
    columns.setdefault(reason, []).append(f"{r['model']} / {r['lowering']}")
    return f"{r['status']} [{list(columns).index(reason) + 1}]"


def _status_notes(columns: dict[str, list[str]], said: dict[str, str], caption: str) -> list[str]:
    """The notes of :func:`_status_cell`; a reason an earlier table gave already
    (``said``: reason -> that table's caption) points there instead."""
    out = []
    for reason, cols in columns.items():
        status = reason.split(":", 1)[0]
        text = reason if reason not in said else f"{status}: as in the table '{said[reason]}'"
        said.setdefault(reason, caption)
        out.append(f"{', '.join(cols)}: {text}")
    return out


def _step_cell(step: dict | None) -> str:
    """The whole step's median and interquartile range: ``'2.80 ±0.05'``; the median alone when
    fewer than two calls were timed (one call has no spread: ``'2.80'``, not ``'2.80 ±0.000'``)."""
    if not step:
        return "-"
    times = step.get("times_ms")
    if times is not None and len(times) < 2:
        return fmt_ms(step["median_ms"])
    return f"{fmt_ms(step['median_ms'])} ±{fmt_ms(step.get('iqr_ms'))}"


def step_gap(r: dict) -> str | None:
    """``'L1 / gemm: total 675, step 520 ±10'`` when a timed column's total (the
    phase loops' medians summed) and its step (the whole step as one loop) differ
    by more than their spreads together (the phases' IQRs summed,
    :func:`.stability.total_spread`, plus the step's); None when they agree, or
    when either has a single call, whose spread is not known."""
    step, times = r.get("step") or {}, r.get("times") or {}
    total = (r.get("totals") or {}).get("total_ms")
    if total is None or len(step.get("times_ms") or ()) < 2:
        return None
    phases = total_spread(times)
    if phases is None:
        return None
    if abs(total - step["median_ms"]) <= phases["iqr_ms"] + (step.get("iqr_ms") or 0.0):
        return None
    return f"{r['model']} / {r['lowering']}: total {fmt_ms(total)}, step {_step_cell(step)}"


def step_gap_note(gaps: list[str]) -> str | None:
    """The table's note on the columns whose total and step disagree (:func:`step_gap`)."""
    if not gaps:
        return None
    return (f"total vs step: {'; '.join(gaps)}: they differ by more than their spreads, as they time different "
            "loops: total sums the phases, each timed in a loop of its own, step times the whole step as one loop, so caches, a loaded CPU or the "
            "device's queue treat the two differently; the ratios to the peers use step")


def _ratio_cell(ratio: dict | None, key: str, who: str | None = None) -> str:
    x = (ratio or {}).get(key)
    if x is None:
        return "-"
    return f"{x:.2f}x" + (f" ({ratio[who]})" if who else "")


def forced_note(r: dict) -> str | None:
    """``'‡ alexnet / gemm: forced by the policy: fft: conv2, conv2.grad/...'``:
    every node of a column the policy forced, by the algorithm it ran; None
    when none was forced."""
    forced = r.get("forced") or {}
    if not forced:
        return None
    by_algo: dict[str, list[str]] = {}
    for node, algo in forced.items():
        by_algo.setdefault(algo, []).append(node)
    return (f"{FORCED_MARK} {r['model']} / {r['lowering']}: {len(forced)} node(s) forced by the policy: "
            + "; ".join(f"{algo}: {', '.join(nodes)}" for algo, nodes in by_algo.items()))


def autotune_note(r: dict) -> str | None:
    """``'resnet50 / auto: autotune 295.0 s: inputs 12.0 s, reference 40.0 s, ...'``:
    where a column's autotune wall time went (``r['autotune']``, the summary of
    ``passes/autotune_clock.py``), when it took more than
    :data:`AUTOTUNE_NOTE_SECONDS`; None otherwise, and for a ``+graph`` column
    (it replays its eager column's compile, whose note says it)."""
    summary = r.get("autotune")
    if not summary or summary["total_s"] <= AUTOTUNE_NOTE_SECONDS or r["lowering"].endswith("+graph"):
        return None
    return f"{r['model']} / {r['lowering']}: {describe_autotune(summary)}"


def cache_note(autotune: dict | None, what: str = "node choices", compiled_by: str = "this run's compile"
               ) -> str | None:
    """The note of a compile whose autotune reused ``what`` read from its
    cache file (``LoweringReport.autotune``: ``file_hits``, ``cache_path``),
    naming the file; None when every choice was timed by ``compiled_by`` or no
    autotune ran. Such a choice was measured by the run that wrote the file,
    perhaps under other code or load: a reader of the times should know."""
    hits = (autotune or {}).get("file_hits")
    if not hits:
        return None
    decided = autotune["nodes_tuned"] + autotune["cache_hits"]
    return (f"autotune: {hits} of {decided} {what} were read from the autotune cache "
            f"{autotune['cache_path']}, timed when they were written there, not by {compiled_by} (the "
            "environment variable OPGRAPH_CACHE=off times every candidate afresh)")


def column_cache_note(r: dict) -> str | None:
    """``'alexnet / auto: autotune: 8 of 8 node choices were read from the
    autotune cache ...'``: :func:`cache_note` of a benchmark column; None for a
    ``+graph`` column (its eager column's note says it)."""
    said = None if r["lowering"].endswith("+graph") else cache_note(r.get("autotune"))
    return f"{r['model']} / {r['lowering']}: {said}" if said else None


def warning_notes(r: dict) -> list[str]:
    """``'alexnet / auto: warning: autotune cache ... is corrupt ...'``: the
    warnings raised while compiling a column (``records.warnings_noted``) and its
    notes on what a setting could not do (``...: no effect``: a policy key the
    device or pipeline has no use for), named by the column (a ``+graph`` column
    by its eager column, whose notes it starts from)."""
    name = r["lowering"].removesuffix("+graph")
    return [f"{r['model']} / {name}: {n}" for n in r.get("notes", ())
            if n.startswith("warning: ") or "no effect" in n]


#: What a fusion line's ``opt_in:`` names, said once under a table that shows one.
OPT_IN_NOTE = ("fusion rules: rewrites per rule of the fuse pass's table; opt_in: rules that on the CPU "
               "wait for include=['fused-reference'] (their kernels there are the float64 oracles; "
               "a lowering entry such as gemm,include=fused-reference turns them on), or, on any device, "
               "for their own name while their kernels have not yet run on a GPU ("
               + ", ".join(f"{name}: auto,include={name}" for name in sorted(OPT_IN_RULES)) + ")")


def fusion_note(r: dict) -> str | None:
    """``'densenet121 / auto: fusion rules: bn-backward-sums 121, elementwise 312'``:
    which rules of the fuse pass's table rewrote (or declined) how many matches
    in a column (``r['fusion']``, ``LoweringReport.fusion``), which waited for the
    ``fused-reference`` opt-in on the CPU's oracles (``opt_in: elementwise``, as the
    record says ``'opt_in': True``) and which the policy excluded
    (:func:`~opgraph.passes.report.describe_fusion`); None when no rule did any of
    these, and for a ``+graph`` column (it replays its eager column's compile)."""
    if not r.get("fusion") or r["lowering"].endswith("+graph"):
        return None
    said = describe_fusion(r["fusion"])
    return f"{r['model']} / {r['lowering']}: fusion rules: {said}" if said else None


def layout_label(env: dict) -> str:
    """The layout a run computed in, with the one asked for when it differs
    (NHWC asked for on the CPU runs NCHW): ``'NCHW (NHWC requested)'``."""
    applied, asked = env.get("layout"), env.get("layout_requested")
    return f"{applied} ({asked} requested)" if asked and asked != applied else str(applied)


def environment_table(doc: dict) -> Table:
    env, proto = doc["environment"], doc.get("protocol", {})
    keys = [("device", "device"), ("device_name", "name"), ("nvidia_driver", "NVIDIA driver"),
            ("cuda_runtime", "CUDA runtime"), ("cuda_driver", "CUDA driver API"),
            ("cudnn_backend", "cuDNN"), ("cudnn_frontend", "cuDNN frontend"), ("cupy", "CuPy"),
            ("numpy", "NumPy"), ("torch", "PyTorch"), ("python", "Python"),
            ("git_commit", "commit"), ("timestamp", "time stamp")]
    rows = [[label, str(env[k])] for k, label in keys if env.get(k) is not None]
    rows += [["precision", ", ".join(env.get("precision", []))], ["layout", layout_label(env)],
             ["batch", ", ".join(f"{k} {v}" for k, v in (env.get("batch") or {}).items())],
             ["protocol", f"{proto.get('warmup')} warm-up + {proto.get('repeat')} timed calls per "
                          f"loop; {proto.get('clock')}"]]
    threads = env.get("threads") or {}
    if env.get("device") == "cpu" and threads:  # what a CPU comparison with PyTorch depends on
        blas, own = threads.get("blas"), threads.get("torch")
        rows.append(["threads", (f"NumPy BLAS {blas} ({threads.get('blas_source')})" if blas else "NumPy BLAS unknown")
                     + (f", PyTorch {own}" if own else "")])
    return Table("environment", ["", ""], rows)


def peak_table(doc: dict) -> Table:
    rows = []
    expected = (doc.get("stability") or {}).get("expected_peak", {})
    after = doc.get("peak_after") or {}
    for p, d in doc.get("peak", {}).items():
        want = (expected.get(p) or {}).get("tflops")
        rows.append([p, fmt_rate(d.get("tflops")), fmt_rate((after.get(p) or {}).get("tflops")),
                     fmt_rate(want), d.get("error") or d.get("note") or d.get("method", "")])
    # the reference a run is held against (stability.expected_peak): on a GPU a quiet
    # measurement, on the CPU a nominal rate that the measured peak may exceed
    notes = [f"reference {p}: {e['how']}" for p, e in expected.items()] + run_stability_notes(doc)
    return Table("measured matrix-multiply peak (this run)",
                 ["precision", "TFLOP/s", "at the end", "reference", "how"], rows,
                 right={"TFLOP/s", "at the end", "reference"}, notes=notes)


def _mem(r: dict):
    m = r.get("memory") or {}
    return m.get("measured_peak_bytes") if m.get("measured_peak_bytes") is not None \
        else m.get("planned_peak_bytes")


def spread_cell(r: dict, notes: list[str]) -> str:
    """``'±4%'``: the column's spread (``stability``); ``'±14% unstable'`` when
    flagged, its own reasons joining ``notes`` (the run's are noted once)."""
    st = r.get("stability") or {}
    rel = st.get("spread")
    cell = "-" if rel is None else f"±{rel:.0%}"
    if rel is not None and rel > SPREAD_LIMIT and f"{rel:.0%}" == f"{SPREAD_LIMIT:.0%}":
        cell = f"±{rel:.1%}"  # 10.2 % flagged "above 10 %" would read ±10%
    if st.get("unstable"):
        cell += " unstable"
        own = [why for why in st.get("reasons", ()) if not why.startswith("run: ")]
        if own:
            notes.append(f"unstable: {r['model']} / {r['lowering']}: {'; '.join(own)}")
    return cell


def run_stability_notes(doc: dict) -> list[str]:
    """The run's own reasons to doubt every column (``doc['stability']``)."""
    st = doc.get("stability") or {}
    return [f"unstable run: {why}" for why in st.get("reasons", ())]


def end_to_end_tables(doc: dict) -> Iterable[Table]:
    headers = ["model", "lowering", "forward", "bwd data", "bwd filter", "backward", "total",
               "total min", "spread", "step", "TFLOP/s", "% peak", "vs torch", "vs best peer",
               "compile s", "peak MiB", "max rel err"]
    right = set(headers) - {"model", "lowering"}
    said: dict[str, str] = {}
    for prec in precisions(doc):
        rows, columns, extra, gaps = [], {}, [], []  # extra: the forced and unstable columns' notes
        caption = f"end to end, {prec}: milliseconds per mini-batch"
        for r in ordered(doc, prec):
            # a mismatch or error after the compile has these too
            extra += filter(None, [autotune_note(r), column_cache_note(r)])
            for note in warning_notes(r):  # a +graph column starts from its eager column's notes
                if note not in extra:
                    extra.append(note)
            if r["status"] != "ok":
                rows.append([r["model"], r["lowering"], _status_cell(r, columns)] + [""] * 14)
                continue
            t, tot = r["times"], r["totals"]
            chk = r.get("check") or {}
            err = chk.get("max_rel_error")
            if err is None:
                err = (chk.get("end_to_end") or {}).get("max_grad")
            frac = r.get("peak_fraction")
            forced = forced_note(r)
            if forced:
                extra.append(forced)
            fused = fusion_note(r)
            if fused:
                extra.append(fused)
            gaps += filter(None, [step_gap(r)])
            rows.append([r["model"], r["lowering"] + (f" {FORCED_MARK}" if forced else ""),
                         fmt_ms(tot["forward_ms"]),
                         fmt_ms((t.get("backward_data") or {}).get("median_ms")),
                         fmt_ms((t.get("backward_filter") or {}).get("median_ms")),
                         fmt_ms(tot["backward_ms"]), fmt_ms(tot["total_ms"]), fmt_ms(tot["total_min_ms"]),
                         spread_cell(r, extra), _step_cell(r.get("step")),
                         fmt_rate((r.get("tflops") or {}).get("total")),
                         "-" if frac is None else f"{100 * frac:.0f}%",
                         _ratio_cell(r.get("vs_torch"), "step"),
                         _ratio_cell(r.get("vs_best_peer"), "ratio", "peer"), _compile_cell(r),
                         fmt_mib(_mem(r)), fmt_err(err)])
        notes = _status_notes(columns, said, caption) + extra + run_stability_notes(doc)
        waiting = any(isinstance(v, dict) and v.get("opt_in") for r in ordered(doc, prec) if fusion_note(r)
                      for v in r["fusion"].values())  # a fusion line shows an opt_in rule
        notes += filter(None, [step_gap_note(gaps), OPT_IN_NOTE if waiting else None])
        notes += ["times: ms per mini-batch, median over the timed calls (total min: sum of minima); "
                  "backward = backward-data + backward-filter (PyTorch: one autograd pass; +graph "
                  "peers: the whole step only)",
                  "spread: the phases' interquartile ranges summed, over the total (a column without "
                  "phases: the step's); unstable: above 10 %, or a run whose measured matmul peak is "
                  "far below the device's reference peak (benchmarks/stability.py)",
                  "step: the whole training step timed as one loop, median ±interquartile range; "
                  "opgraph +graph: the phases' CUDA graphs replayed back to back",
                  "vs torch: opgraph step / PyTorch eager step; vs best peer: opgraph step / the "
                  "fastest peer's step in this run (above 1: slower than PyTorch; -: no peer in this "
                  f"run, {_peer_hint(doc, prec)})",
                  "TFLOP/s: the step's FLOPs over its total time; % peak: of the matrix peak measured "
                  "in the run; peak MiB: the memory table's measured peak (the planned one without a GPU)",
                  "compile s: opgraph compile (autotune included); PyTorch: first call (torch.compile "
                  "included), + warm-up and capture for +graph",
                  "max rel err: largest per-node relative error against the float64 reference "
                  "(PyTorch and +graph columns: end-to-end, largest over the gradients)"]
        yield Table(caption, headers, rows, right, notes)


def _peer_hint(doc: dict, prec: str) -> str:
    """How to add peers to a run of ``prec``: the strongest ones on a GPU; on the CPU (the CUDA-graph
    peers need a GPU) eager PyTorch, and the extra that installs it where the run's environment
    had no PyTorch."""
    if any(r.get("device") == "cuda" for r in ordered(doc, prec)):
        return "--compare torch,torch-compile+graph adds them"
    if (doc.get("environment") or {}).get("torch"):
        return "--compare torch adds PyTorch eager"
    return "--compare torch adds PyTorch eager, from the torch extra: pip install -e \".[torch]\""


def _compile_cell(r: dict) -> str:
    """Seconds before the first timed call: :func:`end_to_end_tables`' note."""
    secs = r.get("compile_s") if r["kind"] == "opgraph" else r.get("first_call_s")
    if secs is None:
        return "-"
    return f"{secs + (r.get('capture_s') or 0.0):.1f}"


def _layer_cell(row: dict, phases) -> str:
    """``'2.00? / - / 1.10†'``: a layer's milliseconds per phase, marked
    unstable (:data:`UNSTABLE_MARK`), not applicable (:data:`MARK`) or forced
    (:data:`FORCED_MARK`)."""
    cells = []
    unstable = unstable_phases(row)
    for p in phases:
        ms = row["ms"].get(p)
        cell = fmt_ms(ms) if ms is not None else "-"
        if p in unstable:
            cell += UNSTABLE_MARK
        if p in row["not_applicable"]:
            cell += MARK
        if p in row.get("forced", {}):
            cell += FORCED_MARK
        cells.append(cell)
    return " / ".join(cells)


def _layer_rate_cell(row: dict, phases) -> str:
    """:func:`_layer_cell` in TFLOP/s, with the unstable marks only."""
    unstable = unstable_phases(row)
    return " / ".join(fmt_rate(row["tflops"].get(p)) + UNSTABLE_MARK * (p in unstable)
                      if p in row["tflops"] else "-" for p in phases)


def layer_tables(doc: dict, metric: str = "ms") -> Iterable[Table]:
    """Per model and precision: ``fwd / bwd-data / bwd-filter`` per lowering,
    in ms (``metric='ms'``) or TFLOP/s (``metric='tflops'``)."""
    phases = ("forward", "backward_data", "backward_filter")
    for prec in precisions(doc):
        for m in doc["models"]:
            res = [r for r in doc["results"] if r["model"] == m["model"] and precision_label(r) == prec
                   and r["status"] == "ok" and r.get("layers") and any(x["ms"] for x in r["layers"])]
            if not res:
                continue
            names = [x["layer"] for x in res[0]["layers"]]
            headers = ["layer", "op", "GFLOP"] + [r["lowering"] for r in res]
            rows, notes, unstable = [], [], []
            for i, name in enumerate(names):
                first = res[0]["layers"][i]
                row = [name, first["op"], fmt_num(first["flops"] / 1e9, 3)]
                for r in res:
                    x = r["layers"][i]
                    row.append(_layer_cell(x, phases) if metric == "ms" else _layer_rate_cell(x, phases))
                    unstable += [(rel, f"{name} {p} under {r['lowering']} ({rel:.0%})")
                                 for p, rel in unstable_phases(x).items()]
                    for p, why in x["not_applicable"].items():
                        notes.append(f"{MARK} {name} {p} under {r['lowering']}: ran "
                                     f"{x['algorithm'].get(p)}; {r['lowering']}: {why}")
                    for p, algo in x.get("forced", {}).items():
                        notes.append(f"{FORCED_MARK} {name} {p} under {r['lowering']}: forced to {algo} "
                                     "by the policy")
                rows.append(row)
            if any(c == "-" for row in rows for cell in row[3:] for c in cell.split(" / ")):
                notes.append("-: no step of that phase (a layer that reads the image: the training step "
                             "computes no gradient of the image)")
            if any(x.get("fused_relu") for r in res for x in r["layers"]):
                notes.append("a convolution fused with its epilogue by the fuse pass (the forward with "
                             "the activation, and any residual add, it absorbed; backward-data with the "
                             "ReLU gradient) includes it")
            if unstable:  # one line for the table: a loaded machine marks many cells, so the widest few
                worst = [cell for _, cell in sorted(unstable, key=lambda u: -u[0])[:UNSTABLE_LISTED]]
                more = f", and {len(unstable) - len(worst)} more" if len(unstable) > len(worst) else ""
                notes.append(f"{UNSTABLE_MARK} unstable ({len(unstable)} cells): the calls' interquartile range "
                             f"is above {SPREAD_LIMIT:.0%} of the median (benchmarks/stability.py); the widest: "
                             + ", ".join(worst) + more)
            notes += [f"unstable run, every time here included: {why}"
                      for why in (doc.get("stability") or {}).get("reasons", ())]
            unit = "ms" if metric == "ms" else "TFLOP/s"
            caption = (f"{m['model']} per layer, {prec}: forward / backward-data / backward-filter {unit} "
                       f"(median; each layer's steps timed alone)")
            yield Table(caption, headers, rows, set(headers) - {"layer", "op"},
                        list(dict.fromkeys(notes)))


def memory_tables(doc: dict) -> Iterable[Table]:
    headers = ["model", "lowering", "planned", "planned w/o ws", "workspace peak", "workspace sum",
               "live", "measured", "reserved"]
    for prec in precisions(doc):
        rows = []
        for r in ordered(doc, prec):
            if not r.get("memory"):
                continue
            m = r["memory"]
            rows.append([r["model"], r["lowering"], fmt_mib(m.get("planned_peak_bytes")),
                         fmt_mib(m.get("planned_peak_without_workspace_bytes")),
                         fmt_mib(m.get("workspace_peak_bytes")), fmt_mib(m.get("workspace_total_bytes")),
                         fmt_mib(m.get("live_peak_bytes")), fmt_mib(m.get("measured_peak_bytes")),
                         fmt_mib(m.get("reserved_peak_bytes"))])
        if rows:
            yield Table(f"memory, {prec}: MiB (inputs and parameters excluded)", headers, rows,
                        set(headers) - {"model", "lowering"},
                        ["planned: liveness plan + the running node's workspace; live: executor "
                         "buffers during one run; measured: most bytes allocated at once during one "
                         "run (GPU only; PyTorch: torch.cuda.max_memory_allocated); reserved: the "
                         "memory pool's high-water mark, fragmentation and cache included (PyTorch: "
                         "max_memory_reserved)"])


def all_tables(doc: dict, *, per_layer_tflops: bool = False) -> list[Table]:
    """Every table of a benchmark document, in reading order."""
    out = [environment_table(doc), peak_table(doc), *end_to_end_tables(doc), *layer_tables(doc)]
    if per_layer_tflops:
        out += list(layer_tables(doc, "tflops"))
    return out + list(memory_tables(doc))


__all__ = ["Table", "ordered", "precision_label", "fmt_ms", "fmt_num", "fmt_rate", "fmt_mib", "fmt_err", "precisions",
           "layout_label", "environment_table", "peak_table", "end_to_end_tables", "layer_tables", "memory_tables",
           "all_tables", "step_gap", "step_gap_note", "PEER_KINDS", "MARK", "FORCED_MARK", "UNSTABLE_MARK", "forced_note", "spread_cell",
           "run_stability_notes", "AUTOTUNE_NOTE_SECONDS", "autotune_note", "cache_note", "column_cache_note",
           "warning_notes",
           "fusion_note"]
