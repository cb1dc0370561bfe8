"""``opgraph-bench compare A.json B.json``: rows by model, lowering, precision and
phase, and a change marked only where it exceeds both runs' interquartile range."""

from __future__ import annotations

import csv
import io
import json

import pytest

from opgraph.benchmarks import cli, compare, driver, lowerings as lw

from tinymodels import tiny_convnet


def _loop(times):
    times = list(times)
    s = sorted(times)
    return {"median_ms": s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2,
            "min_ms": s[0], "times_ms": times}


def _rec(lowering, fwd, bwd, model="alexnet", precision="fp32", dtype="float32", batch=128):
    times = {"forward": _loop(fwd), "backward_data": _loop(bwd), "backward_filter": None}
    return {"model": model, "lowering": lowering, "precision": precision, "dtype": dtype, "layout": "NCHW",
            "batch": batch,
            "status": "ok", "times": times,
            "totals": {"total_ms": times["forward"]["median_ms"] + times["backward_data"]["median_ms"]}}


def _doc(*results):
    return {"tool": "opgraph-bench", "mode": "benchmark", "results": list(results)}


A = _doc(_rec("gemm", [10, 10.5, 11], [20, 21, 22]), _rec("fft", [30, 31, 32], [5, 5, 5]),
         _rec("winograd", [1, 1, 1], [1, 1, 1]))
B = _doc(_rec("gemm", [15, 15.5, 16], [20.2, 21.2, 22.2]), _rec("fft", [20, 21, 22], [5, 5, 5.0]),
         _rec("direct", [1, 1, 1], [1, 1, 1]))


def test_changes_beyond_both_spreads_are_marked():
    got = compare.compare(A, B)
    rows = {(r["lowering"], r["phase"]): r for r in got["rows"]}
    # gemm forward: +5 ms against IQRs of 0.5: slower; backward-data +0.2 within IQRs of 1: unmarked
    assert rows["gemm", "forward"]["change"] == "slower"
    assert rows["gemm", "forward"]["ratio"] == pytest.approx(15.5 / 10.5)
    assert rows["gemm", "backward_data"]["change"] == ""
    assert rows["fft", "forward"]["change"] == "faster"
    assert rows["gemm", "total"]["a_iqr_ms"] == pytest.approx(0.5 + 1.0)  # the phases' IQRs summed
    assert rows["fft", "backward_data"]["change"] == ""  # 5 -> 5 with no spread: no change
    assert got["only_a"] == ["alexnet / winograd / fp32 (batch 128, float32, NCHW)"]
    assert got["only_b"] == ["alexnet / direct / fp32 (batch 128, float32, NCHW)"]


def test_a_column_timed_as_a_whole_step_only_compares_by_its_step():
    """A ``+graph`` peer has no phase loops (``times`` null), only ``step``."""
    def peer(step):
        return {"model": "alexnet", "lowering": "torch+graph", "precision": "fp32", "dtype": "float32",
                "layout": "NCHW", "status": "ok", "times": None, "totals": {"total_ms": None},
                "step": _loop(step)}

    got = compare.compare(_doc(peer([10, 10.2, 10.4])), _doc(peer([12, 12.2, 12.4])))
    assert [(r["phase"], r["change"]) for r in got["rows"]] == [("step", "slower")]
    assert got["rows"][0]["ratio"] == pytest.approx(12.2 / 10.2)


def test_a_change_is_marked_only_beyond_both_iqrs():
    assert compare.change((10.0, 1.0), (12.0, 1.0)) == "slower"
    assert compare.change((10.0, 1.0), (12.0, 3.0)) == ""  # within B's spread
    assert compare.change((10.0, 3.0), (8.0, 1.0)) == ""  # within A's
    assert compare.change((10.0, 0.5), (8.0, 1.0)) == "faster"
    assert compare.change((10.0, None), (20.0, 1.0)) == "?"


def test_precisions_and_storage_dtypes_are_separate_columns():
    a = _doc(_rec("gemm", [1, 1, 1], [1, 1, 1], precision="bf16", dtype="bfloat16"))
    b = _doc(_rec("gemm", [1, 1, 1], [1, 1, 1], precision="bf16", dtype="float32"))
    got = compare.compare(a, b)
    assert got["rows"] == [] and got["only_a"] == ["alexnet / gemm / bf16, bfloat16 storage (batch 128, bfloat16, NCHW)"]


