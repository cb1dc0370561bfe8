"""A ``--dtype float64`` record: labelled as float64 storage, and no fraction of
a peak that is not its ceiling (the measured peaks are fp32 and narrower
products; fresh-user review: a float64 run was scored against the fp32 peak)."""

from __future__ import annotations

from opgraph.benchmarks.records import fill_throughput
from opgraph.benchmarks.tables import precision_label


def _record(dtype):
    return {"dtype": dtype, "precision": "fp32", "notes": [], "flops": {"forward": 2e9, "total": 6e9},
            "times": {"backward_data": None, "backward_filter": None},
            "totals": {"forward_ms": 1.0, "backward_ms": 2.0, "total_ms": 3.0}}


def test_a_float64_record_has_no_peak_fraction_and_says_why():
    rec = _record("float64")
    fill_throughput(rec, {"tflops": 10.0})
    assert rec["peak_fraction"] is None and rec["tflops"]["total"] == 2.0
    assert any("float64" in n for n in rec["notes"])
    fill_throughput(rec, {"tflops": 10.0})  # a +graph record starts from its eager one's notes
    assert sum("float64" in n for n in rec["notes"]) == 1
    rec = _record("float32")
    fill_throughput(rec, {"tflops": 10.0})
    assert rec["peak_fraction"] == 0.2 and not rec["notes"]


def test_float64_storage_is_its_own_table():
    assert precision_label(_record("float32")) == "fp32"
    assert precision_label(_record("float64")) == "fp32, float64 storage"
    assert precision_label({"precision": "bf16", "dtype": "bfloat16"}) == "bf16, bfloat16 storage"
