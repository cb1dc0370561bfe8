"""opgraph-bench carries where autotune's time went (passes/autotune_clock.py):
in each opgraph column's record, in the end-to-end table's notes when it took
long, and in a ``--profile`` model record."""

from __future__ import annotations

import pytest

from opgraph.benchmarks import driver, lowerings as lw, profile as pf, profile_table, tables
from opgraph.benchmarks.protocol import random_feeds, training_graph
from opgraph.benchmarks.timer import make_timer
from opgraph.passes.autotune_clock import PARTS, describe
from opgraph.passes.policy import LoweringPolicy

from tinymodels import tiny_convnet

NO_CACHE = LoweringPolicy(cache="off")  # every column tunes afresh, and no file is written


@pytest.fixture(scope="module")
def doc():
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm,auto"), warmup=0, repeat=1,
                        per_layer=False, base_policy=NO_CACHE)
    return driver.run_benchmark([tiny_convnet()], s)


def _column(doc, lowering):
    (rec,) = [r for r in doc["results"] if r["lowering"] == lowering]
    return rec


def test_the_auto_column_records_its_autotune_summary(doc):
    rec = _column(doc, "auto")
    assert rec["status"] == "ok"
    summary = rec["autotune"]
    assert set(summary["seconds"]) == set(PARTS)
    assert summary["nodes_tuned"] > 0 and summary["candidates_timed"] > 0
    assert summary["candidates_checked"] >= summary["candidates_timed"]
    # the pass's own wall time, within the compile's
    assert sum(summary["seconds"].values()) <= summary["total_s"] <= rec["compile_s"]
    assert summary["seconds"]["timing"] > 0 and summary["seconds"]["check"] > 0


def test_a_column_without_autotune_has_none(doc):
    assert _column(doc, "gemm")["autotune"] is None


def test_a_long_autotune_gets_a_note_under_the_end_to_end_table(doc, monkeypatch):
    def notes():
        (table,) = tables.end_to_end_tables(doc)
        return [n for n in table.notes if ": autotune " in n]

    assert notes() == []  # the tiny model tunes in well under AUTOTUNE_NOTE_SECONDS
    monkeypatch.setattr(tables, "AUTOTUNE_NOTE_SECONDS", 0.0)
    (line,) = notes()
    assert line == "tiny / auto: " + describe(_column(doc, "auto")["autotune"])
    assert line.startswith("tiny / auto: autotune ") and ": inputs " in line
    assert "nodes tuned" in line and "cache hits" in line
    # a CPU run builds no cuDNN plan: its variants part says no more than that
    assert ", variants " in line and "cuDNN" not in line


def test_the_autotune_line_names_cudnn_plans_on_cuda_only(doc):
    summary = _column(doc, "auto")["autotune"]
    assert summary["device"] == "cpu"
    assert ", variants " in describe(summary) and "cuDNN" not in describe(summary)
    assert ", variants (cuDNN plans) " in describe({**summary, "device": "cuda"})


def test_a_graph_column_leaves_the_note_to_its_eager_column(doc, monkeypatch):
    monkeypatch.setattr(tables, "AUTOTUNE_NOTE_SECONDS", 0.0)
    rec = _column(doc, "auto")
    assert tables.autotune_note(rec) is not None
    assert tables.autotune_note({**rec, "lowering": "auto+graph"}) is None


def test_the_profile_record_and_table_carry_the_summary(monkeypatch):
    m = tiny_convnet(batch=2)
    limits = {"matmul": {}, "copy": {}}
    rec = pf.profile_model(training_graph(m), lw.Lowering("auto"), NO_CACHE, "cpu", make_timer("cpu"), limits,
                           warmup=0, repeat=1)
    summary = rec["autotune"]
    assert summary["nodes_tuned"] > 0 and set(summary["seconds"]) == set(PARTS)
    assert summary["total_s"] <= rec["compile_s"]
    monkeypatch.setattr(tables, "AUTOTUNE_NOTE_SECONDS", 0.0)
    (table,) = profile_table.profile_tables(pf.profile_document({}, limits, [rec]))
    assert any(n.startswith("tiny / auto: autotune ") for n in table.notes)
    plain = pf.profile_steps(training_graph(m), random_feeds(m), "cpu", NO_CACHE, make_timer("cpu"),
                             warmup=0, repeat=1)
    assert plain["autotune"] is None


