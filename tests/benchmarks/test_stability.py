"""Spread, unstable columns and runs, and ``--repeat auto`` (benchmarks/stability.py,
timer.AdaptiveTimer): the figures against NumPy's percentiles, the flags on
documents made with clocks whose spread is known."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opgraph.benchmarks import cli, driver, lowerings as lw, report, stability, tables
from opgraph.benchmarks.timer import AdaptiveTimer, Timing

from tinymodels import tiny_convnet


@pytest.mark.parametrize("times", [[3.0, 1.0, 2.0], [1.0, 2.0], [5.0, 1.0, 9.0, 2.0, 2.5, 7.0]])
def test_spread_is_numpys_linear_interquartile_range(times):
    sp = stability.spread(times)
    q1, med, q3 = np.percentile(times, [25, 50, 75])  # linear interpolation, as 'inclusive'
    assert sp["q1_ms"] == pytest.approx(q1) and sp["q3_ms"] == pytest.approx(q3)
    assert sp["iqr_ms"] == pytest.approx(q3 - q1) and sp["relative"] == pytest.approx((q3 - q1) / med)
    assert sp["max_ms"] == max(times)
    assert Timing(times).as_dict()["iqr_ms"] == pytest.approx(q3 - q1)


def test_a_single_call_has_no_spread():
    assert stability.spread([4.0])["relative"] is None
    assert stability.total_spread({"forward": {"times_ms": [4.0]}}) is None


def test_a_columns_spread_adds_its_phases_iqrs():
    times = {"forward": {"times_ms": [1.0, 2.0, 3.0]}, "backward_data": None,
             "backward_filter": {"times_ms": [10.0, 10.0, 14.0]}}
    got = stability.total_spread(times)
    assert got["iqr_ms"] == pytest.approx(1.0 + 2.0) and got["relative"] == pytest.approx(3.0 / 12.0)


class ScriptedTimer:
    """Each call of a loop takes the next time of ``script`` (cycled)."""

    clock = "scripted (test)"

    def __init__(self, script):
        self.script, self.i, self.rounds = list(script), 0, 0

    def measure(self, fn, *, label, repeat):
        self.rounds += 1
        out = []
        for _ in range(repeat):
            fn()
            out.append(self.script[self.i % len(self.script)])
            self.i += 1
        return out

    def synchronize(self):
        pass


def test_auto_stops_once_the_iqr_is_within_the_threshold():
    # a noisy round, then steady calls: the IQR of all calls falls to 0 after 3 rounds
    t = ScriptedTimer([1.0, 5.0, 1.0, 5.0, 1.0] + [2.0] * 100)
    times = AdaptiveTimer(t, threshold=0.05).measure(lambda: None, label="x", repeat=5)
    rel = stability.spread(times)["relative"]
    assert rel <= 0.05 and stability.spread(times[:-5])["relative"] > 0.05  # not one round earlier
    assert len(times) == 5 * t.rounds and t.rounds >= 2


def test_auto_stops_at_its_caps():
    noisy = ScriptedTimer([1.0, 3.0])
    times = AdaptiveTimer(noisy, max_calls=20).measure(lambda: None, label="x", repeat=5)
    assert len(times) == 20
    slow = ScriptedTimer([1.0, 3.0])
    times = AdaptiveTimer(slow, max_seconds=0.0).measure(lambda: None, label="x", repeat=5)
    assert len(times) == 5  # the wall-clock cap ends it after the first round


def _doc(timer, **kw):
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm"), warmup=0, repeat=4, **kw)
    return driver.run_benchmark([tiny_convnet()], s, timer=timer)


QUIET_PEAK = {"fp32": {"tflops": 1.0, "method": "test"}}


def test_a_noisy_column_is_flagged_in_json_and_table(monkeypatch):
    monkeypatch.setattr(driver, "measure_peaks", lambda device, precisions: QUIET_PEAK)
    monkeypatch.setattr(stability, "expected_peak", lambda *a: (1.0, "test"))
    quiet = _doc(ScriptedTimer([2.0]))
    (r,) = quiet["results"]
    assert r["stability"] == {"spread": 0.0, "iqr_ms": 0.0, "unstable": False, "reasons": []}
    assert not quiet["stability"]["unstable"]
    noisy = _doc(ScriptedTimer([1.0, 1.0, 4.0, 4.0]))  # each loop: IQR 3 of a median 2.5
    (r,) = noisy["results"]
    assert r["stability"]["unstable"] and r["stability"]["spread"] == pytest.approx(3 * 3 / (3 * 2.5))
    assert "exceeds 10%" in r["stability"]["reasons"][0]
    (table,) = tables.end_to_end_tables(noisy)
    row = table.rows[0]
    assert row[table.headers.index("spread")] == "±120% unstable"
    assert any(n.startswith("unstable: tiny / gemm: spread 120.0%") for n in table.notes)
    assert json.loads(report.render_json(noisy))["results"][0]["stability"]["unstable"] is True


def test_a_run_whose_peak_is_far_below_the_device_is_flagged(monkeypatch):
    monkeypatch.setattr(driver, "measure_peaks", lambda device, precisions: {
        "fp32": {"tflops": 0.02, "method": "test"}})
    monkeypatch.setattr(stability, "_cpuinfo", lambda: {"cpu MHz": "2500.0", "flags": "sse avx2 fma",
                                                        "siblings": "4", "cpu cores": "2"})
    monkeypatch.setattr(stability.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    doc = _doc(ScriptedTimer([2.0]))
    # 4 CPUs, 2 threads per core: 2 cores x 2.5 GHz x 32 FLOP/cycle = 0.16 TFLOP/s; 0.02 is 12 %
    assert doc["stability"]["expected_peak"]["fp32"]["tflops"] == pytest.approx(0.16)
    assert doc["stability"]["unstable"] and "12% of the reference 0.16" in doc["stability"]["reasons"][0]
    (r,) = doc["results"]
    assert r["stability"]["unstable"] and r["stability"]["reasons"][0].startswith("run: the measured")
    peak = tables.peak_table(doc)
    assert peak.rows[0][peak.headers.index("reference")] == "0.16"
    assert any(n.startswith("unstable run: the measured fp32 matmul peak") for n in peak.notes)
    (table,) = tables.end_to_end_tables(doc)
    assert table.rows[0][table.headers.index("spread")] == "±0% unstable"


def test_the_cpu_reference_is_a_nominal_rate_an_avx512_core_exceeds(monkeypatch):
    """On an AVX-512 EPYC the measured sgemm peak (0.217 TFLOP/s on 2 cores)
    was above the AVX2 figure (2 x 2.6 GHz x 32 = 0.166) printed as
    "expected": it is a nominal rate, not what the device should reach, and
    the table and the JSON say so; such a run is not flagged."""
    monkeypatch.setattr(driver, "measure_peaks", lambda device, precisions: {
        "fp32": {"tflops": 0.217, "method": "test"}})
    monkeypatch.setattr(stability, "_cpuinfo", lambda: {"cpu MHz": "2600.0", "flags": "sse avx2 fma avx512f"})
    monkeypatch.setattr(stability.os, "sched_getaffinity", lambda pid: {0, 1})
    doc = _doc(ScriptedTimer([2.0]))
    ref = doc["stability"]["expected_peak"]["fp32"]
    assert ref["tflops"] == pytest.approx(0.1664) and not doc["stability"]["unstable"]
    assert ref["how"] == ("nominal: 2 usable CPUs x 2.60 GHz (/proc/cpuinfo) x 32 fp32 FLOP/cycle (AVX2 FMA); "
                          "not a ceiling: this CPU's AVX-512 (up to 64 FLOP/cycle) and a turbo clock go above it")
    peak = tables.peak_table(doc)
    assert "expected" not in peak.headers
    row = peak.rows[0]
    assert (row[peak.headers.index("TFLOP/s")], row[peak.headers.index("reference")]) == ("0.217", "0.166")
    assert f"reference fp32: {ref['how']}" in peak.notes
    monkeypatch.setattr(stability, "_cpuinfo", lambda: {"cpu MHz": "2600.0", "flags": "sse avx2 fma"})
    assert stability.expected_peak("cpu", None, "fp32")[1].endswith("not a ceiling: a turbo clock goes above it")


@pytest.mark.parametrize("name, precision, want", [
    ("NVIDIA H200", "bf16", 779.0), ("NVIDIA H100 80GB HBM3", "tf32", 408.0),
    ("NVIDIA H100 80GB HBM3", "fp32", None),  # not measured there: no basis
    ("NVIDIA H100 PCIe", "bf16", None),       # the PCIe card's lower clocks: not the SXM figure
    ("NVIDIA A100-SXM4-80GB", "bf16", None)])
def test_a_gpu_is_held_against_its_own_model_s_quiet_peak(name, precision, want):
    got = stability.expected_peak("cuda", name, precision)
    assert (got and got[0]) == want


@pytest.mark.parametrize("name, source", [("NVIDIA H200", "(GPU_NOTES)"),
                                          ("NVIDIA H100 80GB HBM3", "(docs/results/h100-2026-12-06)")])
def test_a_gpu_peak_names_where_it_was_measured(name, source):
    assert stability.expected_peak("cuda", name, "bf16")[1].endswith("bf16 quiet measurement " + source)


def test_a_peak_that_moves_during_a_long_run_flags_it(monkeypatch):
    peaks = iter([{"fp32": {"tflops": 1.0}}, {"fp32": {"tflops": 0.5}}])
    monkeypatch.setattr(driver, "measure_peaks", lambda device, precisions: next(peaks))
    monkeypatch.setattr(stability, "expected_peak", lambda *a: None)
    monkeypatch.setattr(stability, "DRIFT_MIN_SECONDS", 0.0)
    doc = _doc(ScriptedTimer([2.0]))
    assert doc["peak_after"]["fp32"]["tflops"] == 0.5
    assert doc["stability"]["reasons"] == ["the fp32 matmul peak moved from 1 to 0.5 TFLOP/s during the run: "
                                           "the machine's load changed"]
    assert doc["results"][0]["stability"]["unstable"]


def test_repeat_auto_on_the_command_line(capsys, tmp_path):
    path = tmp_path / "run.json"
    status = cli.main(["--model", "L4", "--batch", "1", "--device", "cpu", "--lowering", "direct",
                       "--warmup", "0", "--repeat", "auto", "--no-check", "--no-per-layer", "--quiet",
                       "--format", "json", "--output", str(path)])
    assert status == 0, capsys.readouterr().err
    doc = json.loads(path.read_text())
    assert doc["protocol"]["repeat"] == "auto" and "--repeat auto: rounds of" in doc["protocol"]["clock"]
    assert doc["environment"]["repeat"] == "auto"
    (r,) = doc["results"]
    for t in r["times"].values():
        n = len(t["times_ms"])
        assert n % 5 == 0 and n >= 5
        rel = stability.spread(t["times_ms"])["relative"]
        assert rel <= 0.05 or n >= 1000 or sum(t["times_ms"]) >= 5e3 * 0.5  # stable, or a cap ended it


class LabelTimer:
    """Every call takes 2 ms, except in the loops whose label is in ``noisy``
    (label -> the times of its calls, cycled): a layer preempted by the scheduler."""

    clock = "by label (test)"

    def __init__(self, noisy):
        self.noisy, self.labels = noisy, []

    def measure(self, fn, *, label, repeat):
        self.labels.append(label)
        fn()
        script = self.noisy.get(label, [2.0])
        return [script[i % len(script)] for i in range(repeat)]

    def synchronize(self):
        pass


def test_a_layer_whose_loop_spreads_wide_is_marked_unstable_in_the_per_layer_table(monkeypatch):
    """Fresh-user report: per-layer CPU times on a loaded machine (one call
    descheduled for a scheduler tick) carried no mark, while a column's total
    did ('±120% unstable'). A layer's loop whose spread exceeds 10 % of its
    median gets the mark, in ms and TFLOP/s, and one note lists them."""
    monkeypatch.setattr(driver, "measure_peaks", lambda device, precisions: QUIET_PEAK)
    monkeypatch.setattr(stability, "expected_peak", lambda *a: (1.0, "test"))
    quiet = _doc(LabelTimer({}))
    (table,) = tables.layer_tables(quiet)
    assert not any(tables.UNSTABLE_MARK in cell for row in table.rows for cell in row)
    assert not any("unstable" in n for n in table.notes)
    layer = quiet["results"][0]["layers"][0]["layer"]
    noisy = _doc(LabelTimer({f"{layer}/forward": [0.4, 0.4, 4.4, 4.4]}))  # IQR 4 of a median 2.4
    (row,) = [x for x in noisy["results"][0]["layers"] if x["layer"] == layer]
    assert stability.unstable_phases(row) == {"forward": pytest.approx(4.0 / 2.4)}
    (table,) = tables.layer_tables(noisy)
    (cells,) = [r for r in table.rows if r[0] == layer]
    assert cells[table.headers.index("gemm")].startswith(f"2.40{tables.UNSTABLE_MARK} / ")
    others = [c for r in table.rows if r[0] != layer for c in r]
    assert not any(tables.UNSTABLE_MARK in c for c in others)
    (note,) = [n for n in table.notes if n.startswith(f"{tables.UNSTABLE_MARK} unstable")]
    assert note.endswith(f": {layer} forward under gemm (167%)") and "above 10% of the median" in note
    (rates,) = tables.layer_tables(noisy, "tflops")
    (cells,) = [r for r in rates.rows if r[0] == layer]
    assert cells[rates.headers.index("gemm")].split(" / ")[0].endswith(tables.UNSTABLE_MARK)


def test_a_table_of_many_unstable_cells_names_the_widest_few(monkeypatch):
    """Fresh-user report: on a loaded machine the note under GoogLeNet's per-layer
    table listed every marked cell, one 6 KB line."""
    monkeypatch.setattr(driver, "measure_peaks", lambda device, precisions: QUIET_PEAK)
    monkeypatch.setattr(stability, "expected_peak", lambda *a: (1.0, "test"))
    monkeypatch.setattr(tables, "UNSTABLE_LISTED", 1)
    layers = [x["layer"] for x in _doc(LabelTimer({}))["results"][0]["layers"]]
    assert len(layers) >= 2
    noisy = {f"{layers[0]}/forward": [0.4, 0.4, 4.4, 4.4],                    # 167 %
             **{f"{name}/forward": [2.0, 2.0, 2.6, 2.6] for name in layers[1:]}}  # 26 %
    (table,) = tables.layer_tables(_doc(LabelTimer(noisy)))
    (note,) = [n for n in table.notes if n.startswith(f"{tables.UNSTABLE_MARK} unstable")]
    assert f"unstable ({len(layers)} cells)" in note
    assert note.endswith(f"the widest: {layers[0]} forward under gemm (167%), and {len(layers) - 1} more")


def test_an_unstable_run_is_said_under_each_per_layer_table(monkeypatch):
    monkeypatch.setattr(driver, "measure_peaks", lambda device, precisions: QUIET_PEAK)
    monkeypatch.setattr(stability, "expected_peak", lambda *a: (10.0, "test"))  # 1 of 10: loaded
    doc = _doc(LabelTimer({}))
    (table,) = tables.layer_tables(doc)
    (note,) = [n for n in table.notes if "unstable run" in n]
    assert note.startswith("unstable run, every time here included: the measured fp32 matmul peak")


def test_a_phase_without_a_step_is_explained_under_the_per_layer_table(monkeypatch):
    """Fresh-user report: 'conv1 │ 20.1 / - / 21.4' had no legend (the image's gradient is not computed)."""
    monkeypatch.setattr(driver, "measure_peaks", lambda device, precisions: QUIET_PEAK)
    monkeypatch.setattr(stability, "expected_peak", lambda *a: (1.0, "test"))
    (table,) = tables.layer_tables(_doc(LabelTimer({})))
    dashes = [c for r in table.rows for c in r[3:] if "-" in c.split(" / ")]
    assert dashes  # the first convolution reads the image
    assert any(n.startswith("-: no step of that phase") for n in table.notes)


@pytest.mark.parametrize("spread, cell", [(0.102, "±10.2% unstable"), (0.14, "±14% unstable"),
                                          (0.04, "±4%")])
def test_a_flagged_spread_never_reads_as_the_limit_itself(spread, cell):
    """Fresh-user report: a spread of 10.2 %, flagged for exceeding 10 %, read '±10% unstable'."""
    r = {"model": "m", "lowering": "x", "stability": {"spread": spread, "unstable": spread > 0.1, "reasons": []}}
    assert tables.spread_cell(r, []) == cell
