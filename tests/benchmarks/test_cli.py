"""``opgraph-bench``: summary output against the spec files, usage errors, and
small timing runs on the CPU."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from opgraph.benchmarks import cli, driver

SPECS = Path(__file__).resolve().parents[2] / "benchmarks" / "specs"
WINNERS = json.loads((SPECS / "imagenet_winners.json").read_text())["models"]
SUITE = {L["name"]: L for L in json.loads((SPECS / "layer_suite.json").read_text())["layers"]}
MODERN = json.loads((SPECS / "modern_convnets.json").read_text())["models"]


def spec_rows(spec):
    """(name, per-image output shape, params or None, per-image FLOPs or None)
    of every spec layer, inception branches before their concat."""
    for layer in spec["layers"]:
        subs = []
        if layer["type"] == "inception":
            by = {b["name"]: b for b in layer["branches"]}
            subs = [s for name in layer["concat_order"] for s in by[name]["layers"]]
        for s in subs + [layer]:
            conv_or_fc = s["type"] in ("conv2d", "linear")
            yield (s["name"], s["output_shape"], s["params"] if conv_or_fc else 0,
                   s["fwd_flops_per_image"] if conv_or_fc else None)


def run_cli(capsys, *args):
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_summary_json_of_all_thirteen_entries_equals_the_specs(capsys):
    status, out, err = run_cli(capsys, "--model", "all", "--summary", "--format", "json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["mode"] == "summary"
    got = {m["model"]: m for m in doc["models"]}
    assert list(got) == ["alexnet", "overfeat", "vgg_a", "googlenet", "L1", "L2", "L3", "L4", "L5",
                         "resnet50", "densenet121", "mobilenet_v2", "efficientnet_b0"]
    for m in got.values():
        b = m["batch"]
        if m["model"] in MODERN:  # every layer: tests/benchmarks/test_models_modern_spec.py
            spec = MODERN[m["model"]]
            assert b == (64 if m["model"] == "densenet121" else 128)
            assert m["totals"]["params"] == spec["params"]
            conv_fc = sum(l["flops"] for l in m["layers"] if l["op"] in ("Conv2d", "Linear"))
            assert conv_fc == b * (spec["conv_flops_per_image"] + spec["linear_flops_per_image"])
            shapes = {l["name"]: l["output_shape"] for l in m["layers"]}
            assert all(shapes[l["name"]] == [b, *l["out"]] for l in spec["layers"])
            continue
        if m["model"] in SUITE:
            spec = SUITE[m["model"]]
            (layer,) = m["layers"]
            assert b == spec["batch"]
            assert layer["name"] == spec["name"] and layer["params"] == spec["params"]
            assert layer["output_shape"] == [b, spec["out_channels"], spec["output_hw"], spec["output_hw"]]
            assert round(layer["flops"] / 1e9, 1) == spec["fwd_gflop_per_batch"]
            continue
        spec = WINNERS[m["spec_key"]]
        assert b == spec["batch_size"]
        rows = list(spec_rows(spec))
        assert [l["name"] for l in m["layers"]] == [r[0] for r in rows]
        for layer, (name, shape, params, flops) in zip(m["layers"], rows):
            assert layer["output_shape"] == [b, *shape], name
            assert layer["params"] == params, name
            if flops is not None:
                assert layer["flops"] == b * flops, name
        c = spec["computed"]
        assert m["totals"]["params"] == c["params_total"]
        conv_fc = sum(l["flops"] for l in m["layers"] if l["op"] in ("Conv2d", "Linear"))
        assert conv_fc == b * c["forward_flops_per_image"]
        assert m["totals"]["activation_bytes"] == 4 * b * c["activation_elements_per_image_all_layer_outputs"]
    env = doc["environment"]
    assert {"timestamp", "python", "numpy", "git_commit", "dtype"} <= set(env)


def test_suite_modern_aliases_and_the_default_suite():
    from opgraph.benchmarks.arguments import model_names, parse_models

    modern = ["resnet50", "densenet121", "mobilenet_v2", "efficientnet_b0"]
    assert model_names(cli.build_parser().parse_args(["--suite", "modern"])) == modern
    assert model_names(cli.build_parser().parse_args([])) == ["alexnet", "overfeat", "vgg_a", "googlenet"]
    assert parse_models("ResNet-50,mobilenetv2,modern") == ["resnet50", "mobilenet_v2", "densenet121",
                                                            "efficientnet_b0"]
    assert parse_models("all")[-4:] == modern


def test_summary_batch_flag_scales_flops_but_not_params(capsys):
    status, out, _ = run_cli(capsys, "--model", "googlenet_v1", "--summary", "--batch", "2",
                             "--format", "json")
    assert status == 0
    (m,) = json.loads(out)["models"]
    c = WINNERS["googlenet_v1"]["computed"]
    assert m["model"] == "googlenet" and m["batch"] == 2
    assert m["totals"]["params"] == c["params_total"]
    assert m["layers"][0]["output_shape"] == [2, 64, 112, 112]


def test_summary_table_and_csv(capsys, tmp_path):
    status, out, _ = run_cli(capsys, "--model", "overfeat_fast", "--summary")
    assert status == 0
    for text in ("conv1", "fc8", "96x56x56", "145,920,872", "total"):
        assert text in out
    path = tmp_path / "s.csv"
    status, out, err = run_cli(capsys, "--model", "L1,L2", "--summary", "--format", "csv",
                               "--output", str(path))
    assert status == 0 and out == "" and str(path) in err
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert [(r["model"], r["layer"]) for r in rows] == [("L1", "L1"), ("L1", "(total)"),
                                                       ("L2", "L2"), ("L2", "(total)")]
    assert int(rows[2]["params"]) == SUITE["L2"]["params"]


def test_plain_table_without_rich(capsys):
    from opgraph.benchmarks import report

    doc = cli.run_summary(["L4"], cli.build_parser().parse_args(["--summary"]))
    buf = io.StringIO()
    report.write_table(doc, buf, use_rich=False)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("# static summary")
    assert any(l.startswith("L4 ") and "128x128x10x10" in l and "802,944" in l for l in lines)


@pytest.mark.parametrize("flag,value", [("--model", "L1,,L2"), ("--model", "L1,"), ("--lowering", "gemm,,fft"),
                                        ("--precision", "fp32,"), ("--compare", ",torch")])
def test_an_empty_list_entry_is_a_usage_error(capsys, flag, value):
    """A doubled or trailing comma was dropped without a word (fresh-user review)."""
    with pytest.raises(SystemExit) as e:
        cli.main([flag, value, "--summary"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and flag in err and "empty entry" in err


@pytest.mark.parametrize("flag,value", [("--compare", "torch,torch"), ("--precision", "fp32,bf16,FP32")])
def test_an_entry_given_twice_is_a_usage_error(capsys, flag, value):
    """``--compare torch,torch`` gave one column without a word (fresh-user review)."""
    with pytest.raises(SystemExit) as e:
        cli.main([flag, value, "--summary"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and flag in err and "given more than once" in err


@pytest.mark.parametrize("bad", [["--model", "resnet"], ["--model", "L6"], ["--batch", "0"],
                                 ["--format", "xml"], ["--repeat", "x"], ["--lowering", "fast"],
                                 ["--precision", "fp8"], ["--compare", "tensorflow"],
                                 ["--model", "L1", "--suite", "layers"]])
def test_usage_errors_exit_with_2(capsys, bad):
    with pytest.raises(SystemExit) as e:
        cli.main(bad + ["--summary"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "opgraph-bench: error:" in err
    if bad[0] == "--model" and len(bad) == 2:
        assert f"unknown model {bad[1]!r}" in err and "alexnet" in err
    if bad[0] == "--lowering":
        assert "unknown lowering 'fast'" in err and "winograd" in err and "auto" in err


def test_a_bad_flag_value_prints_a_short_usage_line_not_every_flag(capsys):
    """Fresh-user report: argparse printed its 17-line usage of every flag above
    the one line that said what was wrong; ``--help`` keeps the full usage."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--batch", "x", "--summary"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["usage: opgraph-bench [FLAGS ...]; opgraph-bench --help lists them",
                                "opgraph-bench: error: argument --batch: 'x' is not an integer"]
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0 and "[--onnx-input NAME]" in capsys.readouterr().out


