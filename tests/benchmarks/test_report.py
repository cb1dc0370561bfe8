"""Benchmark documents: schema, JSON round trip, table / CSV / Markdown / plot rendering."""

from __future__ import annotations

import csv
import io
import json

import pytest

from opgraph.benchmarks import driver, lowerings as lw, report, tables
from opgraph.benchmarks.markdown import merge, render_markdown

from tinymodels import tiny_convnet


class FixedTimer:
    """Deterministic clock: every call takes 2 ms (so derived figures are exact)."""

    clock = "fixed 2 ms per call (test)"

    def measure(self, fn, *, label, repeat):
        for _ in range(repeat):
            fn()
        return [2.0] * repeat

    def synchronize(self):
        pass


@pytest.fixture(scope="module")
def doc():
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm,winograd"),
                        precisions=["fp32", "bf16"], warmup=1, repeat=2)
    return driver.run_benchmark([tiny_convnet()], s, timer=FixedTimer(), notes=["a note"])


def test_document_schema(doc):
    assert doc["mode"] == "benchmark" and doc["schema_version"] == driver.SCHEMA_VERSION
    env = doc["environment"]
    for key in ("timestamp", "device", "numpy", "python", "git_commit", "precision", "layout", "dtype",
                "batch", "warmup", "repeat", "lowerings", "torch", "argv"):
        assert key in env, key
    assert env["precision"] == ["fp32", "bf16"] and env["batch"] == {"tiny": 2}
    assert doc["protocol"]["warmup"] == 1 and doc["protocol"]["clock"].startswith("fixed")
    assert set(doc["peak"]) == {"fp32", "bf16"} and doc["peak"]["fp32"]["tflops"] > 0
    assert "fp32 peak" in doc["peak"]["bf16"]["note"]
    assert [(r["precision"], r["lowering"]) for r in doc["results"]] == [
        ("fp32", "gemm"), ("fp32", "winograd"), ("bf16", "gemm"), ("bf16", "winograd")]
    for r in doc["results"]:
        assert set(report.RESULT_KEYS) <= set(r) and set(report.TIMED_KEYS) <= set(r)
        assert r["status"] == "ok" and r["check"]["passed"]
        assert set(r["times"]) == {"forward", "backward_data", "backward_filter"}
        assert r["times"]["forward"]["times_ms"] == [2.0, 2.0]
        # tiny: conv1 reads the image (no backward-data), conv2 and fc have it
        f = doc["models"][0]["layer_flops"]
        assert r["flops"]["forward"] == sum(f.values())
        assert r["flops"]["backward_data"] == f["conv2"] + f["fc"]
        assert r["flops"]["total"] == 2 * sum(f.values()) + f["conv2"] + f["fc"]
        # each phase is one 2 ms call: forward 2, backward 4, total 6 ms
        assert r["totals"] == {"forward_ms": 2.0, "backward_ms": 4.0, "total_ms": 6.0, "total_min_ms": 6.0}
        assert r["tflops"]["total"] == pytest.approx(r["flops"]["total"] / 6e9)
        assert r["peak_fraction"] == pytest.approx(r["tflops"]["total"] / doc["peak"]["fp32"]["tflops"])
        assert [x["layer"] for x in r["layers"]] == ["conv1", "conv2", "fc"]
        m = r["memory"]
        assert m["planned_peak_bytes"] >= m["planned_peak_without_workspace_bytes"] > 0
        assert m["live_peak_bytes"] > 0 and m["measured_peak_bytes"] is None
    wino = doc["results"][1]
    conv1 = wino["layers"][0]
    assert conv1["algorithm"] == {"forward": "gemm", "backward_filter": "gemm"}
    assert "3x3" in conv1["not_applicable"]["forward"]
    assert wino["layers"][1]["algorithm"]["forward"] == "winograd"
    bf16 = doc["results"][2]
    assert any("precision bf16 requested" in n for n in bf16["notes"])