def test_a_benchmark_whose_choices_came_from_the_autotune_cache_says_so_naming_it(tmp_path):
    """Fresh-user report: ``--profile`` says when its choices were read from the
    autotune cache, the plain benchmark did not (its times then rest on another
    run's choices). The end-to-end table's notes say so, naming the file, in
    the profile's words (one function, ``tables.cache_note``); the first run,
    which timed every candidate, and the +graph column say nothing of it."""
    cache = tmp_path / "tune.json"

    def run():
        s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm,auto"), warmup=0, repeat=1,
                            per_layer=False, base_policy=LoweringPolicy(cache=str(cache)))
        doc = driver.run_benchmark([tiny_convnet()], s)
        (table,) = tables.end_to_end_tables(doc)
        return doc, [n for n in table.notes if str(cache) in n]

    first, said = run()
    assert said == []
    second, (note,) = run()
    summary = _column(second, "auto")["autotune"]
    assert summary["file_hits"] == summary["cache_hits"] == _column(first, "auto")["autotune"]["nodes_tuned"]
    assert note == "tiny / auto: " + tables.cache_note(summary)
    assert note.startswith(f"tiny / auto: autotune: {summary['file_hits']} of {summary['file_hits']} node "
                           f"choices were read from the autotune cache {cache}, timed when they were written "
                           "there, not by this run's compile")
    assert tables.column_cache_note({**_column(second, "auto"), "lowering": "auto+graph"}) is None
    # the JSON says it too, in the column's notes (it reached the table only: fresh-user report)
    assert tables.cache_note(summary) in _column(second, "auto")["notes"]
    assert not any("autotune cache" in n for n in _column(first, "auto")["notes"])
    assert pf.profile_cache_note(summary) == tables.cache_note(
        summary, "node choices (and their tuned_ms)", "this profile's compile")


def test_a_corrupt_autotune_cache_is_in_the_column_notes_not_only_on_stderr(tmp_path, capsys):
    """A corrupt autotune cache was reported by a RuntimeWarning on standard
    error alone: neither the run's nor the column's JSON notes said it (user
    report). The warnings raised while compiling a column are its notes
    (``warning: ...``), the end-to-end table's notes name the column, and the
    warning is still printed by the command."""
    import json

    from opgraph.benchmarks import cli

    cache = tmp_path / "tune.json"
    cache.write_text("{ not json")
    policy = tmp_path / "policy.toml"
    policy.write_text(f'cache = "{cache}"\n')
    status = cli.main(["--model", "L5", "--batch", "1", "--device", "cpu", "--warmup", "0", "--repeat", "1",
                       "--no-check", "--no-per-layer", "--lowering", "gemm,auto", "--policy", str(policy),
                       "--format", "json", "--quiet"])
    out, err = capsys.readouterr()
    assert status == 0, err
    doc = json.loads(out)
    gemm, auto = doc["results"]
    (note,) = [n for n in auto["notes"] if n.startswith("warning: ")]
    assert note.startswith(f"warning: autotune cache {cache} is corrupt: not JSON") and "rebuilt" in note
    assert not any(n.startswith("warning: ") for n in gemm["notes"])  # gemm does not read the cache
    assert f"opgraph-bench: warning: {note.removeprefix('warning: ')}" in err  # still said as it happens
    (table,) = tables.end_to_end_tables(doc)
    assert f"L5 / auto: {note}" in table.notes


def test_the_profile_notes_the_warnings_of_its_compile(tmp_path, recwarn):
    cache = tmp_path / "tune.json"
    cache.write_bytes(b"\xff\xfe")
    m = tiny_convnet(batch=2)
    rec = pf.profile_model(training_graph(m), lw.Lowering("auto"), LoweringPolicy(cache=str(cache)), "cpu",
                           make_timer("cpu"), {"matmul": {}, "copy": {}}, warmup=0, repeat=1)
    assert any(n.startswith(f"warning: autotune cache {cache} is corrupt: not UTF-8") for n in rec["notes"])
    assert any("is corrupt" in str(w.message) for w in recwarn.list)  # issued again for the caller


def test_a_warning_every_column_raises_is_printed_once(tmp_path, capsys):
    """The command prints a warning that each column's compile raises once, as
    before the compiles recorded their warnings (``records.warnings_noted``
    resets Python's once-per-place memory)."""
    _, err = _l5_with_policy(capsys, tmp_path, '[force]\nL5 = "direct"\nconv99 = "fft"\n', "gemm,direct")
    assert err == "opgraph-bench: warning: policy.force key 'conv99' matches no node of graph 'L5'\n"


def test_an_unmatched_engine_limits_key_is_one_note_of_the_record(tmp_path, capsys):
    """The key naming no node is both a compile warning (noted as ``warning: ...``) and a
    report note the record repeats (``lowerings.requested_notes``): one note, not the two
    (review: the record held the same words twice)."""
    doc, _ = _l5_with_policy(capsys, tmp_path, '[engine_limits]\n"nosuchnode" = 2\n', "auto")
    (auto,) = doc["results"]
    said = [n for n in auto["notes"] if "'nosuchnode' matches no node" in n]
    assert said == ["warning: policy.engine_limits key 'nosuchnode' matches no node of graph 'L5'"], said


def _l5_with_policy(capsys, tmp_path, policy_text: str, lowerings: str):
    """``(JSON document, standard error)`` of a quiet CPU run of L5 at batch 1 under a policy
    file holding ``policy_text``; the run must succeed."""
    import json

    from opgraph.benchmarks import cli

    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text)
    status = cli.main(["--model", "L5", "--batch", "1", "--device", "cpu", "--warmup", "0", "--repeat", "1",
                       "--no-check", "--no-per-layer", "--lowering", lowerings, "--policy", str(policy),
                       "--format", "json", "--quiet"])
    out, err = capsys.readouterr()
    assert status == 0, err
    return json.loads(out), err