@pytest.mark.parametrize("names", [["L4"], ["L4", "vgg_a"], ["resnet50", "densenet121"]])
def test_the_cpu_batch_note_quotes_the_batches_of_the_runs_models_only(names):
    """Fresh-user report: the CPU default's note quoted DenseNet-121's batch in
    runs without DenseNet-121. Each model of the run has its batch quoted, and
    no other model is named (by key or as the note once wrote it, 'VGG-A')."""
    import argparse
    import re

    from opgraph.benchmarks.models import MODELS, SEED_BATCHES
    from opgraph.benchmarks.modes import build_models

    notes = []
    args = argparse.Namespace(batch=None, dtype="float32", onnx=[], onnx_input=None)
    models = build_models(names, args, "cpu", notes)
    assert [m.batch for m in models] == [driver.CPU_DEFAULT_BATCH] * len(names)
    (note,) = notes  # one note for the run, not one per model

    def bare(text):  # 'DenseNet-121' and 'densenet121' alike
        return re.sub(r"[-_ ]", "", text.lower())

    assert [n for n in MODELS if n not in names and bare(n) in bare(note)] == []
    quoted = note[note.index("(") + 1:note.index(")")]  # "128; vgg_a 64"
    common = int(quoted.split(";")[0])
    for name in names:
        assert common == SEED_BATCHES[name] or f"{name} {SEED_BATCHES[name]}" in quoted, (name, note)


