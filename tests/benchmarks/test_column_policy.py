"""The policy each column compiles with is the one recorded with it: a
benchmark result's ``policy`` is its lowering's choice on top of the base
(``environment.policy``), and ``--profile`` compiles a ``--lowering`` spec,
policy items included, with exactly the policy its benchmark column would."""

from __future__ import annotations

import json

import pytest

from opgraph.benchmarks import cli, lowerings as lw
from opgraph.passes.policy import LoweringPolicy

FAST = ("--model", "L5", "--batch", "1", "--device", "cpu", "--warmup", "0", "--repeat", "1")


def run_cli(capsys, *args):
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def no_cache(monkeypatch):
    monkeypatch.setenv("OPGRAPH_CACHE", "off")  # autotune tunes afresh and writes no file


def test_each_column_records_the_policy_it_compiled_with(capsys, no_cache):
    status, out, err = run_cli(capsys, *FAST, "--no-check", "--no-per-layer", "--format", "json",
                               "--lowering", "gemm,auto,gemm@ws=16MiB,exclude=winograd", "--engine-limit", "3")
    assert status == 0, err
    doc = json.loads(out)
    base = doc["environment"]["policy"]  # the base: no column's choice in it
    assert base["autotune"] is False and "prefer" not in base and "workspace_limit" not in base
    ran = {r["lowering"]: r["policy"] for r in doc["results"]}
    assert ran["auto"]["autotune"] is True and ran["gemm"]["autotune"] is False
    assert ran["gemm"]["prefer"] == {"conv": ["gemm"]} and "workspace_limit" not in ran["gemm"]
    assert ran["gemm@ws=16MiB"]["workspace_limit"] == 16 << 20
    for policy in ran.values():  # the flags and policy items reach every column
        assert policy["exclude"] == ["winograd"] and policy["engine_limit"] == 3
    expected = LoweringPolicy.from_cli(lowering="exclude=winograd", engine_limit=3, precision="fp32")
    for name, policy in ran.items():
        assert policy == lw.parse_lowering(name).policy(expected, "cpu").to_dict(), name


@pytest.mark.parametrize("spec", ["gemm,@L5=direct", "conv=direct+gemm"])
def test_profile_compiles_with_the_policy_of_the_benchmark_column(capsys, tmp_path, quick_limits, spec):
    """Policy items of --lowering (a forced layer, a preference) reach the
    profile: its convolution steps run direct, not the CPU default gemm."""
    path = tmp_path / "profile.json"
    status, _, err = run_cli(capsys, *FAST, "--profile", "--lowering", spec, "--json", str(path), "--quiet")
    assert status == 0, err
    (profiled,) = json.loads(path.read_text())["models"]
    convs = [n for n in profiled["nodes"] if n["op"].startswith("Conv2d")]
    assert len(convs) == 3 and {n["algorithm"] for n in convs} == {"direct"}, convs  # fwd, dgrad, wgrad
    status, out, err = run_cli(capsys, *FAST, "--lowering", spec, "--no-check", "--no-per-layer", "--format", "json")
    assert status == 0, err
    (column,) = json.loads(out)["results"]
    assert profiled["lowering"] == column["lowering"] and profiled["policy"] == column["policy"]


def test_profile_refuses_a_lowering_that_runs_no_convolution_as_the_benchmark_does(capsys, quick_limits):
    """Winograd declines L1's 11x11 stride-4 convolution: profiling it would
    only profile the fallback under winograd's name."""
    for mode in ([], ["--profile"]):
        status, out, err = run_cli(capsys, "--model", "L1", "--batch", "1", "--device", "cpu", "--warmup", "0",
                                   "--repeat", "1", "--lowering", "winograd", *mode)
        assert status == 2 and out == "", err
        assert "lowering 'winograd' cannot run any convolution of the selected models on cpu" in err


POLICY = """
[prefer]
conv = ["fft", "gemm"]
"""