def test_json_round_trip(doc):
    text = report.render_json(doc)
    back = json.loads(text)
    assert back == json.loads(json.dumps(doc))
    assert report.render_json(back) == text
    assert report.render_csv(back) == report.render_csv(doc)
    assert render_markdown(back) == render_markdown(doc)


def test_csv(doc):
    rows = list(csv.DictReader(io.StringIO(report.render_csv(doc))))
    assert list(rows[0]) == list(report.CSV_COLUMNS)
    totals = [r for r in rows if r["layer"] == "(total)"]
    assert len(totals) == 4 and len(rows) == 4 * (1 + 3)
    assert float(totals[0]["total_ms"]) == 6.0 and totals[0]["measured_peak_bytes"] == ""
    conv1 = next(r for r in rows if r["lowering"] == "winograd" and r["layer"] == "conv1")
    assert conv1["algorithm"] == "gemm/-/gemm" and "3x3" in conv1["reason"]
    assert conv1["backward_data_ms"] == ""


def test_tables_plain_and_rich(doc):
    buf = io.StringIO()
    report.write_table(doc, buf, use_rich=False)
    text = buf.getvalue()
    assert text.startswith("# a note")
    assert "end to end, fp32" in text and "end to end, bf16" in text
    assert "tiny per layer, fp32" in text and "2.00 / - / 2.00" in text  # conv1: no backward-data
    assert f"{tables.MARK} conv1 forward under winograd: ran gemm" in text
    rich_buf = io.StringIO()
    report.write_table(doc, rich_buf, use_rich=True)
    assert "end to end, fp32" in rich_buf.getvalue() and "6.00" in rich_buf.getvalue()


def test_markdown(doc):
    md = render_markdown(doc)
    assert "### Environment" in md and "### Matrix-multiply peak" in md
    e2e = md[md.index("### end to end, fp32"):]
    lines = [l for l in e2e.splitlines() if l.startswith("| tiny")]
    assert lines[0].startswith("| tiny | gemm | 2.00 | 2.00 | 2.00 | 4.00 | 6.00 | 6.00 |")
    assert "|---|---|---:|" in e2e
    assert "TFLOP/s (median" in md  # per-layer throughput tables
    merged = merge([doc, doc])  # a re-run of the same columns replaces them
    assert len(merged["results"]) == 4 and len(merged["models"]) == 1 and len(merged["runs"]) == 2
    other = json.loads(json.dumps(doc))
    other["environment"].update(layout="NHWC", timestamp="2026-11-30T00:00:00+00:00", argv=["--layout", "nhwc"])
    md2 = render_markdown(merge([doc, other]))
    assert "### Runs merged" in md2 and "| 2026-11-30T00:00:00+00:00 |" in md2 and "`--layout nhwc`" in md2
    assert merge([doc, other])["environment"]["layout"].endswith("NHWC")
    assert "Runs merged" not in md  # a single run has no such table
    failed = json.loads(json.dumps(doc))
    for r in failed["results"]:
        r["status"] = "error"
    kept = merge([doc, failed])["results"]  # ... unless the re-run failed
    assert [r["status"] for r in kept] == [r["status"] for r in doc["results"]]
    assert [r["status"] for r in merge([failed, doc])["results"]] == [r["status"] for r in doc["results"]]
    graph = json.loads(json.dumps(doc))  # a +graph column is listed right after its eager column
    graph["results"] = [dict(graph["results"][0], lowering=graph["results"][0]["lowering"] + "+graph")]
    rows = [r["lowering"] for r in tables.ordered(merge([doc, graph]), doc["results"][0]["precision"])]
    base = doc["results"][0]["lowering"]
    assert rows[rows.index(base) + 1] == base + "+graph"
    with pytest.raises(ValueError, match="timing runs"):
        render_markdown({"mode": "summary"})


