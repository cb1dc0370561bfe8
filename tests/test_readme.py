"""README.md stays true: its Python examples run, it opens with the two
commands, and .ci/run runs the test command README gives."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_readme_opens_with_the_setup_and_test_commands():
    blocks = re.findall(r"```sh\n(.*?)```", README, re.S)
    bench, tests = blocks[0].strip(), blocks[1].strip()
    assert bench.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -e")
    assert bench.endswith("&& opgraph-bench")
    assert tests.endswith("&& python -m pytest -q")
    # nothing but the title and one sentence each before the two commands
    head = README[:README.index(blocks[1])]
    assert head.count("\n## ") == 0


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    test_cmd = re.findall(r"```sh\n(.*?)```", README, re.S)[1].strip().rsplit("&& ", 1)[1]
    assert re.search(rf"^{re.escape(test_cmd)}( \|\| status=\$\?)?$", ci, re.M), test_cmd


def test_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    code = "\n".join(re.findall(r"```python\n(.*?)```", README, re.S))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["y_val"].shape == (8, 16, 16, 16)
    assert namespace["dw_val"].shape == (16, 3, 3, 3)
    assert "conv1" in capsys.readouterr().out


def test_readme_gives_the_cpu_run_time_the_cli_gives():
    """The default CPU run's duration: README says what the run's notes and
    ``--batch``'s help say (``driver.CPU_RUN_TIME``), not another figure."""
    from opgraph.benchmarks import driver
    from opgraph.benchmarks.arguments import build_parser

    def bare(text):  # line breaks (argparse may wrap at a hyphen) are not words
        return "".join(text.split())

    said = bare(driver.CPU_RUN_TIME)
    assert said in bare(README)
    assert said in bare(driver.default_batch(128, "cpu", None)[1])
    assert said in bare(build_parser().format_help())
    assert "eightminutes" not in bare(README) and "3-8minutes" not in bare(README)


def test_readme_names_every_opgraph_bench_flag():
    """A flag missing from README.md is one a reader of it cannot find (--seed,
    --workspace-limit and --workspace-tolerance were)."""
    from opgraph.benchmarks.arguments import build_parser

    flags = [o for a in build_parser()._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    assert len(flags) > 20
    assert [f for f in flags if f"`{f}" not in README] == []


def test_readme_says_where_its_timings_were_measured():
    """Fresh-user report: README quoted timings without saying on what machine
    or under what load. One sentence near the top says it, once."""
    head = " ".join(README[:README.index("## Defining a model")].split())
    assert ("The timings this README quotes were measured on otherwise idle machines: a 2-core AMD EPYC "
            "virtual machine (AVX-512) for the CPU, one NVIDIA H200 for the GPU") in head
    assert "shared 2-core machine" not in " ".join(README.split())  # a quote said 'shared', meaning idle
