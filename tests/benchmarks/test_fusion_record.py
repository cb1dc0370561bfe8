"""opgraph-bench says which fusion rules fired: each opgraph column's record
carries ``LoweringReport.fusion`` (rule -> rewrites made), the end-to-end
table a line per column that fused something, and a ``--profile`` record the
same field."""

from __future__ import annotations

import io

import attrs
import pytest

from opgraph.benchmarks import driver, lowerings as lw, report, tables
from opgraph.passes.fuse import TABLE
from opgraph.passes.policy import LoweringPolicy

from tinymodels import tiny_convnet

NO_CACHE = LoweringPolicy(cache="off")


@pytest.fixture(scope="module")
def doc():
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm,auto"), warmup=0, repeat=1,
                        per_layer=False, base_policy=NO_CACHE)
    return driver.run_benchmark([tiny_convnet()], s)


@pytest.mark.parametrize("lowering", ["gemm", "auto"])
def test_every_column_records_each_rule_of_the_table(doc, lowering):
    (rec,) = [r for r in doc["results"] if r["lowering"] == lowering]
    assert rec["status"] == "ok"
    assert list(rec["fusion"]) == [r.name for r in TABLE]
    # every rule ran; on the CPU's oracle some wait for include=['fused-reference'] and say so
    assert all({"applied", "declined"} <= set(v) <= {"applied", "declined", "opt_in"} for v in rec["fusion"].values())
    assert {k for k, v in rec["fusion"].items() if v.get("opt_in")} >= {"pool-argmax", "relu-bias-sums"}


def test_the_table_has_a_line_for_a_column_that_fused():
    rec = {"model": "resnet50", "lowering": "auto",
           "fusion": {"conv-epilogue": {"applied": 16, "declined": 0},
                      "dgrad-relu": {"applied": 0, "declined": 3},
                      "elementwise": {"applied": 120, "declined": 2},
                      "bn-gradient-remat": {"excluded": True}}}
    assert tables.fusion_note(rec) == ("resnet50 / auto: fusion rules: conv-epilogue 16, dgrad-relu 0 "
                                       "(3 declined), elementwise 120 (2 declined); excluded: bn-gradient-remat")
    assert tables.fusion_note({**rec, "lowering": "auto+graph"}) is None  # its eager column says it
    nothing = {k: {"applied": 0, "declined": 0} for k in rec["fusion"]}
    assert tables.fusion_note({**rec, "fusion": nothing}) is None
    assert tables.fusion_note({**rec, "fusion": None}) is None


def test_the_end_to_end_table_carries_the_line(doc):
    (table,) = tables.end_to_end_tables(doc)
    for rec in doc["results"]:
        line = tables.fusion_note(rec)
        assert (line in table.notes) if line else not any(n.startswith(f"tiny / {rec['lowering']}: fusion")
                                                           for n in table.notes)


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_the_printed_table_names_the_rules_waiting_for_the_opt_in(doc, fmt):
    """On the CPU's oracles some rules wait for ``include=['fused-reference']``: the JSON record
    says ``'opt_in': True`` (``opgraph-bench compare`` too), but the printed table had no line
    for them (a column where only they were left had none at all). Its fusion line now lists
    them, in the JSON's word, after the rules that rewrote something."""
    out = io.StringIO()
    report.write(doc, fmt, out)
    printed = " ".join(out.getvalue().split())
    for rec in doc["results"]:
        waiting = [k for k, v in rec["fusion"].items() if v.get("opt_in")]
        assert waiting, rec["fusion"]  # pool-argmax and relu-bias-sums at least (above)
        line = tables.fusion_note(rec)
        assert line is not None and f"opt_in: {', '.join(waiting)}" in line
        assert line.startswith(f"tiny / {rec['lowering']}: fusion rules: ")
        assert " ".join(line.split()) in printed
    alone = {"model": "L5", "lowering": "gemm", "fusion": {"conv-epilogue": {"applied": 0, "declined": 0},
                                                          "elementwise": {"applied": 0, "declined": 0, "opt_in": True}}}
    assert tables.fusion_note(alone) == "L5 / gemm: fusion rules: opt_in: elementwise"


def test_the_peer_hint_is_one_that_runs_on_the_runs_device(doc):
    """A CPU run's note points at the peer that runs there (eager PyTorch, from its extra), not at
    the CUDA-graph peers, which refuse a CPU run; a GPU run's at the strongest peers. The extra is
    named only where the run's environment had no PyTorch (fresh-user report)."""
    bare = {**doc, "environment": {**doc.get("environment", {}), "torch": None}}
    (table,) = tables.end_to_end_tables(bare)
    (hint,) = [n for n in table.notes if n.startswith("vs torch:")]
    assert hint.endswith('-: no peer in this run, --compare torch adds PyTorch eager, from the torch extra: '
                         'pip install -e ".[torch]")')
    with_torch = {**doc, "environment": {**doc.get("environment", {}), "torch": "2.11.0"}}
    (table,) = tables.end_to_end_tables(with_torch)
    (hint,) = [n for n in table.notes if n.startswith("vs torch:")]
    assert hint.endswith("-: no peer in this run, --compare torch adds PyTorch eager)")
    gpu = {**doc, "results": [{**r, "device": "cuda"} for r in doc["results"]]}
    (table,) = tables.end_to_end_tables(gpu)
    (hint,) = [n for n in table.notes if n.startswith("vs torch:")]
    assert hint.endswith("-: no peer in this run, --compare torch,torch-compile+graph adds them)")
    assert any(n.startswith("TFLOP/s: the step's FLOPs over its total time") for n in table.notes)


def test_a_column_whose_policy_excludes_the_slot_rules_records_them_excluded():
    """``--lowering gemm,exclude=pool-scan+relu-bias-sums``: the two rules that run by default
    since 2026-12-05 are off in that column, and its record says so; the others ran."""
    base = LoweringPolicy.from_cli(lowering="exclude=pool-scan+relu-bias-sums")  # the flag's policy items
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm"), warmup=0, repeat=1, per_layer=False,
                        base_policy=attrs.evolve(base, cache="off"))
    (rec,) = driver.run_benchmark([tiny_convnet()], s)["results"]
    assert rec["status"] == "ok"
    assert rec["fusion"]["pool-scan"] == rec["fusion"]["relu-bias-sums"] == {"excluded": True}
    assert all({"applied", "declined"} <= set(v) <= {"applied", "declined", "opt_in"} for k, v in rec["fusion"].items()
               if k not in ("pool-scan", "relu-bias-sums"))


def test_a_table_with_an_opt_in_line_says_what_opt_in_means(doc):
    """The fresh user found 'opt_in: elementwise' cryptic: a table that shows one says, once, what it means."""
    (table,) = tables.end_to_end_tables(doc)
    assert table.notes.count(tables.OPT_IN_NOTE) == 1  # both columns have opt_in rules on the CPU
    applied = {k: {"applied": 1, "declined": 0} for k in doc["results"][0]["fusion"]}
    fused = {**doc, "results": [{**r, "fusion": applied} for r in doc["results"]]}
    (table,) = tables.end_to_end_tables(fused)
    assert tables.OPT_IN_NOTE not in table.notes
