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
