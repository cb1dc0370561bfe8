"""Lowering specs with a workspace limit (``cudnn@ws=0``, ``auto@ws=64MiB``): parsing,
the policy each column gets, usage errors naming the flag, and the columns side by side."""

from __future__ import annotations

import pytest

from opgraph.benchmarks import cli, lowerings as lw
from opgraph.passes.policy import LoweringPolicy


@pytest.mark.parametrize("spec, name, limit", [
    ("cudnn", "cudnn", None), ("CUDNN@ws=0", "cudnn@ws=0", 0), ("auto@ws=64MiB", "auto@ws=64MiB", 64 * 2**20),
    (" gemm @ WS = 2GB ", "gemm@ws=2GB", 2 * 10**9), ("default@ws=512", "default@ws=512", 512)])
def test_specs_parse_with_the_policy_byte_parser(spec, name, limit):
    lo = lw.parse_lowering(spec)
    assert (lo.name, lo.workspace_limit) == (name, limit)
    assert lo.base == name.split("@")[0]


def test_the_limit_reaches_the_column_policy_only():
    base = LoweringPolicy(workspace_limit="1GiB", precision="tf32")
    plain, limited, tuned = lw.parse_lowerings("cudnn,cudnn@ws=0,auto@ws=64MiB")
    assert plain.policy(base, "cuda").workspace_limit == 2**30
    p = limited.policy(base, "cuda")
    assert p.workspace_limit == 0 and p.prefer["conv"][0] == "cudnn" and p.precision == "tf32"
    t = tuned.policy(base, "cuda")
    assert t.autotune and t.workspace_limit == 64 * 2**20 and "direct" in t.exclude
    assert lw.Lowering("default@ws=0", 0).policy(base, "cpu").workspace_limit == 0
    assert "workspace limit 0 bytes per node" in limited.describe() and "limit" not in plain.describe()


def test_duplicates_are_the_same_lowering_and_limit():
    got = lw.parse_lowerings("gemm,gemm@ws=1KiB,gemm@ws=1024,GEMM,gemm@ws=0")
    assert [(lo.name, lo.workspace_limit) for lo in got] == [("gemm", None), ("gemm@ws=1KiB", 1024),
                                                              ("gemm@ws=0", 0)]


@pytest.mark.parametrize("value, message", [
    ("fast@ws=0", "unknown lowering 'fast'"), ("gemm@wx=1", "unknown option 'wx=1'"),
    ("gemm@ws", "unknown option 'ws'"), ("gemm@ws=-1", "lowering 'gemm@ws=-1': the workspace limit must be >= 0"),
    ("gemm@ws=12 parsecs", "must be bytes"),
    ("gemm@ws=1.2.3MiB", "lowering 'gemm@ws=1.2.3MiB': the workspace limit must be bytes"),
    ("gemm@ws=1e400", "lowering 'gemm@ws=1e400': the workspace limit must be a finite number"),
    ("gemm@ws=none", "needs a byte count"),
    ("unfold", "lowering 'unfold' runs only Conv2d, Conv2dBackwardFilter"), ("unfold", "prefer it (conv=unfold)")])
def test_bad_specs_are_usage_errors_naming_the_flag(capsys, value, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["--lowering", value, "--summary"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --lowering" in err and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("spec, unit", [("cudnn@ws=abc", ""), ("auto@ws=12XB", "; unknown unit 'XB'"),
                                        ("gemm@ws=64mi", "; unknown unit 'mi' (did you mean 'MiB'?)")])
