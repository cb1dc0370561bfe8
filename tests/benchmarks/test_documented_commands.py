"""Every ``opgraph-bench`` command and ``--lowering`` value that README.md and
docs/*.md show goes through the argument parser and the policy builder, so a
documented command always works (docs/policy.md once showed ``--lowering
conv=fft+gemm`` and ``@conv2=fft``, which the command refused)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from opgraph.benchmarks import compare
from opgraph.benchmarks.arguments import build_parser
from opgraph.passes.policy import LoweringPolicy

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: Words the docs use for "your value here" (``--lowering SPEC``, ``--policy FILE``).
PLACEHOLDERS = {"SPEC", "LIST", "FILE", "NAME", "ALGO", "TOML"}


def _commands(path: Path):
    """(where, argv) of every ``opgraph-bench`` command: lines of fenced code
    blocks (a line ending in a backslash continues on the next) and inline
    code spans (which may wrap), comments dropped; a span
    ``--lowering VALUE`` alone counts as a command with that flag."""
    text = path.read_text()
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    for block in fenced:
        for line in block.replace("\\\n", " ").splitlines():
            if "opgraph-bench" in line:
                cmd = line.split("opgraph-bench", 1)[1].split(" #", 1)[0]
                yield f"{path.name}: {line.strip()}", shlex.split(cmd)
    prose = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S).replace("\n", " ")
    for span in re.findall(r"`([^`]+)`", prose):
        span = re.sub(r"\s+", " ", span).strip()
        if span.startswith("opgraph-bench"):
            yield f"{path.name}: `{span}`", shlex.split(span)[1:]
        elif span.startswith("--lowering "):
            yield f"{path.name}: `{span}`", shlex.split(span)


COMMANDS = [c for path in DOCS for c in _commands(path)]


def test_the_docs_show_commands():
    where = {w.split(":", 1)[0] for w, _ in COMMANDS}
    assert {"README.md", "policy.md"} <= where
    spans = [argv for _, argv in COMMANDS]
    assert ["--model", "alexnet", "--lowering", "conv=fft+gemm"] in spans
    assert any("@conv2=direct" in " ".join(a) for a in spans)


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses_and_builds_its_policy(where, argv, tmp_path, monkeypatch):
    if set(argv) & PLACEHOLDERS:
        pytest.skip("a placeholder, not a command")
    if argv[:1] == ["compare"]:  # opgraph-bench compare A.json B.json: its own parser
        args = compare.build_parser().parse_args(argv[1:])
        assert args.a.endswith(".json") and args.b.endswith(".json")
        return
    # the policy file docs/policy.md shows, where a command names it
    example = re.search(r"```toml\n# policy.toml.*?\n(.*?)```", (REPO / "docs" / "policy.md").read_text(), re.S)
    (tmp_path / "policy.toml").write_text(example.group(1))
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(argv)  # SystemExit(2) on a usage error: the test fails
    policy = LoweringPolicy.from_cli(lowering=args.lowering_policy, policy_file=args.policy,
                                     workspace_limit=args.workspace_limit,
                                     workspace_tolerance=args.workspace_tolerance,
                                     peak_tolerance=args.peak_tolerance)
    assert isinstance(policy, LoweringPolicy)
    if args.lowering_policy:
        assert args.lowering  # policy items alone still make a column


def _run_lowering_flag(text: str) -> list[dict]:
    """The results of ``--lowering TEXT`` on the tiny convnet (conv1, conv2), as
    the CLI builds them: its parser splits columns from policy items, and
    ``from_cli`` makes the base policy of every column; checked against float64."""
    from opgraph.benchmarks import driver
    from tinymodels import tiny_convnet

    args = build_parser().parse_args(["--lowering", text])
    s = driver.Settings(device="cpu", lowerings=args.lowering, warmup=0, repeat=1, per_layer=True,
                        base_policy=LoweringPolicy.from_cli(lowering=args.lowering_policy))
    return driver.run_benchmark([tiny_convnet()], s)["results"]


def test_policy_md_prefer_item_runs_as_its_own_column():
    """docs/policy.md: ``--lowering conv=fft+gemm`` is one column, every
    convolution direction on FFT (the CLI refused it before issue 17)."""
    (r,) = _run_lowering_flag("conv=fft+gemm")
    assert (r["lowering"], r["status"]) == ("conv=fft+gemm", "ok"), r["reason"]
    convs = {op: set(a) for op, a in r["algorithms"].items() if op.startswith("Conv2d")}
    # the forward may be fused with its bias and ReLU (Conv2dBiasRelu): its convolution runs fft too
    assert {"Conv2dBackwardData", "Conv2dBackwardFilter"} <= set(convs)
    assert set().union(*convs.values()) == {"fft"}
    assert r["forced"] == {} and r["check"]["passed"]


def test_policy_md_force_item_forces_the_layer_in_every_column():
    """docs/policy.md: ``@conv2=fft`` forces conv2 in all three directions in
    each column beside it; conv1 keeps the column's algorithm, and the forced
    nodes are no 'not applicable' declines."""
    results = _run_lowering_flag("gemm,direct,@conv2=fft")
    assert [(r["lowering"], r["status"]) for r in results] == [("gemm", "ok"), ("direct", "ok")]
    for r in results:
        assert r["forced"] == {"conv2": "fft", "conv2.grad/conv2d_backward_data": "fft",
                               "conv2.grad/conv2d_backward_filter": "fft"}
        assert r["not_applicable"] == {} and r["check"]["passed"]
        layers = {x["layer"]: x for x in r["layers"]}
        assert set(layers["conv2"]["algorithm"].values()) == {"fft"}
        assert set(layers["conv1"]["algorithm"].values()) == {r["lowering"]}
        assert layers["conv2"]["forced"] == {p: "fft" for p in layers["conv2"]["algorithm"]}
