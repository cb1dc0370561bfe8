"""``opgraph-bench`` when a run goes wrong or is steered by hand: Ctrl-C, a
time limit, a failing column, --no-per-layer, policy items and forced nodes
on --lowering."""

from __future__ import annotations

import csv
import io
import json
import signal
import subprocess
import sys

import pytest

from opgraph.benchmarks import cli, driver

FAST = ("--batch", "1", "--device", "cpu", "--warmup", "0", "--repeat", "1")


def run_cli(capsys, *args):
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def _interrupt_second_column(monkeypatch):
    real, calls = driver.run_lowering, []

    def run(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(driver, "run_lowering", run)


def test_ctrl_c_writes_the_finished_columns_and_says_where(capsys, monkeypatch, tmp_path):
    _interrupt_second_column(monkeypatch)
    path = tmp_path / "run.json"
    status, out, err = run_cli(capsys, "--model", "L5", *FAST, "--lowering", "direct,gemm", "--no-check",
                               "--no-per-layer", "--format", "json", "--output", str(path), "--quiet")
    assert status == cli.EXIT_INTERRUPTED == 130 and out == ""
    assert err == f"opgraph-bench: interrupted; the 1 finished column(s) were written to {path}\n"
    doc = json.loads(path.read_text())
    assert [(r["lowering"], r["status"]) for r in doc["results"]] == [("direct", "ok")]
    assert any("interrupted (Ctrl-C) after 1 column(s)" in n for n in doc["notes"])


def test_ctrl_c_without_output_prints_the_finished_columns(capsys, monkeypatch):
    _interrupt_second_column(monkeypatch)
    status, out, err = run_cli(capsys, "--model", "L5", *FAST, "--lowering", "direct,gemm", "--no-check",
                               "--no-per-layer", "--format", "csv", "--quiet")
    assert status == 130 and err.endswith("were written to standard output\n") and err.count("\n") == 1
    assert [r["lowering"] for r in csv.DictReader(io.StringIO(out))] == ["direct"]


def test_ctrl_c_before_any_column(capsys, monkeypatch):
    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_models", interrupt)
    status, out, err = run_cli(capsys, "--model", "L5", *FAST, "--quiet")
    assert status == 130 and out == ""
    assert err == "opgraph-bench: interrupted before any column finished; nothing was written\n"


#: The console script's ``main``, with SIGINT handled as a terminal's Ctrl-C finds it: a
#: process started with SIGINT ignored (pytest run as a background job of a non-interactive
#: shell, ``(trap '' INT; pytest ...)``) passes that on, Python then installs no handler,
#: and the signal went unnoticed: the run timed all 900 calls and the test failed ~8 min later.
SIGINT_CHILD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "from opgraph.benchmarks.cli import main; sys.exit(main())")


