"""What each mode of ``opgraph-bench`` takes: a bad value of a policy flag is
exit 2 naming the flag and the value in every mode; a flag the mode cannot
use is exit 2 naming it and saying why (never silently ignored); the output
format follows --format, else --output's suffix, and a format the mode
cannot write is explained in the terms the user typed."""

from __future__ import annotations

import json

import pytest

from opgraph.benchmarks import cli

MODES = {"benchmark": [], "summary": ["--summary"], "profile": ["--profile"]}


def run_cli(capsys, *args):
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flag, value, why", [
    ("--engine-limit", "0", "must be a whole number >= 1"), ("--engine-limit", "-3", "must be a whole number >= 1"),
    ("--engine-limit", "abc", "must be a whole number >= 1"),
    ("--workspace-tolerance", "3", "must be a fraction from 0 to 1"), ("--workspace-limit", "lots", "must be bytes"),
    ("--peak-tolerance", "10", "must be a fraction from 0 to 1"),
    ("--peak-tolerance", "150%", "must be a fraction from 0 to 1")])
def test_a_bad_policy_flag_value_is_a_usage_error_in_every_mode(capsys, mode, flag, value, why):
    status, out, err = run_cli(capsys, "--model", "L5", "--device", "cpu", "--lowering", "auto", *MODES[mode],
                               flag, value)
    assert status == 2 and out == ""
    assert err.startswith(f"opgraph-bench: error: parameter {flag}: ") and f"={value!r}: {why}" in err, err


PROFILE = ("--profile", "--model", "L5", "--batch", "1", "--device", "cpu", "--warmup", "0", "--repeat", "1",
           "--quiet")


@pytest.mark.parametrize("flags, why", [
    (["--no-check"], "--no-check skips the float64 reference check; --profile checks no output"),
    (["--no-per-layer"], "--no-per-layer skips timing each layer alone; --profile always times each step alone"),
    (["--time-limit", "60"], "--time-limit stops a timing run from starting new columns; --profile has no time limit"),
    (["--trace", "{tmp}/t.json"], "--trace records a timed step; --profile writes no trace"),
    (["--cuda-graph"], "--cuda-graph replays timing runs; --profile has no +graph columns"),
    (["--compare", "torch"], "--compare times PyTorch peers beside the columns; --profile profiles opgraph's steps"),
    (["--plot", "{tmp}/p.png"], "--plot charts timing runs; --profile draws no chart")])
def test_profile_refuses_the_flags_it_does_not_use(capsys, tmp_path, quick_limits, flags, why):
    flags = [f.format(tmp=tmp_path) for f in flags]
    status, out, err = run_cli(capsys, *PROFILE, *flags)
    assert status == 2 and out == "" and not list(tmp_path.iterdir())
    assert err.startswith(f"opgraph-bench: error: {why}") and err.endswith(f": drop --profile or {flags[0]}\n"), err


def test_profile_refuses_repeat_auto_it_would_read_as_a_count(capsys, quick_limits):
    status, out, err = run_cli(capsys, *PROFILE[:-3], "--repeat", "auto", "--quiet")
    assert status == 2 and out == ""
    assert "--repeat auto repeats a benchmark's timed loops" in err and "give --repeat a count" in err


@pytest.mark.parametrize("flags", [
    ["--device", "cpu"], ["--lowering", "gemm"], ["--lowering", "exclude=winograd"], ["--precision", "tf32"],
    ["--layout", "nhwc"], ["--policy", "{tmp}/p.toml"], ["--workspace-limit", "1MiB"],
    ["--workspace-tolerance", "0.1"], ["--peak-tolerance", "5%"], ["--engine-limit", "3"], ["--compare", "torch"],
    ["--warmup", "1"], ["--repeat", "2"], ["--no-per-layer"], ["--no-check"], ["--time-limit", "5"], ["--seed", "1"],
    ["--quiet"]])
def test_summary_refuses_every_flag_that_steers_a_run(capsys, tmp_path, flags):
    (tmp_path / "p.toml").write_text('precision = "tf32"\n')
    flags = [f.format(tmp=tmp_path) for f in flags]
    status, out, err = run_cli(capsys, "--model", "L5", "--summary", *flags)
    assert status == 2 and out == ""
    assert err.startswith(f"opgraph-bench: error: {flags[0]} ") and "; --summary runs nothing: drop --summary or " \
        f"{flags[0]}\n" in err, err


def test_a_flag_at_its_default_is_not_refused(capsys):
    """Only what the user changed is refused: --device auto and --seed 0 are the defaults."""
    status, out, err = run_cli(capsys, "--model", "L5", "--summary", "--device", "auto", "--seed", "0",
                               "--format", "json")
    assert status == 0 and '"mode": "summary"' in out, err


def test_profile_writes_markdown_to_an_md_output(capsys, tmp_path, quick_limits):
    """The suffix picks the format, as for a benchmark: --output p.md is
    Markdown, one pipe table per model (the rows of the JSON document's by_op)."""
    md, js = tmp_path / "p.md", tmp_path / "p.json"
    status, out, err = run_cli(capsys, *PROFILE, "--output", str(md), "--json", str(js))
    assert status == 0 and out == "", err
    (rec,) = json.loads(js.read_text())["models"]
    lines = md.read_text().splitlines()
    assert lines[0].startswith("- device: cpu")
    (heading,) = [l for l in lines if l.startswith("### ")]
    assert heading.startswith("### layer L5") and "lowering gemm" in heading
    header = lines.index("| op | direction | steps | algorithms | ms | % of nodes | MB moved | GFLOP | GB/s | "
                         "TFLOP/s | % of limit | limit |")
    rows = [l.split(" | ")[:3] for l in lines[header + 2:header + 2 + len(rec["by_op"])]]
    assert rows == [[f"| {r['op']}", r["direction"], str(r["count"])] for r in rec["by_op"]]