def test_console_script_reports_unknown_model():
    exe = shutil.which("opgraph-bench", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "opgraph.benchmarks.cli"]
    proc = subprocess.run(cmd + ["--model", "nope", "--summary"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "unknown model 'nope'" in proc.stderr and proc.stdout == ""


def test_python_dash_m_opgraph_benchmarks_is_the_command(tmp_path):
    """``python -m opgraph.benchmarks`` said the package cannot be directly
    executed; it is ``opgraph-bench``, its compare subcommand included. It
    names itself as it was invoked: its ``--help`` said ``usage:
    opgraph-bench``, a command a user without the console script cannot type."""
    prog = f"{Path(sys.executable).name} -m opgraph.benchmarks"  # as Python 3.14's argparse names it

    def run(*args):
        return subprocess.run([sys.executable, "-m", "opgraph.benchmarks", *args], capture_output=True,
                              text=True, timeout=60)

    proc = run("--model", "nope", "--summary")
    assert proc.returncode == 2 and f"{prog}: error: argument --model: unknown model 'nope'" in proc.stderr
    proc = run("--mdoel", "L1")
    assert proc.returncode == 2 and proc.stderr.startswith(f"usage: {prog} [FLAGS ...]; {prog} --help lists them\n")
    proc = run("--help")
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: {prog} [-h]")
    help_text = " ".join(proc.stdout.split())
    assert f"{prog} compare A.json B.json" in help_text and f"{prog} compare --help says more" in help_text
    assert "opgraph-bench compare" not in help_text
    proc = run("compare", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: {prog} compare [-h]")
    doc = tmp_path / "none.json"
    proc = run("compare", str(doc), str(doc))
    assert proc.returncode == 2 and proc.stderr.startswith(f"{prog} compare: error: {doc}: cannot be read")


def test_the_console_script_keeps_its_name(capsys, tmp_path):
    """``main()``, the ``opgraph-bench`` console script, still names itself
    ``opgraph-bench`` (``python -m`` passes its own name)."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: opgraph-bench [-h]")
    assert "opgraph-bench compare --help says more" in " ".join(out.split())
    doc = tmp_path / "none.json"
    assert cli.main(["compare", str(doc), str(doc)]) == 2
    assert capsys.readouterr().err.startswith(f"opgraph-bench compare: error: {doc}: cannot be read")


def test_the_help_gives_the_compare_subcommands_usage():
    """``opgraph-bench --help`` never mentioned ``compare``, and argparse cut
    ``opgraph-bench`` at its hyphen when it wrapped a paragraph."""
    from opgraph.benchmarks.arguments import COMPARE_USAGE, build_parser

    text = build_parser().format_help()
    assert COMPARE_USAGE == "opgraph-bench compare A.json B.json [--format table|markdown|json|csv]"
    assert COMPARE_USAGE in " ".join(text.split()) and "opgraph-bench compare --help" in " ".join(text.split())
    assert not [line for line in text.splitlines() if line.endswith(("opgraph-", " -"))]


def test_a_lowering_that_applies_nowhere_is_a_usage_error(capsys):
    status, out, err = run_cli(capsys, "--model", "L1", "--lowering", "winograd", "--device", "cpu")
    assert status == 2 and out == ""
    assert "'winograd' cannot run any convolution" in err and "3x3" in err and "L1" in err
    # with another model where it applies, the run goes on and L1 is n/a (checked in test_report)


def test_timing_run_json(capsys, tmp_path):
    path = tmp_path / "run.json"
    status, out, err = run_cli(capsys, "--model", "L5,L1", "--batch", "1", "--device", "cpu",
                               "--lowering", "gemm,winograd", "--warmup", "0", "--repeat", "1",
                               "--no-per-layer", "--format", "json", "--output", str(path))
    assert status == 0, err
    assert out == "" and f"wrote json to {path}" in err and "[4/4] L1 fp32 winograd: n/a" in err
    doc = json.loads(path.read_text())
    got = {(r["model"], r["lowering"]): r for r in doc["results"]}
    assert got["L5", "winograd"]["status"] == "ok" and got["L5", "winograd"]["check"]["passed"]
    l1 = got["L1", "winograd"]
    assert l1["status"] == "n/a" and "3x3" in l1["reason"] and "times" not in l1
    l5 = got["L5", "gemm"]
    assert l5["flops"]["forward"] == 2 * 384 * 11 * 11 * 384 * 3 * 3  # one image of L5
    # the layer suite times the input gradient too
    assert l5["flops"]["backward_data"] == l5["flops"]["forward"]
    assert l5["times"]["backward_data"]["median_ms"] > 0 and "layers" in l5
    assert doc["environment"]["batch"] == {"L5": 1, "L1": 1}
    assert doc["notes"][0].startswith("device: cpu")


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_output_keeps_mode_and_symbolic_link(capsys, tmp_path, fmt):
    real = tmp_path / "results" / f"run.{fmt}"
    real.parent.mkdir()
    real.write_text("old")
    os.chmod(real, 0o644)
    link = tmp_path / f"latest.{fmt}"
    link.symlink_to(real)
    status, _, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--device", "cpu", "--lowering",
                             "gemm", "--warmup", "0", "--repeat", "1", "--no-per-layer", "--no-check",
                             "--format", fmt, "--output", str(link))
    assert status == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o644
    assert "L5" in real.read_text() and not list(real.parent.glob(".opgraph-*"))


def test_default_run_on_cpu_states_its_defaults(capsys, monkeypatch):
    monkeypatch.setattr(cli.lw, "CPU_DEFAULT", ("direct",))  # L4 direct: fast and checked
    status, out, err = run_cli(capsys, "--model", "L4", "--device", "cpu", "--repeat", "1",
                               "--warmup", "0", "--no-per-layer")
    assert status == 0, err
    assert f"batch {driver.CPU_DEFAULT_BATCH}: CPU default" in out
    assert "CPU default lowerings" in out and "end to end, fp32" in out
    assert "L4" in out and "direct" in out


def test_time_limit_skips_the_rest(capsys):
    status, out, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--device", "cpu",
                               "--lowering", "gemm,direct", "--time-limit", "0", "--format", "csv",
                               "--quiet")
    # nothing was timed: said even with --quiet, and not a success (it was 0 and silent)
    assert status == cli.EXIT_NOTHING_TIMED == 4
    assert err == ("opgraph-bench: error: --time-limit 0 s was reached before any column ran: all 2 "
                   "column(s) skipped, nothing was timed\n")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["status"] for r in rows] == ["skipped", "skipped"]


def test_nothing_timed_is_an_error_when_the_other_columns_could_not_run(capsys, monkeypatch):
    """The peers run first, so with PyTorch missing a time limit reached before
    the first opgraph column leaves only 'unavailable' and 'skipped' columns:
    nothing was timed, exit 4 (it exited 0: only skipped and n/a counted)."""
    rec = {"model": "L5", "precision": "fp32", "batch": 1, "layout": "NCHW", "device": "cpu"}
    results = [{**rec, "lowering": "torch", "kind": "torch", "status": "unavailable",
                "reason": "PyTorch is not installed"},
               {**rec, "lowering": "gemm", "kind": "opgraph", "status": "skipped",
                "reason": "--time-limit 1 s reached"}]
    monkeypatch.setattr(cli, "run_timing", lambda names, args: {
        "tool": "opgraph-bench", "mode": "benchmark", "notes": [], "results": results})
    status, _, err = run_cli(capsys, "--model", "L5", "--time-limit", "1", "--format", "json", "--quiet")
    assert status == cli.EXIT_NOTHING_TIMED
    assert err == ("opgraph-bench: error: --time-limit 1 s was reached before any column ran: 1 of 2 "
                   "column(s) skipped and the others unavailable, nothing was timed\n")


def test_markdown_and_plot_outputs(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png, md = tmp_path / "p.png", tmp_path / "r.md"
    status, _, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--device", "cpu",
                             "--lowering", "direct", "--warmup", "0", "--repeat", "1", "--no-check",
                             "--format", "markdown", "--output", str(md), "--plot", str(png))
    assert status == 0, err
    assert md.read_text().startswith("### Environment") and png.read_bytes()[:4] == b"\x89PNG"


def test_unreadable_policy_is_an_error(capsys, tmp_path):
    status, _, err = run_cli(capsys, "--model", "L4", "--batch", "1", "--device", "cpu",
                             "--policy", str(tmp_path / "missing.toml"))
    assert status == 2 and "missing.toml" in err and "Traceback" not in err


def test_policy_file_reaches_every_column(capsys, tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('exclude = ["fused"]\n')
    status, out, err = run_cli(capsys, "--model", "L4", "--batch", "1", "--device", "cpu",
                               "--lowering", "direct", "--warmup", "0", "--repeat", "1",
                               "--no-per-layer", "--policy", str(path), "--format", "json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["environment"]["policy"]["exclude"] == ["fused"]
    assert doc["results"][0]["algorithms"]["Conv2d"] == {"direct": 1}


@pytest.mark.skipif(driver.cuda_status()[0], reason="a GPU is usable here")
def test_device_choice_without_a_gpu(capsys):
    assert driver.resolve_device("auto")[0] == "cpu"
    assert "auto:" in driver.resolve_device("auto")[1]
    status, _, err = run_cli(capsys, "--model", "L5", "--device", "cuda", "--batch", "1")
    assert status == 1 and "'cuda' is unavailable" in err


def test_a_failing_column_sets_exit_status_3(capsys, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(driver, "run_and_measure", boom)
    status, out, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--device", "cpu",
                               "--lowering", "direct", "--warmup", "0", "--repeat", "1",
                               "--format", "json")
    assert status == 3 and "1 column(s) failed" in err
    (r,) = json.loads(out)["results"]
    # the reason names the innermost frame too (tests/benchmarks/test_cli_reliability.py)
    assert r["status"] == "error" and r["reason"].startswith("RuntimeError: kernel exploded (at ")


def _tiny_onnx(path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    import numpy as np
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3, 3, 3],
                           np.random.default_rng(0).standard_normal(108).astype(np.float32).tolist())
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_onnx_model_alone_is_timed_and_summarised(tmp_path, capsys):
    path = _tiny_onnx(tmp_path / "tiny.onnx")
    out = tmp_path / "r.json"
    rc = cli.main(["--onnx", str(path), "--device", "cpu", "--batch", "2", "--warmup", "1",
                   "--repeat", "2", "--quiet", "--format", "json", "--output", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert {r["model"] for r in doc["results"]} == {"tiny"}  # no built-in model unless asked
    assert all(r["status"] == "ok" and r["batch"] == 2 for r in doc["results"])
    capsys.readouterr()
    assert cli.main(["--onnx", str(path), "--summary", "--format", "json", "--batch", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    (model,) = summary["models"]
    assert model["model"] == "tiny" and model["totals"]["flops"] == 2 * 2 * 4 * 64 * 27
    assert cli.main(["--onnx", str(path), "--summary", "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "tiny: batch 1, the file's (a symbolic batch builds 1; set with --batch)" in summary["notes"]


@pytest.mark.parametrize("second", ["--model L1", "--onnx {tmp}/b/L1.onnx"])
def test_an_onnx_file_named_as_another_model_is_refused(tmp_path, capsys, second):
    """Results are keyed by model name: a DSL model and a file of the same name
    made two indistinguishable rows (fresh-user review)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _tiny_onnx(tmp_path / "a" / "L1.onnx")
    _tiny_onnx(tmp_path / "b" / "L1.onnx")
    args = ["--onnx", str(tmp_path / "a" / "L1.onnx"), *second.format(tmp=tmp_path).split(), "--summary"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "'L1'" in err and "another name" in err


@pytest.mark.parametrize("flag,value,message", [
    ("--output", "{tmp}/missing/run.json", "does not exist"),
    ("--output", "{tmp}", "is a folder"),
    ("--plot", "{tmp}/missing/p.png", "does not exist"),
    ("--json", "{tmp}/missing/run.json", "does not exist"),
    ("--json", "{tmp}", "is a folder"),
    ("--json", "{tmp}/afile/run.json", "is a file, not a folder"),
    ("--json", "{tmp}/same.json --output {tmp}/same.json --format csv", "writes the same file"),
    # tried, not os.access (which says yes to root): nothing can be created in /proc, even by root
    ("--output", "/proc/opgraph-test.json", "no file can be created in folder /proc: No such file"),
    ("--output", "/proc/opgraph-test.txt --format table", "no file can be created in folder /proc"),
    ("--plot", "/proc/opgraph-test.png", "no file can be created in folder /proc: No such file"),
    ("--trace", "/proc/opgraph-test.json", "no file can be created in folder /proc: No such file"),
    ("--json", "/proc/version", "cannot be written: Invalid argument"),  # no one opens it for writing
    ("--output", "{tmp}/afile/out.json", "is a file, not a folder"),
])
def test_unwritable_output_paths_are_usage_errors_before_any_work(tmp_path, capsys, flag, value, message):
    (tmp_path / "afile").write_text("")
    status, out, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--device", "cpu",
                               flag, *value.format(tmp=tmp_path).split())
    assert status == 2 and flag in err and message in err
    assert value.format(tmp=tmp_path).split()[0] in err  # the path
    assert "L5" not in out  # nothing was timed
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.parent.glob("*.tmp"))


def test_the_output_check_tries_the_writer_s_temporary_file_and_leaves_nothing(tmp_path, capsys):
    """An existing --output file is opened for appending (not changed) and a
    temporary file is created beside it and removed; a FIFO is not opened
    (it would block until a reader came)."""
    out = tmp_path / "run.json"
    out.write_text("old")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    args = cli.build_parser().parse_args(["--output", str(out), "--trace", str(fifo),
                                          "--json", str(tmp_path / "new.json")])
    cli.check_output_paths(args)
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "run.json"]


def test_an_output_that_fails_at_the_end_names_its_flag_and_path(tmp_path, capsys, monkeypatch):
    path = tmp_path / "run.json"

    def full(path, text, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "write_atomic", full)
    status, _, err = run_cli(capsys, "--model", "L5", "--summary", "--format", "json", "--output", str(path))
    assert status == 1 and "Traceback" not in err
    assert err == f"opgraph-bench: error: --output {path}: cannot be written: No space left on device\n"


@pytest.mark.skipif(not os.access("/dev/null", os.W_OK), reason="/dev/null is not writable here")
def test_output_to_dev_null_keeps_the_device(capsys):
    status, out, err = run_cli(capsys, "--model", "L5", "--summary", "--format", "json", "--output",
                               "/dev/null")
    assert status == 0, err
    assert out == "" and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_timing_run_writes_its_json_once_into_a_fifo(tmp_path, capsys):
    """--output json rewrites a file after each column; a FIFO (or /dev/stdout
    on a pipe) receives the document once, and stays a FIFO."""
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got, done = [], threading.Event()

    def read():  # every opening of the FIFO for writing, until done
        while not done.is_set():
            got.append(fifo.read_bytes())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status, _, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--device", "cpu", "--lowering",
                                 "gemm,direct", "--warmup", "0", "--repeat", "1", "--no-per-layer",
                                 "--no-check", "--format", "json", "--output", str(fifo), "--quiet")
    finally:
        done.set()
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader waits in open: wake it
        reader.join(10)
    assert status == 0, err
    got = [b for b in got if b]
    assert len(got) == 1  # one document, not one per column
    doc = json.loads(got[0])
    assert [r["lowering"] for r in doc["results"]] == ["gemm", "direct"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_console_script_writes_to_dev_stdout():
    """/dev/stdout links to /proc/self/fd/1: on a pipe its temporary file was
    '/proc/<pid>/fd/.opgraph-....tmp' (no such file)."""
    exe = shutil.which("opgraph-bench", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "opgraph.benchmarks.cli"]
    proc = subprocess.run(cmd + ["--model", "L5", "--summary", "--format", "json", "--output", "/dev/stdout"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["models"][0]["model"] == "L5"


@pytest.mark.parametrize("redirect", [">", ">>"])
def test_output_dev_stdout_into_a_shell_redirect_keeps_the_shell_file(tmp_path, redirect):
    """``--output /dev/stdout > run.json``: /dev/stdout resolves to run.json,
    which the atomic write replaced by a rename (``>>`` lost what the file
    held; the per-column JSON rewrites replaced it each time). It is written
    into the shell's descriptor, once: the file the shell opened holds the
    earlier line, then one complete document."""
    import shlex

    exe = shutil.which("opgraph-bench", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "opgraph.benchmarks.cli"]
    out = tmp_path / "run.json"
    args = cmd + ["--model", "L5", "--batch", "1", "--device", "cpu", "--lowering", "gemm,direct", "--warmup",
                  "0", "--repeat", "1", "--no-per-layer", "--no-check", "--quiet", "--format", "json",
                  "--output", "/dev/stdout"]
    out.write_text("earlier\n")
    inode = os.stat(out).st_ino
    proc = subprocess.run(["sh", "-c", f"{shlex.join(args)} {redirect} {shlex.quote(str(out))}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    head = "earlier\n" if redirect == ">>" else ""
    assert text.startswith(head)
    assert [r["lowering"] for r in json.loads(text[len(head):])["results"]] == ["gemm", "direct"]  # one document
    assert os.stat(out).st_ino == inode  # the shell's file, not a new one renamed over it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_progress_line_labels_its_seconds(capsys):
    import re

    status, out, err = run_cli(capsys, *[a for a in FAST if a != "--quiet"], "--format", "json")
    assert status == 0, err
    progress = [line for line in err.splitlines() if not line.startswith("# ")]  # the notes come first
    assert re.fullmatch(r"\[1/1\] L4 fp32 direct: ok total \d+\.\d\d ms \(\d+ s elapsed\)", progress[0]), err


def test_policy_and_workspace_errors_are_usage_errors(tmp_path, capsys):
    status, _, err = run_cli(capsys, "--model", "L5", "--workspace-limit", "lots")
    assert status == 2 and "--workspace-limit" in err and "'lots'" in err
    status, _, err = run_cli(capsys, "--model", "L5", "--workspace-tolerance", "3")
    assert status == 2 and "--workspace-tolerance" in err and "'3'" in err
    status, _, err = run_cli(capsys, "--model", "L5", "--policy", str(tmp_path / "none.toml"))
    assert status == 2 and "none.toml" in err
    status, _, err = run_cli(capsys, "--model", "L5", "--summary", "--format", "markdown")
    assert status == 2 and "--summary" in err


@pytest.mark.parametrize("value", ["1e400", "inf", "nan", "1.2.3MiB", ".."])
def test_malformed_workspace_limit_flag_exits_2_naming_it(capsys, value):
    status, out, err = run_cli(capsys, "--model", "L5", "--workspace-limit", value)
    assert status == 2 and "--workspace-limit" in err and repr(value) in err
    assert "Traceback" not in err and out == ""


def test_infinite_workspace_limit_in_a_policy_file_exits_2_naming_file_and_key(capsys, tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("workspace_limit = inf\n")
    status, _, err = run_cli(capsys, "--model", "L5", "--policy", str(path))
    assert status == 2 and str(path) in err and "workspace_limit=inf" in err


def test_corrupt_onnx_file_is_a_clear_error(tmp_path, capsys):
    pytest.importorskip("onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 this is not protobuf \xff\xff\xff")
    status, _, err = run_cli(capsys, "--onnx", str(bad), "--summary")
    assert status == 1 and "bad.onnx" in err and "not a valid ONNX model" in err


@pytest.mark.parametrize("mode", [["--summary"], ["--profile", "--device", "cpu"], ["--device", "cpu"]])
def test_a_missing_onnx_file_is_named_before_the_onnx_package_is_asked_for(tmp_path, capsys, monkeypatch,
                                                                            mode):
    """Fresh-user report: ``--onnx PATH`` with no such file said that the onnx
    package was missing (where it was), or that the file 'cannot be read'. The
    path is checked first, in every mode, as a usage error (exit status 2)."""
    monkeypatch.setitem(sys.modules, "onnx", None)  # ``import onnx`` raises ImportError
    missing = tmp_path / "nope.onnx"
    status, _, err = run_cli(capsys, "--onnx", str(missing), *mode)
    assert (status, err) == (2, f"opgraph-bench: error: --onnx: no such file: {missing}\n")
    status, _, err = run_cli(capsys, "--onnx", str(tmp_path), *mode)
    assert (status, err) == (2, f"opgraph-bench: error: --onnx: not a file but a folder: {tmp_path}\n")


def test_empty_onnx_file_names_the_file(tmp_path, capsys):
    """Issue 17: an empty file said 'the model imports no opset of the default ONNX domain'."""
    pytest.importorskip("onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    status, _, err = run_cli(capsys, "--onnx", str(empty), "--summary")
    assert status == 1 and "empty.onnx" in err and "is empty (0 bytes)" in err and "opset" not in err


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_applies_to_onnx_models(tmp_path, capsys, dtype):
    """--dtype was silently ignored for an ONNX model (the record said float32)."""
    path = _tiny_onnx(tmp_path / "tiny.onnx")
    status, out, _ = run_cli(capsys, "--onnx", str(path), "--dtype", dtype, "--summary", "--format", "json")
    assert status == 0 and json.loads(out)["models"][0]["dtype"] == dtype
    status, out, _ = run_cli(capsys, "--onnx", str(path), "--dtype", dtype, "--device", "cpu", "--batch", "1",
                             "--warmup", "0", "--repeat", "1", "--no-per-layer", "--format", "json")
    doc = json.loads(out)
    assert status == 0 and doc["models"][0]["dtype"] == dtype
    assert all(r["dtype"] == dtype and r["status"] == "ok" for r in doc["results"])


def test_onnx_input_names_the_image(tmp_path, capsys):
    path = _tiny_onnx(tmp_path / "tiny.onnx")
    status, out, _ = run_cli(capsys, "--onnx", str(path), "--onnx-input", "x", "--summary", "--format", "json")
    assert status == 0 and json.loads(out)["models"][0]["batch"] == 1
    status, _, err = run_cli(capsys, "--onnx", str(path), "--onnx-input", "image", "--summary")
    assert status == 2 and "--onnx-input image" in err and "its graph inputs are x" in err
    status, _, err = run_cli(capsys, "--model", "L4", "--onnx-input", "x", "--summary")
    assert status == 2 and "--onnx-input x" in err and "no --onnx file" in err


def test_weightless_onnx_model_is_timed_with_drawn_parameters(tmp_path, capsys):
    """A weightless export (parameters as graph inputs, as issue 15's files): imported
    with its first input as the image, parameters drawn like the built-in models'."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Identity", ["zero"], ["c1.bias"]), helper.make_node("Identity", ["zero"], ["c2.bias"]),
             helper.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["a", "lo", "hi"], ["r"]),
             helper.make_node("Conv", ["r", "c2.weight", "c2.bias"], ["y"], pads=[1, 1, 1, 1])]
    info = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "weightless", [info("x", TensorProto.FLOAT, ["N", 3, 8, 8]),
                                                info("c1.weight", TensorProto.FLOAT, [4, 3, 3, 3]),
                                                info("c2.weight", TensorProto.FLOAT, [4, 4, 3, 3]),
                                                info("zero", TensorProto.FLOAT, [4])],
                          [info("y", TensorProto.FLOAT, ["N", 4, 8, 8])],
                          [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
                           helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])])
    path = tmp_path / "weightless.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    status, out, _ = run_cli(capsys, "--onnx", str(path), "--device", "cpu", "--warmup", "0",
                             "--repeat", "1", "--format", "json")
    doc = json.loads(out)
    assert status == 0 and doc["models"][0]["params"] == 2 * 4 + 4 * 27 + 4 * 36  # one bias per conv
    assert "weightless: batch 1, the file's (a symbolic batch builds 1; set with --batch)" in doc["notes"]
    assert all(r["status"] == "ok" and r["check"]["passed"] for r in doc["results"])


FAST = ("--model", "L4", "--batch", "1", "--device", "cpu", "--lowering", "direct", "--warmup", "0",
        "--repeat", "1", "--no-per-layer", "--no-check", "--quiet")


def test_nhwc_on_the_cpu_records_the_layout_applied(capsys):
    status, out, err = run_cli(capsys, *FAST, "--layout", "nhwc", "--format", "json")
    assert status == 0, err
    doc = json.loads(out)
    env, (r,) = doc["environment"], doc["results"]
    assert (env["layout"], env["layout_requested"]) == ("NCHW", "NHWC")
    assert (r["layout"], r["layout_requested"]) == ("NCHW", "NHWC")
    assert "layout: NHWC requested but ignored on cpu: the CPU kernels are written for NCHW" in r["notes"]


@pytest.mark.parametrize("flags,precision,layout", [
    ((), "tf32", "NHWC"),                                      # the file's values are used
    (("--precision", "fp32", "--layout", "nchw"), "fp32", "NCHW"),  # flags win over the file
])
def test_policy_file_precision_and_layout_apply_unless_flags_are_given(capsys, tmp_path, flags,
                                                                        precision, layout):
    path = tmp_path / "policy.toml"
    path.write_text('precision = "tf32"\nlayout = "NHWC"\n')
    status, out, err = run_cli(capsys, *FAST, "--policy", str(path), "--format", "json", *flags)
    assert status == 0, err
    doc = json.loads(out)
    env, (r,) = doc["environment"], doc["results"]
    assert env["precision"] == [precision] and r["precision"] == precision
    assert env["policy"]["precision"] == precision and env["policy"]["layout"] == layout
    assert env["layout_requested"] == r["layout_requested"] == layout and r["layout"] == "NCHW"


@pytest.mark.parametrize("bad,message", [
    (["--seed", "-1"], "argument --seed: -1 is below the minimum 0"),
    (["--time-limit", "-5"], "argument --time-limit: -5 is not a time of zero or more seconds"),
    (["--time-limit", "nan"], "argument --time-limit: nan is not a time of zero or more seconds"),
    (["--time-limit", "soon"], "argument --time-limit: 'soon' is not a number of seconds"),
])
def test_bad_seed_and_time_limit_are_usage_errors_naming_the_flag(capsys, bad, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["--model", "L5", *bad])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"opgraph-bench: error: {message}"


def test_summary_with_plot_is_a_usage_error(capsys, tmp_path):
    status, out, err = run_cli(capsys, "--model", "L5", "--summary", "--plot", str(tmp_path / "s.png"))
    assert status == 2 and out == ""
    assert err == ("opgraph-bench: error: --plot charts timing runs; --summary runs nothing: "
                   "drop --summary or --plot\n")
    assert not (tmp_path / "s.png").exists()


def test_warnings_print_as_one_line_in_the_cli_only(capsys, tmp_path):
    import warnings

    path = tmp_path / "policy.toml"
    path.write_text('[force]\nL4 = "direct"\nconv99 = "fft"\n')  # conv99 alone is a usage error
    before = warnings.showwarning
    status, _, err = run_cli(capsys, *FAST, "--policy", str(path), "--format", "json")
    assert status == 0
    assert err == "opgraph-bench: warning: policy.force key 'conv99' matches no node of graph 'L4'\n"
    assert warnings.showwarning is before  # library users keep the usual format


def test_cuda_graph_needs_a_gpu(capsys):
    assert cli.main(["--model", "L4", "--device", "cpu", "--cuda-graph"]) == 2
    assert "--cuda-graph replays CUDA graphs: it needs --device cuda" in capsys.readouterr().err


def test_cuda_graph_with_summary_and_a_plot_format_matplotlib_lacks_are_usage_errors(capsys, tmp_path):
    assert cli.main(["--model", "L4", "--summary", "--cuda-graph"]) == 2
    assert "--cuda-graph replays timing runs; --summary runs nothing" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert cli.main(["--model", "L4", "--device", "cpu", "--plot", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert "matplotlib cannot write txt" in err and "png" in err


def _settings_of_a_run(monkeypatch, device, argv):
    """The driver Settings ``opgraph-bench argv`` builds on ``device`` (nothing runs)."""
    seen = {}
    monkeypatch.setattr(driver, "resolve_device", lambda d: (device, "stubbed for the test"))
    monkeypatch.setattr(cli, "check_applicable", lambda *a: None)

    def run_benchmark(tgs, settings, **kw):
        seen["settings"], seen["notes"] = settings, kw.get("notes")
        return {}

    monkeypatch.setattr(driver, "run_benchmark", run_benchmark)
    cli.run_timing(["L1"], cli.build_parser().parse_args(argv))
    return seen["settings"], seen["notes"]


def test_the_default_gpu_run_replays_auto_as_cuda_graphs(monkeypatch):
    s, notes = _settings_of_a_run(monkeypatch, "cuda", ["--model", "L1", "--quiet"])
    assert s.cuda_graph == ("auto",) and s.graphed("auto") and not s.graphed("cudnn")
    assert any("auto+graph" in n for n in notes)
    assert driver.unit_count([object()], s) == len(s.lowerings) + 1
    assert s.protocol("cuda events")["cuda_graph"] == ["auto"]
    # --cuda-graph: every lowering; an explicit --lowering: only what was asked
    s, _ = _settings_of_a_run(monkeypatch, "cuda", ["--model", "L1", "--cuda-graph", "--quiet"])
    assert s.cuda_graph is True and all(s.graphed(lo.name) for lo in s.lowerings)
    s, _ = _settings_of_a_run(monkeypatch, "cuda", ["--model", "L1", "--lowering", "auto", "--quiet"])
    assert s.cuda_graph is False and not s.graphed("auto")


def test_the_default_cpu_run_has_no_graph_column(monkeypatch):
    s, _ = _settings_of_a_run(monkeypatch, "cpu", ["--model", "L1", "--quiet"])
    assert s.cuda_graph is False and driver.unit_count([object()], s) == len(s.lowerings)


@pytest.mark.parametrize("name, fmt", [("run.json", "json"), ("run.CSV", "csv"), ("run.md", "markdown"),
                                       ("run.txt", "table"), (None, "table")])
def test_the_output_suffix_names_the_format_unless_format_is_given(name, fmt):
    """``--output run.json`` wrote a rich table into a .json file (fresh-user run)."""
    from opgraph.benchmarks.arguments import build_parser, output_format
    argv = ["--output", name] if name else []
    assert output_format(build_parser().parse_args(argv)) == fmt
    assert output_format(build_parser().parse_args(argv + ["--format", "csv"])) == "csv"


def test_an_unknown_include_or_exclude_name_says_which_flag_gave_it(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('exclude = ["bn-apply-rematt"]\n')
    status, _, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--policy", str(bad))
    assert status == 2 and f"--policy {bad}: exclude='bn-apply-rematt'" in err, err
    with pytest.raises(SystemExit) as e:  # refused as the flag is parsed: an argparse error
        cli.main(["--model", "L5", "--batch", "1", "--lowering", "gemm,exclude=bn-apply-rematt"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --lowering: exclude='bn-apply-rematt'" in err, err


def test_policy_items_beside_a_column_are_said_in_the_output(capsys):
    """``--lowering gemm,exclude=bn-stats-parts`` names its column ``gemm``; the
    exclude shapes it too, so the run says so (text and JSON notes): two runs
    with and without it no longer read the same."""
    status, out, err = run_cli(capsys, "--model", "L4", "--batch", "1", "--repeat", "1", "--warmup", "0",
                               "--no-per-layer", "--lowering", "gemm,exclude=bn-stats-parts")
    assert status == 0, err
    assert "--lowering policy items exclude=bn-stats-parts: applied to every column" in out
    status, out, err = run_cli(capsys, "--model", "L4", "--batch", "1", "--repeat", "1", "--warmup", "0",
                               "--no-per-layer", "--lowering", "gemm")
    assert status == 0 and "policy items" not in out


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_an_include_with_no_effect_is_said_in_the_runs_notes(capsys, tmp_path, fmt):
    """``include=pool-scan`` (a rule that runs by default since 2026-12-05) was
    noted only in each compile's report, which no record repeats; beside
    ``exclude=fused`` it was refused, though it does nothing there either."""
    status, out, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--device", "cpu", "--repeat", "1",
                               "--warmup", "0", "--no-per-layer", "--no-check", "--quiet", "--format", fmt,
                               "--lowering", "gemm,include=pool-scan,exclude=fused")
    assert status == 0, err
    said = ("policy include ['pool-scan']: no effect: include turns on only the lowering rules tagged 'optional', "
            "the fusion rules not yet run on a GPU (ln-backward-sums) by their names, "
            "and, by the name 'fused-reference', the fusion rules on the CPU's oracle kernels")
    notes = json.loads(out)["notes"] if fmt == "json" else out.splitlines()
    (note,) = [n for n in notes if said in n]
    assert note.endswith("; exclude=['fused'] turns pool-scan off")
