"""The notes a timing run knows before it times anything (the device, the
flags it ignores there, the defaults it took) are said on standard error
before the first column runs (fresh-user report: on the CPU they printed with
the results, after the run), and once: the document still carries them."""

from __future__ import annotations

import json

import pytest

from opgraph.benchmarks import cli

FAST = ("--model", "L4", "--batch", "1", "--device", "cpu", "--lowering", "direct", "--warmup", "0",
        "--repeat", "1", "--no-per-layer", "--no-check")
LAYOUT_NOTE = "# --layout nhwc: the layout pass stores NHWC on cuda only; cpu runs NCHW"


def test_the_notes_known_before_timing_are_said_before_the_run_starts(capsys, monkeypatch):
    said = []

    def run_benchmark(*args, **kwargs):  # what standard error held when timing would start
        said.append(capsys.readouterr().err)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.driver, "run_benchmark", run_benchmark)
    assert cli.main([*FAST, "--layout", "nhwc"]) == cli.EXIT_INTERRUPTED
    (before,) = said
    lines = before.splitlines()
    assert lines[0].startswith("# device: cpu") and LAYOUT_NOTE in lines, before


def test_a_note_said_before_the_run_is_not_said_again_on_standard_error(capsys):
    status = cli.main([*FAST, "--layout", "nhwc", "--format", "json"])
    out, err = capsys.readouterr()
    assert status == 0, err
    lines = err.splitlines()
    assert lines.count(LAYOUT_NOTE) == 1 and lines.index(LAYOUT_NOTE) < min(
        i for i, line in enumerate(lines) if line.startswith("[1/1]")), err
    assert LAYOUT_NOTE[2:] in json.loads(out)["notes"]  # the document keeps it


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_says_no_note(capsys, monkeypatch, quiet):
    monkeypatch.setattr(cli.driver, "run_benchmark", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    cli.main([*FAST, "--layout", "nhwc", *(["--quiet"] if quiet else [])])
    err = capsys.readouterr().err
    assert (LAYOUT_NOTE in err) is not quiet, err


def test_a_device_asked_for_is_not_called_the_default(capsys, monkeypatch):
    """Fresh-user report: ``--device cpu`` printed "(opgraph.compile's default)"."""
    monkeypatch.setattr(cli.driver, "run_benchmark", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli.main(list(FAST)) == cli.EXIT_INTERRUPTED
    (line,) = [n for n in capsys.readouterr().err.splitlines() if n.startswith("# device:")]
    assert line == "# device: cpu (cpu: the device asked for)" and "default" not in line


def test_the_table_says_which_policy_keys_have_no_effect(capsys, monkeypatch, tmp_path):
    """A policy file's engine limits on the CPU (no cuDNN engines there): the compile's 'no
    effect' note is printed under the table, not only in the JSON; a key naming no node warns."""
    policy = tmp_path / "p.toml"
    policy.write_text('engine_limit = 4\n[engine_limits]\n"nosuchnode" = 2\n')
    monkeypatch.setenv("OPGRAPH_CACHE", str(tmp_path / "c.json"))
    status = cli.main(["--model", "L1", "--batch", "1", "--device", "cpu", "--lowering", "auto",
                       "--policy", str(policy), "--warmup", "0", "--repeat", "1", "--no-per-layer"])
    out = capsys.readouterr()
    assert status == 0
    assert "L1 / auto: policy engine_limit=4, engine_limits={'nosuchnode': 2}" in out.out
    assert "no effect" in out.out
    assert "engine_limits key 'nosuchnode' matches no node" in out.out + out.err


@pytest.mark.parametrize("value, said_by_run", [("10", True), ("all", False), ("4", False)])
def test_engine_limit_on_the_cpu_is_noted_once_whatever_its_value(capsys, monkeypatch, tmp_path, value,
                                                                  said_by_run):
    """Review: ``--engine-limit 10`` (the default) on the CPU was said by no one: the compile
    notes a policy's non-default limit only. The run notes the default; the compile the rest."""
    monkeypatch.setenv("OPGRAPH_CACHE", str(tmp_path / "c.json"))
    status = cli.main(["--model", "L1", "--batch", "1", "--device", "cpu", "--lowering", "auto",
                       "--engine-limit", value, "--warmup", "0", "--repeat", "1", "--no-per-layer",
                       "--format", "json"])
    out, err = capsys.readouterr()
    assert status == 0, err
    doc = json.loads(out)
    run_notes = [n for n in doc["notes"] if "cuDNN engines" in n]
    column_notes = [n for r in doc["results"] for n in r["notes"] if "cuDNN engines" in n]
    assert len(run_notes + column_notes) == 1, (run_notes, column_notes)
    assert bool(run_notes) is said_by_run


def test_version_prints_the_installed_version(capsys):
    """Fresh-user report: ``--version`` was an unknown flag ("did you mean '--precision'?")."""
    import opgraph
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip().endswith(f" {opgraph.__version__}")


def _run_in_terminal(argv, timeout: float = 120) -> str:
    """What ``opgraph-bench argv`` writes to a pseudo-terminal that is both its
    standard output and its standard error (read until the child closes it, or
    ``timeout`` seconds)."""
    import os
    import select
    import subprocess
    import sys
    import time

    pty = pytest.importorskip("pty")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "opgraph.benchmarks", *argv], stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([leader], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    assert proc.returncode == 0, text
    return text


def test_a_terminal_shows_each_note_once_and_a_redirected_table_keeps_them(capsys, tmp_path):
    """Fresh-user reports: on a terminal, and in ``> log 2>&1`` or ``2>&1 | tee``,
    the notes said before the run came again above the tables. They are written
    once there; tables written to a file or pipe of their own still begin with
    every note, so they say how they were made."""
    import subprocess
    import sys

    shown = _run_in_terminal([*FAST, "--layout", "nhwc"])
    assert shown.count(LAYOUT_NOTE) == 1 and shown.count("# device: cpu") == 1, shown
    command = [sys.executable, "-m", "opgraph.benchmarks", *FAST, "--layout", "nhwc"]
    log = tmp_path / "log"
    with open(log, "w") as f:  # > log 2>&1
        assert subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, timeout=120).returncode == 0
    piped = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)  # 2>&1 | tee
    for text in (log.read_text(), piped.stdout.decode()):
        assert text.count(LAYOUT_NOTE) == 1 and text.count("# device: cpu") == 1, text
    assert cli.main([*FAST, "--layout", "nhwc"]) == 0
    out, err = capsys.readouterr()  # two streams of their own
    assert LAYOUT_NOTE in out.splitlines() and LAYOUT_NOTE in err.splitlines()