@pytest.mark.parametrize("mode, name, asks, writes", [
    ("--profile", "p.csv", "csv", "it writes table, json or markdown: end the file name in .json or .md"),
    ("--summary", "s.md", "markdown", "it writes table, json or csv: end the file name in .json or .csv")])
def test_a_format_the_output_suffix_picks_is_refused_in_the_users_terms(capsys, tmp_path, mode, name, asks,
                                                                       writes):
    path = tmp_path / name
    status, out, err = run_cli(capsys, *(PROFILE if mode == "--profile" else ("--model", "L5", "--summary")),
                               "--output", str(path))
    assert status == 2 and out == "" and not path.exists()
    assert err == (f"opgraph-bench: error: --output {path}: its {path.suffix} suffix asks for {asks}, which "
                   f"{mode} does not write; {writes}, or give --format\n")


def test_a_format_given_is_refused_as_given(capsys):
    status, _, err = run_cli(capsys, *PROFILE, "--format", "csv", "--output", "p.md")
    assert status == 2 and err == ("opgraph-bench: error: --format csv: --profile writes table, json or markdown; "
                                   "choose one of them\n")


@pytest.mark.parametrize("argv, said", [
    (["--format", "csv", "--output", "{tmp}/x.json"],
     "--output {tmp}/x.json: its .json suffix names json, but --format csv writes csv: end the file name in "
     ".csv, or give --format json"),
    (["--format", "table", "--output", "{tmp}/x.CSV"],
     "--output {tmp}/x.CSV: its .csv suffix names csv, but --format table writes table: end the file name in "
     ".txt, or give --format csv"),
    (["--json", "{tmp}/x.csv"],
     "--json {tmp}/x.csv: its .csv suffix names csv, but --json writes json: end the file name in .json, or "
     "give --output {tmp}/x.csv"),
    (["--json", "{tmp}/x.md", "--output", "{tmp}/y.json"],
     "--json {tmp}/x.md: its .md suffix names markdown, but --json writes json: end the file name in .json"),
])
def test_a_file_whose_suffix_names_another_format_is_refused(capsys, tmp_path, argv, said):
    """Fresh-user report: ``--format csv --output x.json`` wrote CSV into x.json without a word."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    status, out, err = run_cli(capsys, "--model", "L5", "--summary", *argv)
    assert status == 2 and out == "" and not list(tmp_path.iterdir())
    assert err == f"opgraph-bench: error: {said.replace('{tmp}', str(tmp_path))}\n"


@pytest.mark.parametrize("suffix, named", [(".csv", "csv"), (".MD", "markdown")])
def test_a_trace_whose_suffix_names_another_format_is_refused(capsys, tmp_path, suffix, named):
    """``--trace t.csv`` was taken (and JSON trace events written into it)
    while ``--json x.csv`` was refused (user report)."""
    path = tmp_path / f"t{suffix}"
    status, out, err = run_cli(capsys, "--model", "L5", "--batch", "1", "--trace", str(path))
    assert status == 2 and out == "" and not list(tmp_path.iterdir())
    assert err == (f"opgraph-bench: error: --trace {path}: its {suffix.lower()} suffix names {named}, but --trace "
                   "writes json (Chrome trace events): end the file name in .json\n")


@pytest.mark.parametrize("argv", [["--format", "csv", "--output", "{tmp}/x.txt"],   # no format's suffix
                                  ["--format", "csv", "--output", "{tmp}/x.csv"],
                                  ["--output", "{tmp}/x.json", "--json", "{tmp}/y.JSON"]])
def test_a_suffix_that_fits_or_names_no_format_is_written(capsys, tmp_path, argv):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    status, _, err = run_cli(capsys, "--model", "L5", "--summary", *argv)
    assert status == 0, err


def test_every_mode_writes_the_schema_version_readme_gives(capsys, tmp_path):
    """README said the --profile document is schema 2 while it wrote 3, and the
    --summary document had no schema_version at all (user report)."""
    import re
    from pathlib import Path

    from opgraph.benchmarks import driver, profile, report

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    said = {mode: int(re.search(pattern, readme).group(1)) for mode, pattern in (
        ("benchmark", r"JSON schema \(`schema_version` (\d+)\)"),
        ("profile", r'"mode": "profile", "schema_version":\s*(\d+)'),
        ("summary", r'"mode":\s*"summary", "schema_version": (\d+)'))}
    assert said == {"benchmark": driver.SCHEMA_VERSION, "profile": profile.PROFILE_SCHEMA_VERSION,
                    "summary": report.SUMMARY_SCHEMA_VERSION}
    status, out, err = run_cli(capsys, "--model", "L5", "--summary", "--format", "json")
    assert status == 0, err
    doc = json.loads(out)
    assert (doc["mode"], doc["schema_version"]) == ("summary", said["summary"])
    assert list(doc) == ["tool", "mode", "schema_version", "environment", "notes", "models"]