def test_a_real_sigint_ends_the_console_script_in_one_line(tmp_path):
    """SIGINT, as a terminal's Ctrl-C sends it, after the first column: no traceback.
    The columns are long (300 calls) so that a loaded machine, where this
    process reads the progress line late, still signals before the run ends
    (with 30 calls a CI run once finished all three columns first). The child
    handles SIGINT as Python does by default even where this process ignores
    it (:data:`SIGINT_CHILD`), and a child that does not end is a failure
    after 120 s, not after its 900 calls."""
    path = tmp_path / "run.json"
    cmd = [sys.executable, "-c", SIGINT_CHILD,
           "--model", "L5", *FAST[:-2], "--repeat", "300", "--lowering", "gemm,direct,fft", "--no-check",
           "--no-per-layer", "--format", "json", "--output", str(path)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # one progress line per finished column (not a terminal)
            if line.startswith("[1/3]"):
                break
        proc.send_signal(signal.SIGINT)
        try:
            out, rest = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("the run went on for 120 s after SIGINT")
        status = proc.returncode
    finally:
        proc.kill()
        proc.wait()
    assert status == 130 and "Traceback" not in rest and out == ""
    assert rest.startswith("opgraph-bench: interrupted; the ") and rest.count("\n") == 1
    assert f"were written to {path}" in rest
    assert json.loads(path.read_text())["results"][0]["status"] == "ok"


def test_no_per_layer_writes_no_per_layer_csv_rows(capsys):
    status, out, _ = run_cli(capsys, "--model", "L4", *FAST, "--lowering", "direct", "--no-check",
                             "--no-per-layer", "--format", "csv", "--quiet")
    assert status == 0
    assert [r["layer"] for r in csv.DictReader(io.StringIO(out))] == ["(total)"]


def test_an_error_record_carries_type_message_and_innermost_frames(capsys, monkeypatch):
    from opgraph.benchmarks import protocol

    def broken(self, repeat):
        return ().__getitem__(1)  # IndexError: tuple index out of range, as seen on DenseNet-121

    monkeypatch.setattr(protocol.PhaseRunner, "time_phases", broken)
    status, out, err = run_cli(capsys, "--model", "L5", *FAST, "--lowering", "direct", "--no-check",
                               "--format", "json")
    assert status == 3
    (r,) = json.loads(out)["results"]
    e = r["error"]
    assert e["type"] == "IndexError" and e["message"] == "tuple index out of range"
    assert e["frames"][-1].startswith("tests/benchmarks/test_cli_reliability.py:") and \
        e["frames"][-1].endswith(" in broken")
    assert any("benchmarks/driver.py:" in f and "in run_lowering" in f for f in e["frames"])
    assert r["reason"] == f"IndexError: tuple index out of range (at {e['frames'][-1]})"
    # the log shows every frame, one per line
    log = err[err.index("[1/1] L5 fp32 direct: error"):]
    assert all(f"\n    at {f}" in log for f in e["frames"])


@pytest.mark.parametrize("per_layer", [True, False])
def test_a_forced_node_shows_in_table_json_and_csv(capsys, tmp_path, per_layer):
    flags = () if per_layer else ("--no-per-layer",)
    status, out, err = run_cli(capsys, "--model", "L4", *FAST, "--lowering", "gemm,@L4=direct",
                               "--no-check", "--quiet", *flags)
    assert status == 0, err
    assert "gemm ‡" in out
    assert ("‡ L4 / gemm: 3 node(s) forced by the policy: direct: L4, "
            "L4.grad/conv2d_backward_data, L4.grad/conv2d_backward_filter") in out
    assert "no reason recorded" not in out
    if per_layer:
        assert "‡ L4 backward_filter under gemm: forced to direct by the policy" in out
    path = tmp_path / "run.json"
    run_cli(capsys, "--model", "L4", *FAST, "--lowering", "gemm,@L4:forward=direct", "--no-check",
            "--quiet", "--format", "json", "--output", str(path), *flags)
    (r,) = json.loads(path.read_text())["results"]
    assert r["forced"] == {"L4": "direct"} and r["not_applicable"] == {}
    (row,) = r["layers"]
    assert row["forced"] == {"forward": "direct"} and row["algorithm"]["backward_data"] == "gemm"
    path = path.with_suffix(".csv")  # CSV into run.json is refused (usage.check_suffixes)
    run_cli(capsys, "--model", "L4", *FAST, "--lowering", "gemm,@L4:forward=direct", "--no-check",
            "--quiet", "--format", "csv", "--output", str(path), *flags)
    total = next(csv.DictReader(io.StringIO(path.read_text())))
    assert total["layer"] == "(total)" and total["forced"] == "L4=direct"


def test_a_force_that_matches_no_node_of_a_model_is_not_an_ok_column_there(capsys):
    """``@L5=direct`` on L4 and L5 forced nothing in L4: L4's column is n/a and
    says why, rather than an ``ok`` column of the fallback under the force's label."""
    status, out, err = run_cli(capsys, "--model", "L4,L5", *FAST, "--lowering", "gemm,@L5=direct",
                               "--no-check", "--no-per-layer", "--format", "json", "--quiet")
    assert status == 0, err
    assert "warning: policy.force key 'L5' matches no node of graph 'L4'" in err
    l4, l5 = json.loads(out)["results"]
    assert (l4["model"], l4["status"]) == ("L4", "n/a"), l4
    assert l4["reason"] == ("gemm: its policy forces no node of L4: policy.force key 'L5' matches no node "
                            "of graph 'L4'")
    assert (l5["model"], l5["status"], l5["forced"]["L5"]) == ("L5", "ok", "direct"), l5


@pytest.mark.parametrize("mode", [(), ("--profile",)])
@pytest.mark.parametrize("item", ["@conv1=unfold", "@conv1:forward=cudnn"])
def test_a_force_of_an_algorithm_without_this_device_is_a_usage_error_before_any_work(
        capsys, monkeypatch, item, mode):
    """``@conv1=unfold`` on the CPU (unfold runs on cuda only) would fail every
    column's compile after the others were timed: exit 2 first, naming the item."""
    from opgraph.benchmarks import profile

    def timed(*a, **k):
        raise AssertionError("timing started")

    monkeypatch.setattr(driver, "run_benchmark", timed)
    monkeypatch.setattr(profile, "measure_limits", timed)
    status, out, err = run_cli(capsys, "--model", "alexnet", "--device", "cpu", *FAST, "--lowering",
                               f"gemm,{item}", *mode)
    assert (status, out) == (2, "")
    algorithm = item.partition("=")[2]
    assert err == (f"opgraph-bench: error: --lowering {item}: {algorithm!r} has no implementation on cpu "
                   "(it runs on cuda)\n")


@pytest.mark.parametrize("mode", [(), ("--profile",)])
@pytest.mark.parametrize("item", ["@conv99=fft", "@conv99:forward=fft", "@conv9*=fft"])
def test_a_force_that_names_no_node_of_any_model_is_a_usage_error_before_any_work(
        capsys, monkeypatch, item, mode):
    """A typo'd force (``@conv99=fft``: alexnet has conv1..conv5) would make
    every column the fallback's, n/a: exit 2 before anything is timed, naming
    the item, the models and some of their layers."""
    from opgraph.benchmarks import profile

    def timed(*a, **k):
        raise AssertionError("timing started")

    monkeypatch.setattr(driver, "run_benchmark", timed)
    monkeypatch.setattr(profile, "measure_limits", timed)
    status, out, err = run_cli(capsys, "--model", "alexnet,L4", *FAST, "--lowering", f"auto,{item}", *mode)
    assert (status, out) == (2, "")
    key = item[1:].partition("=")[0]
    assert err == (f"opgraph-bench: error: --lowering {item}: {key!r} names no node of the model(s) of this "
                   "run (alexnet, L4); convolution and linear layers: alexnet: conv1, conv2, conv3, conv4, "
                   "conv5, fc6, ... (8 in all); L4: L4 (a force key is a node name or pattern, a layer "
                   "optionally with :forward, :backward_data or :backward_filter; --summary lists each "
                   "model's layers)\n")


@pytest.mark.parametrize("word, meant", [("fwd", "forward"), ("dgrad", "backward_data"), ("wgrad", "backward_filter"),
                                         ("forwrd", "forward"), ("zzz", None)])
def test_a_layer_with_a_word_that_is_no_phase_says_which_phase_was_meant(capsys, monkeypatch, word, meant):
    """``@conv1:fwd=fft``: the layer exists, the word after it is no phase. The error says so and
    names the phase meant (the ops' direction codes fwd/dgrad/wgrad, or the closest phase name),
    instead of calling the whole key a name of no node; before anything is timed."""
    def timed(*a, **k):
        raise AssertionError("timing started")

    monkeypatch.setattr(driver, "run_benchmark", timed)
    item = f"@conv1:{word}=fft"
    if meant:  # a word close to a phase: the policy refuses it as the flag is parsed (a usage error)
        with pytest.raises(SystemExit) as stop:
            run_cli(capsys, "--model", "alexnet", *FAST, "--lowering", f"auto,{item}")
        out, err = capsys.readouterr()
        assert (stop.value.code, out) == (2, "") and err.startswith("usage: opgraph-bench")
        assert f"unknown direction {word!r} (did you mean {meant!r}?)" in err.splitlines()[-1]
        return
    status, out, err = run_cli(capsys, "--model", "alexnet", *FAST, "--lowering", f"auto,{item}")
    assert (status, out) == (2, "")
    assert err == (f"opgraph-bench: error: --lowering {item}: 'conv1' is a layer, but ':{word}' is not one of its "
                   f"phases (:forward, :backward_data, :backward_filter)\n")


@pytest.mark.parametrize("mode", [(), ("--profile",)])
@pytest.mark.parametrize("table, keys", [
    ('[force]\nconv99 = "fft"\n', "'conv99'"),
    ('[force]\n"conv9*:forward" = "fft"\nfc99 = "gemm"\n', "'conv9*:forward', 'fc99'"),
], ids=["one-key", "two-keys"])
def test_a_policy_file_none_of_whose_forces_names_a_node_is_a_usage_error_before_any_work(
        capsys, monkeypatch, tmp_path, table, keys, mode):
    """A --policy file whose every force key is a typo forced nothing: every
    column would be n/a and the run exit 0, the file silently ignored. Exit 2
    before anything is timed, naming the file, its keys, the models and some
    of their layers (the message of a --lowering force's typo)."""
    from opgraph.benchmarks import profile

    def timed(*a, **k):
        raise AssertionError("timing started")

    monkeypatch.setattr(driver, "run_benchmark", timed)
    monkeypatch.setattr(profile, "measure_limits", timed)
    path = tmp_path / "policy.toml"
    path.write_text(table)
    status, out, err = run_cli(capsys, "--model", "alexnet,L4", *FAST, "--lowering", "gemm", "--policy", str(path),
                               *mode)
    assert (status, out) == (2, "")
    assert err == (f"opgraph-bench: error: --policy {path}: its force key(s) {keys} name no node of the model(s) "
                   "of this run (alexnet, L4); convolution and linear layers: alexnet: conv1, conv2, conv3, "
                   "conv4, conv5, fc6, ... (8 in all); L4: L4 (a force key is a node name or pattern, a layer "
                   "optionally with :forward, :backward_data or :backward_filter; --summary lists each "
                   "model's layers)\n")


def test_a_policy_file_force_that_names_a_node_of_some_models_or_beside_a_typo_still_runs(capsys, tmp_path):
    """A policy file may serve several models: a key naming L4 only forces L4
    (L5's column n/a, saying why), and a typo beside it stays a warning per
    graph, exit 0, as before."""
    path = tmp_path / "policy.toml"
    path.write_text('[force]\nL4 = "direct"\nconv99 = "fft"\n')
    status, out, err = run_cli(capsys, "--model", "L4,L5", *FAST, "--lowering", "gemm", "--policy", str(path),
                               "--no-check", "--no-per-layer", "--format", "json", "--quiet")
    assert status == 0, err
    assert err.splitlines() == ["opgraph-bench: warning: policy.force key 'conv99' matches no node of graph 'L4'",
                                "opgraph-bench: warning: policy.force key 'L4' matches no node of graph 'L5'",
                                "opgraph-bench: warning: policy.force key 'conv99' matches no node of graph 'L5'"]
    l4, l5 = json.loads(out)["results"]
    assert (l4["model"], l4["status"], l4["forced"]["L4"]) == ("L4", "ok", "direct"), l4
    assert (l5["model"], l5["status"]) == ("L5", "n/a"), l5
    assert l5["reason"].startswith("gemm: its policy forces no node of L5: policy.force key 'L4' matches no node")


def test_policy_items_alone_make_one_column_named_by_them(capsys):
    status, out, err = run_cli(capsys, "--model", "L4", *FAST, "--lowering", "conv=direct+gemm",
                               "--no-check", "--no-per-layer", "--format", "json", "--quiet")
    assert status == 0, err
    doc = json.loads(out)
    (r,) = doc["results"]
    assert r["lowering"] == "conv=direct+gemm" and r["status"] == "ok"
    assert {op: set(a) for op, a in r["algorithms"].items()} == {
        "Conv2d": {"direct"}, "Conv2dBackwardData": {"direct"}, "Conv2dBackwardFilter": {"direct"}}
    assert doc["environment"]["policy"]["prefer"] == {"conv": ["direct", "gemm"]}


def test_a_bad_policy_item_is_a_usage_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--model", "L5", "--lowering", "conv=fft+gemmm"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--lowering" in err and "unknown algorithm 'gemmm'" in err


def test_help_formats_every_flag(capsys):
    """argparse %-formats help strings: a bare % in one (5% of the median) broke --help."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--repeat N|auto" in out and "--trace PATH.json" in out and "5% of" in out


@pytest.mark.parametrize("flags,named", [
    (["--engine-limit", "3"], "--engine-limit only steers autotune"),
    (["--workspace-tolerance", "0"], "--workspace-tolerance only steers autotune"),
    (["--engine-limit", "all", "--workspace-tolerance", "5%"], "--engine-limit and --workspace-tolerance only steer"),
    (["--peak-tolerance", "0"], "--peak-tolerance only steers autotune"),
])
@pytest.mark.parametrize("mode", [[], ["--profile"]])
def test_autotune_flags_without_an_autotuned_column_are_a_usage_error(capsys, flags, named, mode):
    """A flag that cannot apply is exit 2 saying why, never silently ignored."""
    status, out, err = run_cli(capsys, "--model", "L5", "--device", "cpu", "--lowering", "gemm", *mode, *flags)
    assert status == 2 and out == ""
    assert named in err and "no column autotunes (lowerings: gemm)" in err


def test_autotune_flags_with_an_autotuned_column_are_taken(capsys, tmp_path):
    status, out, err = run_cli(capsys, "--model", "L5", "--device", "cpu", "--batch", "2", "--lowering", "auto",
                               "--engine-limit", "3", "--peak-tolerance", "5%", "--warmup", "0", "--repeat", "1",
                               "--no-per-layer", "--format", "json")
    assert status == 0, err
    policy = json.loads(out)["environment"]["policy"]
    assert policy["engine_limit"] == 3 and policy["peak_tolerance"] == 0.05


def test_a_gpu_only_layout_on_the_cpu_is_said_not_silently_dropped(capsys):
    """``--layout nhwc`` on the CPU runs NCHW (the layout pass stores NHWC on cuda
    only): the run says so in its notes, not only in the environment table."""
    status, out, err = run_cli(capsys, "--model", "L4", *FAST, "--lowering", "gemm", "--layout", "nhwc",
                               "--no-check", "--no-per-layer", "--format", "json", "--quiet")
    assert status == 0, err
    notes = json.loads(out)["notes"]
    assert "--layout nhwc: the layout pass stores NHWC on cuda only; cpu runs NCHW" in notes, notes


def _column_notes(capsys, *flags):
    """The notes of the one L5 column that ``flags`` run (JSON)."""
    status, out, err = run_cli(capsys, "--model", "L5", *FAST, *flags, "--no-check", "--no-per-layer",
                               "--format", "json", "--quiet")
    assert status == 0, err
    (rec,) = json.loads(out)["results"]
    return rec["notes"]


@pytest.mark.parametrize("text, said", [
    # peak_tolerance with no autotuned column has no effect: said, not shown as if applied
    ("peak_tolerance = 0.5\n", "policy peak_tolerance=0.5: only autotune reads it"),
    # a column named gemm that autotunes (a fresh-user helper saw it run direct without a word)
    ("autotune = true\n", "gemm: the policy's autotune = true times every candidate, gemm first"),
])
def test_what_a_policy_file_does_to_a_named_column_is_in_its_notes(capsys, tmp_path, text, said):
    path = tmp_path / "p.toml"
    path.write_text(text)
    notes = _column_notes(capsys, "--lowering", "gemm", "--policy", str(path))
    assert any(n.startswith(said) for n in notes), notes
    assert not any(n.startswith(said) for n in _column_notes(capsys, "--lowering", "gemm"))
