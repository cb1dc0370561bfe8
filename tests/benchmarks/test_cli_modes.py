"""What each mode of ``opgraph-bench`` takes: a bad value of a policy flag is
exit 2 naming the flag and the value in every mode; a flag the mode cannot
use is exit 2 naming it and saying why (never silently ignored); the output
format follows --format, else --output's suffix, and a format the mode
cannot write is explained in the terms the user typed."""

from __future__ import annotations

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
    ("--engine-limit", "abc", "must be a whole number >= 1"), ("--workspace-tolerance", "3", "must be a fraction from 0 to 1"),
    ("--workspace-limit", "lots", "must be bytes")])
def test_a_bad_policy_flag_value_is_a_usage_error_in_every_mode(capsys, mode, flag, value, why):
    status, out, err = run_cli(capsys, "--model", "L5", "--device", "cpu", "--lowering", "auto", *MODES[mode],
                               flag, value)
    assert status == 2 and out == ""
    assert err.startswith(f"opgraph-bench: error: parameter {flag}: ") and f"={value!r}: {why}" in err, err