@pytest.mark.parametrize("other", [{"batch": 64}, {"dtype": "float64"}])
def test_another_batch_or_float64_storage_is_another_column(other):
    """A batch-2 run was compared with a batch-1 run, and float64 storage with
    float32 (both labelled fp32), as if they were the same column (fresh-user review)."""
    a = _doc(_rec("gemm", [1, 1, 1], [1, 1, 1]))
    b = _doc(_rec("gemm", [2, 2, 2], [2, 2, 2], **other))
    got = compare.compare(a, b)
    assert got["rows"] == [] and len(got["only_a"]) == len(got["only_b"]) == 1


def test_the_command_compares_two_real_runs(tmp_path, capsys):
    s = driver.Settings(device="cpu", lowerings=lw.parse_lowerings("gemm,direct"), warmup=0, repeat=3)
    paths = []
    for name in ("a", "b"):
        doc = driver.run_benchmark([tiny_convnet()], s)
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    status = cli.main(["compare", *map(str, paths)])
    out = capsys.readouterr().out
    assert status == 0 and "b.json against" in out and "backward_filter" in out and "change:" in out
    status = cli.main(["compare", *map(str, paths), "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {(r["lowering"], r["phase"]) for r in rows} == {
        (lo, p) for lo in ("gemm", "direct")
        for p in ("forward", "backward_data", "backward_filter", "total", "step")}  # step: the whole step's loop
    assert all(float(r["ratio"]) > 0 for r in rows)


def test_a_file_that_is_no_benchmark_document_exits_2(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"tool": "opgraph-bench", "mode": "summary"}')
    assert cli.main(["compare", str(bad), str(bad)]) == 2
    assert "is not an opgraph-bench benchmark document" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "none.json"), str(bad)]) == 2
    assert "cannot be read" in capsys.readouterr().err


def _edited(edit):
    doc = json.loads(json.dumps({**A, "schema_version": driver.SCHEMA_VERSION}))
    edit(doc)
    return doc