def test_untimed_results_render_with_their_reason(doc):
    d = json.loads(json.dumps(doc))
    d["results"].append({**{k: d["results"][0][k] for k in report.RESULT_KEYS},
                         "lowering": "fft", "status": "mismatch", "reason": "conv2: 1e-2 > 1e-3"})
    buf = io.StringIO()
    report.write_table(d, buf, use_rich=False)
    assert "mismatch [1]" in buf.getvalue() and "tiny / fft: mismatch: conv2: 1e-2 > 1e-3" in buf.getvalue()
    rows = list(csv.DictReader(io.StringIO(report.render_csv(d))))
    assert rows[-1]["status"] == "mismatch" and rows[-1]["total_ms"] == ""


def test_plot(doc, tmp_path):
    pytest.importorskip("matplotlib")
    from opgraph.benchmarks.plot import plot

    path = plot(doc, str(tmp_path / "bench.png"))
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_layout_records_what_ran_and_what_was_asked(doc):
    assert driver.Settings(device="cuda", lowerings=(), layout="NHWC").applied_layout == "NHWC"
    assert driver.Settings(device="cpu", lowerings=(), layout="NHWC").applied_layout == "NCHW"
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm"), layout="NHWC",
                        warmup=0, repeat=1, per_layer=False, check=False)
    nhwc = driver.run_benchmark([tiny_convnet()], s, timer=FixedTimer())
    assert (nhwc["environment"]["layout"], nhwc["environment"]["layout_requested"]) == ("NCHW", "NHWC")
    (r,) = nhwc["results"]
    assert (r["layout"], r["layout_requested"]) == ("NCHW", "NHWC")
    assert "| layout | NCHW (NHWC requested) |" in render_markdown(nhwc)
    # both ran NCHW: merging keys on the layout applied, so the later gemm fp32 replaces the earlier
    merged = merge([doc, nhwc])
    assert [(x["precision"], x["lowering"]) for x in merged["results"]] == [
        ("fp32", "winograd"), ("bf16", "gemm"), ("bf16", "winograd"), ("fp32", "gemm")]
    assert merged["results"][-1] is r
    assert merged["environment"]["layout"] == "NCHW"
    assert [run["layout"] for run in merged["runs"]] == ["NCHW", "NCHW (NHWC requested)"]


def test_plot_legend_lists_only_the_kinds_present_and_keeps_its_width(doc, tmp_path):
    pytest.importorskip("matplotlib")
    import struct

    import matplotlib.pyplot as plt

    from opgraph.benchmarks.plot import DPI, MIN_WIDTH, figure, plot

    def labels(d):
        fig = figure(d)
        fig.canvas.draw()
        box = fig.bbox  # the title and legend lie inside the figure: nothing clipped
        for artist in (fig._suptitle, *fig.legends):
            ext = artist.get_window_extent()
            assert box.x0 <= ext.x0 and ext.x1 <= box.x1 and box.y0 <= ext.y0 and ext.y1 <= box.y1
        out = [t.get_text() for t in fig.legends[0].get_texts()]
        plt.close(fig)
        return out

    assert labels(doc) == ["forward", "backward"]  # no --compare: no PyTorch entries
    peer = json.loads(json.dumps(doc))
    peer["results"].append({**peer["results"][0], "lowering": "torch", "kind": "torch"})
    assert labels(peer) == ["forward", "backward", "PyTorch forward", "PyTorch backward"]
    data = open(plot(doc, str(tmp_path / "one.png")), "rb").read()
    width, height = struct.unpack(">II", data[16:24])  # the PNG header's size in pixels
    assert width == round(MIN_WIDTH * DPI) and height == round(2 * 3.4 * DPI)  # one model, two precisions


