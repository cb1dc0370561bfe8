"""opgraph-bench says which fusion rules fired: each opgraph column's record
carries ``LoweringReport.fusion`` (rule -> rewrites made), the end-to-end
table a line per column that fused something, and a ``--profile`` record the
same field."""

from __future__ import annotations

import attrs
import pytest

from opgraph.benchmarks import driver, lowerings as lw, tables
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
    opt_in = {r.name for r in TABLE if r.opt_in}  # not included by the column's policy: they did not run
    assert all(v == {"opt_in": True} if k in opt_in else set(v) == {"applied", "declined"}
               for k, v in rec["fusion"].items())


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


def test_the_peer_hint_is_one_that_runs_on_the_runs_device(doc):
    """A CPU run's note points at the peer that runs there (eager PyTorch, from its extra), not at
    the CUDA-graph peers, which refuse a CPU run; a GPU run's at the strongest peers."""
    (table,) = tables.end_to_end_tables(doc)
    (hint,) = [n for n in table.notes if n.startswith("vs torch:")]
    assert hint.endswith('-: no peer in this run, --compare torch adds PyTorch eager, from the torch extra: '
                         'pip install -e ".[torch]")')
    gpu = {**doc, "results": [{**r, "device": "cuda"} for r in doc["results"]]}
    (table,) = tables.end_to_end_tables(gpu)
    (hint,) = [n for n in table.notes if n.startswith("vs torch:")]
    assert hint.endswith("-: no peer in this run, --compare torch,torch-compile+graph adds them)")
    assert any(n.startswith("TFLOP/s: the step's FLOPs over its total time") for n in table.notes)


def test_an_included_opt_in_rule_that_rewrote_nothing_is_said_in_the_column_notes():
    """``--lowering gemm,include=pool-scan`` on the CPU: the compile's note that the
    rule rewrote nothing (pool-argmax waits for fused-reference there) reaches the
    column's record, as the other compile notes a record repeats do."""
    base = LoweringPolicy.from_cli(lowering="include=pool-scan")  # the flag's policy items (benchmarks/modes.py)
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm"), warmup=0, repeat=1, per_layer=False,
                        base_policy=attrs.evolve(base, cache="off"))
    (rec,) = driver.run_benchmark([tiny_convnet()], s)["results"]
    assert rec["status"] == "ok" and rec["fusion"]["pool-scan"] == {"applied": 0, "declined": 0}
    assert any(n.startswith("fuse: pool-scan: included, but no saved-winners max pooling")
               and "include=['fused-reference']" in n for n in rec["notes"]), rec["notes"]


def test_the_record_finds_the_idle_opt_in_note_by_the_text_its_writer_uses():
    """``benchmarks/lowerings.py`` picks the note of an included opt-in rule that rewrote nothing
    by ``passes/fuse.py``'s own ``IDLE_OPT_IN`` (the text ``idle_opt_in`` writes), not a copy of
    it that a rewording there would leave behind."""
    from opgraph.passes import fuse

    assert fuse.IDLE_OPT_IN in lw._REPEATED_NOTES
    assert any(fuse.IDLE_OPT_IN in n for n in _idle_note_run())


def _idle_note_run() -> list[str]:
    """The compile notes of ``include=pool-scan`` alone on the CPU (no pool-argmax there)."""
    import opgraph as og
    from opgraph.benchmarks.protocol import training_graph

    tg = training_graph(tiny_convnet())
    policy = attrs.evolve(LoweringPolicy.from_cli(lowering="include=pool-scan"), cache="off")
    return og.compile(tg.outputs, device="cpu", policy=policy).report.notes