@pytest.mark.parametrize("edit,field,value,what", [
    (lambda d: d["results"][0]["times"]["forward"].update(median_ms="x"),
     "results[0].times.forward.median_ms", '"x"', "must be a number of milliseconds"),
    (lambda d: d.update(results="oops"), "results", '"oops"', "must be a list of results (one per column)"),
    (lambda d: d.update(schema_version=2), "schema_version", "2",
     f"this opgraph-bench compares schema_version {driver.SCHEMA_VERSION}, the version its timing runs write"),
    (lambda d: d.pop("schema_version"), "schema_version", "null", "this opgraph-bench compares schema_version"),
    (lambda d: d["results"].__setitem__(1, 5), "results[1]", "5", "must be an object (one column's result)"),
    (lambda d: d["results"][1]["times"]["backward_data"]["times_ms"].append("a"),
     "results[1].times.backward_data.times_ms[3]", '"a"', "must be a number of milliseconds"),
    (lambda d: d["results"][2].update(batch=[1]), "results[2].batch", "[1]", "must be an integer or null"),
    (lambda d: d["results"][0]["totals"].update(total_ms=None), "results[0].totals.total_ms", "null",
     "must be a number of milliseconds"),
    # a negative time was compared, as a ratio of "-1.00x"
    (lambda d: d["results"][0]["times"]["forward"]["times_ms"].__setitem__(0, -2.5),
     "results[0].times.forward.times_ms[0]", "-2.5", "must be a finite number of milliseconds >= 0"),
    (lambda d: d["results"][0]["times"]["forward"].update(median_ms=-1), "results[0].times.forward.median_ms",
     "-1", "must be a finite number of milliseconds >= 0"),
])
def test_a_hand_edited_document_is_one_line_naming_file_and_field(tmp_path, capsys, edit, field, value, what):
    """``median_ms = "x"`` raised a TypeError, ``results = "oops"`` an
    AttributeError (a traceback, exit 1), and a schema_version the writer does
    not write was accepted (user report): one line, exit 2, as other usage errors."""
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps({**A, "schema_version": driver.SCHEMA_VERSION}))
    bad.write_text(json.dumps(_edited(edit)))
    assert cli.main(["compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"opgraph-bench compare: error: {bad}: {field} = {value}: {what}"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert cli.main(["compare", str(good), str(good)]) == 0  # the unedited document compares
    capsys.readouterr()


def test_a_column_whose_runs_lowered_it_differently_is_named():
    """Two runs of one column that lowered an op type to other algorithms (a
    re-tuned cache) or rewrote it with other fusion rules (one included, or
    excluded) compare two programs; the comparison said nothing of it
    (fresh-user report; review: the fusion rules too)."""
    a, b = _rec("auto", [1, 1, 1], [1, 1, 1]), _rec("auto", [1, 1, 1], [1, 1, 1])
    a["algorithms"] = {"Conv2d": {"cudnn": 5}, "Conv2dBackwardData": {"cudnn": 4}}
    b["algorithms"] = {"Conv2d": {"cudnn": 5}, "Conv2dBackwardData": {"cudnn": 3, "fft-chunked": 1},
                       "Linear": {"cublas": 1}}
    a["fusion"] = {"pool-argmax": {"applied": 3, "declined": 0}, "pool-scan": {"applied": 0, "declined": 0}}
    b["fusion"] = {"pool-argmax": {"applied": 3, "declined": 1}, "pool-scan": {"applied": 3, "declined": 0}}
    got = compare.compare(_doc(a), _doc(b))
    assert got["lowered_differently"] == {"alexnet / auto / fp32 (batch 128, float32, NCHW)": [
        "Conv2dBackwardData: cudnn 4 -> cudnn 3, fft-chunked 1", "Linear: - -> cublas 1",
        "fusion pool-scan: 0 -> 3"]}  # a decline more is no other program
    notes = " ".join(compare.comparison_table(got, "a.json", "b.json").notes)
    assert "lowered it differently" in notes and "fft-chunked 1" in notes and "pool-scan" in notes
    same = compare.compare(_doc(a), _doc(dict(b, algorithms=a["algorithms"], fusion=a["fusion"])))
    assert same["lowered_differently"] == {}
    assert "differently" not in " ".join(compare.comparison_table(same, "a", "b").notes)


def test_columns_of_two_layouts_are_named_apart():
    a = _doc(_rec("auto", [1, 1, 1], [1, 1, 1]), dict(_rec("auto", [1, 1, 1], [1, 1, 1]), layout="NHWC"))
    got = compare.compare(a, _doc())
    assert len(set(got["only_a"])) == 2


def _files(tmp_path, a, b):
    paths = tmp_path / "a.json", tmp_path / "b.json"
    for path, rec in zip(paths, (a, b)):
        path.write_text(json.dumps(dict(_doc(rec), schema_version=compare.SCHEMA_VERSION)))
    return list(map(str, paths))


def test_files_sharing_no_column_say_so_in_notes_alone(tmp_path, capsys):
    """They printed an empty bordered table (Markdown: a header row) above the
    notes, and in CSV a header alone, which reads as a comparison of nothing:
    now the notes alone, in CSV on standard error with nothing on standard output."""
    a, b = _files(tmp_path, _rec("gemm", [1, 1, 1], [1, 1, 1]), _rec("fft", [1, 1, 1], [1, 1, 1]))
    only = ["timed in A only: alexnet / gemm / fp32 (batch 128, float32, NCHW)",
            "timed in B only: alexnet / fft / fp32 (batch 128, float32, NCHW)"]
    nothing = f"{compare.NOTHING_SHARED} (A: {a}; B: {b})"  # which file is A, without the table's title
    for fmt, bullet in (("table", ""), ("markdown", "- ")):
        assert cli.main(["compare", a, b, "--format", fmt]) == 0
        out, err = capsys.readouterr()
        assert out.splitlines() == [bullet + n for n in (nothing, *only)] and err == "", out
    assert cli.main(["compare", a, b, "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"opgraph-bench compare: {n}" for n in (nothing, *only)]
    assert cli.main(["compare", a, b, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == [] and doc["only_a"] == [only[0].split(": ", 1)[1]]
    assert "csv nothing on standard output" in " ".join(compare.build_parser().format_help().split())


def test_the_layout_has_a_column_in_the_table_as_in_the_csv(tmp_path, capsys):
    """Two NHWC runs compared: the layout was only in the labels of the notes."""
    a, b = _files(tmp_path, dict(_rec("gemm", [1, 1, 1], [1, 1, 1]), layout="NHWC"),
                  dict(_rec("gemm", [2, 2, 2], [1, 1, 1]), layout="NHWC"))
    assert cli.main(["compare", a, b, "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["layout"] for r in rows} == {"NHWC"} and len(rows) == 3
    # with rows too the notes go to standard error (they were dropped: fresh user)
    assert err.startswith(f"opgraph-bench compare: A: {a}; B: {b}") and "change: beyond both runs' IQR" in err
    table = compare.comparison_table(compare.compare(*map(compare.load, (a, b))), a, b)
    at = table.headers.index("layout")
    assert table.headers[at - 1] == "precision" and {r[at] for r in table.rows} == {"NHWC"}
    assert cli.main(["compare", a, b, "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| precision | layout | phase |" in out and "| fp32 | NHWC | forward |" in out


def test_an_excluded_fusion_rule_is_said_excluded():
    """A rule the policy excluded in B showed as ``-``, as a rule the record
    has no entry for; excluded, none rewritten and absent all rewrite nothing,
    so they compare equal."""
    a, b = _rec("auto", [1, 1, 1], [1, 1, 1]), _rec("auto", [1, 1, 1], [1, 1, 1])
    a["fusion"] = {"pool-scan": {"applied": 13, "declined": 0}, "elementwise": {"applied": 0, "declined": 2},
                   "bn-fold": {"excluded": True}}
    b["fusion"] = {"pool-scan": {"excluded": True}, "elementwise": {"excluded": True}}
    (label, lines), = compare.compare(_doc(a), _doc(b))["lowered_differently"].items()
    assert lines == ["fusion pool-scan: 13 -> excluded"]
    assert compare.compare(_doc(b), _doc(a))["lowered_differently"][label] == ["fusion pool-scan: excluded -> 13"]
    b["fusion"]["relu-bias-sums"] = {"applied": 2, "declined": 0}  # a rule A's file has no entry for
    assert compare.compare(_doc(a), _doc(b))["lowered_differently"][label][-1] == "fusion relu-bias-sums: - -> 2"


def test_a_usage_error_names_the_two_files_compare_needs(capsys):
    """The short usage line read ``opgraph-bench compare [FLAGS ...]``, hiding the
    required A.json and B.json (fresh user)."""
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "only-one.json"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith("usage: opgraph-bench compare A.json B.json [--format table|markdown|json|csv];"), err


def test_a_policy_difference_is_noted_though_the_rule_rewrote_nothing():
    """``auto`` against ``auto,exclude=relu-bias-sums`` on the CPU, where the rule waits for
    ``fused-reference`` and rewrites nothing: the two columns share a label and compared as one
    program with no note (fresh user). The records' policies differ: that is noted."""
    pol = {"autotune": True, "precision": "fp32", "layout": "NCHW"}
    a = dict(_rec("auto", [1, 1, 1], [1, 1, 1]), policy=pol, fusion={"relu-bias-sums": {"applied": 0}})
    b = dict(_rec("auto", [1, 1, 1], [1, 1, 1]), policy=dict(pol, exclude=["relu-bias-sums"]),
             fusion={"relu-bias-sums": {"excluded": True}})
    assert compare.lowering_changes(a, b) == ["policy exclude: - -> ['relu-bias-sums']"]
    result = compare.compare(_doc(a), _doc(b))
    assert list(result["lowered_differently"].values()) == [["policy exclude: - -> ['relu-bias-sums']"]]
    assert compare.lowering_changes(a, dict(a)) == []


def test_a_rule_waiting_for_the_oracles_opt_in_shows_as_opt_in():
    """A CPU column's rule that left the oracle kernels alone (``'opt_in': True``, 0 rewrites)
    against the same rule excluded: both rewrote nothing, so no difference is noted, but each
    reads as what it was, not as '-' or '0'."""
    assert compare._fusion({"applied": 0, "declined": 0, "opt_in": True}) == (0, "opt_in")
    assert compare._fusion({"applied": 3, "declined": 0}) == (3, "3")
    a = dict(_rec("gemm", [1, 1, 1], [1, 1, 1]), fusion={"pool-argmax": {"applied": 0, "declined": 0, "opt_in": True}})
    b = dict(a, fusion={"pool-argmax": {"applied": 2, "declined": 0}})
    assert compare.lowering_changes(a, b) == ["fusion pool-argmax: opt_in -> 2"]