def test_a_bfloat16_storage_run_keeps_its_own_rows_and_tables(doc):
    # --dtype bfloat16 --precision bf16 and a float32-storage --precision bf16 run of the
    # same columns: merged, neither replaces the other, and each has its own table
    storage = json.loads(json.dumps(doc))
    for r in storage["results"]:
        r["dtype"] = "bfloat16"
    merged = merge([doc, storage])
    assert len(merged["results"]) == 2 * len(doc["results"])
    labels = tables.precisions(merged)
    assert "bf16" in labels and "bf16, bfloat16 storage" in labels
    md = render_markdown(merged)
    assert "### end to end, bf16, bfloat16 storage" in md and "### end to end, bf16:" in md
    assert all(r["dtype"] == "bfloat16" for r in tables.ordered(merged, "bf16, bfloat16 storage"))


class _Terminal(io.StringIO):
    """A stream that says it is a terminal (its width comes from ``COLUMNS``)."""

    def isatty(self):
        return True


def _wide_table(columns: int) -> tables.Table:
    """A table about ``columns`` characters wide, with a caption and a note of 300."""
    return tables.Table("caption " + "c" * 292, ["a", "b"], [["x" * (columns - 20), "1"]],
                        notes=["note " + " ".join(["word"] * 59)])


@pytest.mark.parametrize("columns", [40, 200])
def test_notes_are_not_cut_at_the_tables_width_in_a_file(columns):
    """Fresh-user report: notes were hard-wrapped at the table's width. In a
    file or pipe each note and caption is one line, whatever the table's width."""
    pytest.importorskip("rich")
    buf = io.StringIO()
    report.write_tables([_wide_table(columns)], buf, use_rich=True)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "caption " + "c" * 292
    assert lines[-1] == "  note " + " ".join(["word"] * 59)


def test_notes_wrap_at_the_terminals_width_not_the_wider_tables(monkeypatch):
    pytest.importorskip("rich")
    import re

    monkeypatch.setenv("COLUMNS", "80")
    term = _Terminal()
    report.write_tables([_wide_table(200)], term, use_rich=True)
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in term.getvalue().splitlines()]
    note = lines[lines.index(next(line for line in lines if line.startswith("  note "))):]
    assert len(note) > 1 and all(len(line) <= 80 for line in note), note
    assert " ".join(" ".join(note).split()) == "note " + " ".join(["word"] * 59)
    assert any(len(line) > 150 for line in lines)  # the table keeps its width: it is not folded


def test_an_unknown_format_lists_the_formats_as_text():
    with pytest.raises(ValueError) as e:
        report.write({"mode": "benchmark"}, "xml", io.StringIO())
    assert str(e.value) == "format 'xml': must be one of table, json, csv, markdown"


def _end_to_end_notes(d: dict) -> list[str]:
    return [n for t in tables.end_to_end_tables(d) for n in t.notes]


def test_a_total_and_step_that_disagree_get_a_note_saying_why(doc):
    """Fresh-user report: on a loaded CPU 'total' and 'step' disagreed and no note said why. The
    fixed timer's phases take 2 ms each (total 6) and so does the whole step (2), spreads 0."""
    d = json.loads(json.dumps(doc))
    (note,) = [n for n in _end_to_end_notes(d) if n.startswith("total vs step: ")][:1]
    assert "tiny / gemm: total 6.00, step 2.00 ±0.000" in note and "tiny / winograd" in note
    assert "differ by more than their spreads" in note and "each timed in a loop of its own" in note
    assert "the whole step as one loop" in note


@pytest.mark.parametrize("change", ["agree", "wide", "one call"])
def test_a_total_and_step_within_their_spreads_or_of_one_call_get_no_note(doc, change):
    d = json.loads(json.dumps(doc))
    for r in d["results"]:
        if r["status"] != "ok":
            continue
        step = r["step"]
        if change == "agree":
            step["median_ms"] = r["totals"]["total_ms"] + 0.0
        elif change == "wide":  # 4 ms apart, a step IQR of 5 ms
            step["iqr_ms"] = 5.0
        else:
            step["times_ms"] = step["times_ms"][:1]
    assert not any(n.startswith("total vs step") for n in _end_to_end_notes(d))