def test_a_bad_workspace_option_says_each_thing_once(capsys, spec, unit):
    """Fresh-user report: ``cudnn@ws=abc`` said ``lowering 'cudnn@ws=abc': workspace limit 'abc':
    parameter ws='abc': ...``, the value three times."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--lowering", spec, "--summary"])
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and err[-1] == (
        f"opgraph-bench: error: argument --lowering: lowering {spec!r}: the workspace limit must be bytes, "
        f"e.g. 1073741824, '512MiB' or '2GB'{unit} (units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    value = spec.partition("=")[2]
    assert err[-1].count(value) == 1 and "parameter" not in err[-1]


def test_limited_and_unlimited_columns_side_by_side(capsys):
    import json

    status = cli.main(["--model", "L5", "--batch", "1", "--device", "cpu", "--lowering",
                       "gemm,gemm@ws=16MiB,auto@ws=1MiB", "--warmup", "0", "--repeat", "1",
                       "--no-per-layer", "--format", "json", "--quiet"])
    out, err = capsys.readouterr()
    assert status == 0, err
    doc = json.loads(out)
    res = {r["lowering"]: r for r in doc["results"]}
    assert list(res) == ["gemm", "gemm@ws=16MiB", "auto@ws=1MiB"] and all(r["status"] == "ok" for r in res.values())
    # L5's GEMM needs 1.8 MB of scratch: under 1 MiB autotune keeps only what needs less
    assert res["gemm@ws=16MiB"]["algorithms"] == res["gemm"]["algorithms"]
    assert all(w <= 2**20 for w in res["auto@ws=1MiB"]["memory"]["workspace_per_node"].values())
    assert "workspace limit 1048576 bytes" in doc["lowerings"]["auto@ws=1MiB"]


def test_a_limit_no_convolution_fits_is_a_usage_error(capsys):
    status = cli.main(["--model", "L5", "--batch", "1", "--device", "cpu", "--lowering", "gemm@ws=0"])
    err = capsys.readouterr().err
    assert status == 2 and "'gemm@ws=0' cannot run any convolution" in err and "exceeds the limit 0 B" in err


def test_a_lowering_whose_own_policy_excludes_it_is_a_usage_error(capsys):
    """'gemm,exclude=gemm' ran a column labelled gemm on the direct fallback (fresh-user review)."""
    status = cli.main(["--model", "L1", "--batch", "1", "--device", "cpu", "--lowering", "gemm,exclude=gemm"])
    err = capsys.readouterr().err
    assert status == 2 and "'gemm' cannot run any convolution" in err and "exclude=['gemm']" in err


def test_specs_and_policy_items_mix_on_one_flag():
    """An ``@`` after a name is a column's option, an ``@`` first forces a node
    (docs/policy.md, Command line): both kinds split apart on one ``--lowering``."""
    from opgraph.benchmarks.arguments import build_parser

    args = build_parser().parse_args(["--lowering", "cudnn@ws=0,auto@ws=64MiB,@conv2:forward=fft,"
                                      "exclude=winograd,gemm"])
    assert [(lo.name, lo.workspace_limit) for lo in args.lowering] == [
        ("cudnn@ws=0", 0), ("auto@ws=64MiB", 64 * 2**20), ("gemm", None)]
    assert args.lowering_policy == "@conv2:forward=fft,exclude=winograd"


@pytest.mark.parametrize("typo, close", [("gemmm", "gemm"), ("windgrad", "winograd"), ("autto", "auto")])
def test_an_unknown_lowering_suggests_the_close_name(capsys, typo, close):
    """Fresh-user report: a misspelt lowering got the list of names and no 'did you mean'."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--lowering", typo, "--summary"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"unknown lowering {typo!r} (did you mean {close!r}?)" in err, err


def test_the_depthwise_cuda_kernels_are_a_column_only_when_asked_for():
    """They take only depthwise convolutions (all three directions since the stride-1 forward):
    a default GPU run has no column of theirs, ``--lowering cuda`` is one (cuDNN elsewhere)."""
    from opgraph.benchmarks.lowerings import default_lowerings, parse_lowering
    assert "cuda" not in [lo.name for lo in default_lowerings("cuda")]
    assert parse_lowering("cuda").policy(LoweringPolicy(), "cuda").prefer["conv"][0] == "cuda"