def test_a_policy_file_preference_is_honoured_without_lowering(capsys, tmp_path, no_cache):
    """A --policy file with ``prefer.conv = ["fft", "gemm"]`` (docs/policy.md's
    example) ran no FFT step: the CPU's default column gemm put gemm first, and
    nothing said so (fresh-user report). Without --lowering the run has one
    column, default, that compiles with the file's policy as it is, and a note."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    status, out, err = run_cli(capsys, *FAST, "--no-check", "--no-per-layer", "--format", "json",
                               "--policy", str(policy))
    assert status == 0, err
    doc = json.loads(out)
    (column,) = doc["results"]
    assert column["lowering"] == "default" and column["policy"]["prefer"] == {"conv": ["fft", "gemm"]}
    assert column["algorithms"] == {"Conv2d": {"fft": 1}, "Conv2dBackwardData": {"fft": 1},
                                    "Conv2dBackwardFilter": {"fft": 1}}
    note = next(n for n in doc["notes"] if n.startswith(f"--policy {policy} prefers fft, gemm"))
    assert "the lowerings are default, that policy as it is (" in note and note in err  # said before the run, too
    assert not any("CPU default lowerings" in n for n in doc["notes"])


def test_a_column_that_puts_its_algorithm_before_the_policy_file_says_so(capsys, tmp_path, no_cache):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY + 'conv_wgrad = "gemm"\n')
    status, out, err = run_cli(capsys, *FAST, "--no-check", "--no-per-layer", "--format", "json",
                               "--policy", str(policy), "--lowering", "fft,gemm,default")
    assert status == 0, err
    doc = json.loads(out)
    (note,) = [n for n in doc["notes"] if n.startswith("the policy prefers")]
    assert "fft, gemm (Conv2d, Conv2dBackwardData); gemm, fft (Conv2dBackwardFilter)" in note
    assert "column(s) gemm put their own algorithm first" in note  # fft is the file's first choice already
    ran = {r["lowering"]: r["algorithms"] for r in doc["results"]}
    assert ran["default"]["Conv2d"] == {"fft": 1} and ran["default"]["Conv2dBackwardFilter"] == {"gemm": 1}


def test_a_profile_without_lowering_honours_the_policy_file_too(capsys, tmp_path, quick_limits, no_cache):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    path = tmp_path / "profile.json"
    status, _, err = run_cli(capsys, *FAST, "--profile", "--policy", str(policy), "--json", str(path), "--quiet")
    assert status == 0, err
    doc = json.loads(path.read_text())
    (profiled,) = doc["models"]
    assert profiled["lowering"] == "default"
    assert {n["algorithm"] for n in profiled["nodes"] if n["op"].startswith("Conv2d")} == {"fft"}
    assert any(n.startswith(f"--policy {policy} prefers fft, gemm") for n in doc["notes"])


def test_a_policy_file_without_a_convolution_preference_keeps_the_default_columns(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('exclude = ["winograd"]\n[prefer]\nlinear = "reference"\n')
    assert lw.policy_file_default(str(policy)) is None and lw.policy_file_default(None) is None


def test_on_a_gpu_a_policy_file_preference_keeps_the_autotuned_column(tmp_path):
    """Review: a file preferring convolution algorithms left a GPU run one untuned column, and
    --engine-limit / --peak-tolerance became usage errors; autotune times every candidate
    whatever the order, so ``auto`` stays beside ``default`` there (and only there)."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[prefer]\nconv = ["cudnn", "fft"]\n')
    cuda, note = lw.policy_file_default(str(policy), "cuda")
    assert [lo.name for lo in cuda] == ["default", "auto"] and "and auto" in note
    cpu, note = lw.policy_file_default(str(policy), "cpu")
    assert [lo.name for lo in cpu] == ["default"] and "and auto" not in note
    assert lw.unused_autotune_flags({"--engine-limit": "3"}, cuda, LoweringPolicy.from_toml(str(policy)), "cuda") is None
