"""A bad value of any ``opgraph-bench`` flag is one short line that names the
flag, the value, the allowed names and, where one is close, the name the user
probably meant (fresh-user report: ``--model``, ``--compare`` and ``--layout``
offered no close name, ``--layout``'s error was argparse's ``invalid choice``
with a Python tuple, a ``--policy`` file's errors did not name the flag, and
``--workspace-limit`` listed its units as a Python list)."""

from __future__ import annotations

import pytest

from opgraph.benchmarks import cli

USAGE_LINE = "usage: opgraph-bench [FLAGS ...]; opgraph-bench --help lists them"


def error_of(capsys, *argv) -> tuple[int, list[str]]:
    """The exit status and the standard-error lines of ``opgraph-bench ARGV``."""
    try:
        status = cli.main(list(argv))
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("flag, typo, close, listed", [
    ("--model", "alexnt", "alexnet", "alexnet, overfeat, vgg_a"),
    ("--model", "vgga", "vgg_a", "the groups all, winners, layers, modern"),
    ("--model", "winers", "winners", "the aliases overfeat_fast"),
    ("--compare", "torh", "torch", "torch, torch+graph, torch-compile, torch-compile+graph"),
    ("--layout", "nhcw", "nhwc", "nchw, nhwc"),
    ("--suite", "winers", "winners", "all, winners, layers, modern"),
    ("--device", "cdua", "cuda", "auto, cpu, cuda"),
    ("--dtype", "flot32", "float32", "float32, float64, float16, bfloat16"),
    ("--format", "jsn", "json", "table, json, csv, markdown"),
    ("--precision", "fp23", "fp32", "fp32, tf32, bf16, fp16"),
])
def test_an_unknown_value_names_the_flag_the_value_the_close_name_and_the_allowed_ones(
        capsys, flag, typo, close, listed):
    status, err = error_of(capsys, flag, typo, "--summary")
    assert status == 2 and len(err) == 2 and err[0] == USAGE_LINE, err
    line = err[1]
    assert line.startswith(f"opgraph-bench: error: argument {flag}: unknown ") and f"{typo!r}" in line, line
    assert f"(did you mean {close!r}" in line and listed in line, line
    assert "invalid choice" not in line and "['" not in line and "('" not in line, line


def test_a_value_with_no_close_name_gets_the_allowed_names_only(capsys):
    status, err = error_of(capsys, "--layout", "zzzz", "--summary")
    assert status == 2 and err[1] == "opgraph-bench: error: argument --layout: unknown layout 'zzzz'; choose from nchw, nhwc"


def test_the_layout_is_still_case_insensitive():
    from opgraph.benchmarks.arguments import build_parser

    assert build_parser().parse_args(["--layout", "NHWC"]).layout == "nhwc"


def test_every_unknown_entry_of_a_list_is_named_with_its_close_name(capsys):
    status, err = error_of(capsys, "--compare", "torh,torch-compil", "--summary")
    assert status == 2 and "unknown peer 'torh' (did you mean 'torch'?), 'torch-compil' (did you mean " \
                           "'torch-compile'" in err[1], err


def policy_error(capsys, tmp_path, text: str | None) -> str:
    """The one error line of a CPU run given a ``--policy`` file holding
    ``text`` (None: a file that does not exist)."""
    path = tmp_path / "policy.toml"
    if text is not None:
        path.write_text(text)
    status, err = error_of(capsys, "--policy", str(path), "--model", "L1", "--device", "cpu",
                           "--lowering", "gemm", "--no-check", "--no-per-layer", "--quiet")
    assert status == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("text, value, close, listed", [
    ('layuot = "NHWC"', "layuot='NHWC'", "layout", "known keys: autotune, cache,"),
    ('layout = "NHCW"', "layout='NHCW'", "NHWC", "must be one of NCHW, NHWC"),
    ('precision = "fp23"', "precision='fp23'", "fp32", "must be one of fp32, tf32, bf16, fp16"),
    ('tune_clock = "lanch"', "tune_clock='lanch'", "launch", "must be one of device, launch"),
])
def test_a_bad_value_in_a_policy_file_names_the_flag_the_file_and_the_close_name(
        capsys, tmp_path, text, value, close, listed):
    line = policy_error(capsys, tmp_path, text)
    assert line.startswith(f"opgraph-bench: error: parameter --policy {tmp_path / 'policy.toml'}: {value}"), line
    assert f"(did you mean {close!r}" in line and listed in line and "['" not in line, line


def test_a_missing_policy_file_names_the_flag(capsys, tmp_path):
    line = policy_error(capsys, tmp_path, None)
    assert line.startswith(f"opgraph-bench: error: parameter --policy='{tmp_path / 'policy.toml'}': "
                           "cannot be read"), line


def test_workspace_limit_units_are_listed_as_text(capsys):
    status, err = error_of(capsys, "--workspace-limit", "5XB", "--summary")
    assert status == 2 and err[-1].endswith("(units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"), err


@pytest.mark.parametrize("value, said", [
    ("12XB", "; unknown unit 'XB' (units"),                   # said (did you mean 'B'?)
    ("64mi", "; unknown unit 'mi' (did you mean 'MiB'?)"),
    ("3gig", "; unknown unit 'gig' (did you mean 'GiB'?)"), ("5K", "; unknown unit 'K' (did you mean 'kB'?)"),
])
def test_workspace_limit_offers_a_unit_that_was_meant(capsys, value, said):
    """Fresh-user report: ``--workspace-limit 12XB`` was asked ``did you mean 'B'?``: the bare B is
    never offered, units are compared in any case (any case is read), and with no close unit the
    units are listed alone."""
    status, err = error_of(capsys, "--workspace-limit", value, "--summary", "--model", "L5")
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith(f"opgraph-bench: error: parameter --workspace-limit: workspace_limit={value!r}: "
                             f"must be bytes") and said in err[0], err
    assert "'B'?" not in err[0]


@pytest.mark.parametrize("argv, said", [
    (["--mdoel", "alexnet"], "unknown flag '--mdoel' (did you mean '--model'?)"),
    (["--mdoel=alexnet"], "unknown flag '--mdoel' (did you mean '--model'?)"),
    (["-model", "L5"], "unknown flag '-model' (did you mean '--model'?)"),
    (["--mdoel", "L5", "--bach", "2"],
     "unknown flags '--mdoel' (did you mean '--model'?), '--bach' (did you mean '--batch'?)"),
    (["--zzzzzz"], "unknown flag '--zzzzzz'"),                 # nothing close: no guess
    (["stray", "--zzzzzz"], "unknown flag '--zzzzzz'; unrecognized arguments: stray"),
    (["stray"], "unrecognized arguments: stray"),              # no flag: argparse's words
])
def test_an_unknown_flag_offers_the_close_one(capsys, argv, said):
    """Fresh-user report: ``--mdoel alexnet`` said ``unrecognized arguments: --mdoel alexnet``
    and no more (Python 3.11's argparse has no suggest_on_error)."""
    status, err = error_of(capsys, *argv, "--summary")
    assert status == 2 and err == [USAGE_LINE, f"opgraph-bench: error: {said}"], err


def test_compare_offers_the_close_flag_too(capsys):
    from opgraph.benchmarks import compare

    with pytest.raises(SystemExit) as e:
        compare.main(["a.json", "b.json", "--formt", "json"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "opgraph-bench compare: error: unknown flag '--formt' (did you mean '--format'?)"


def test_compares_format_is_named_the_same_way(capsys):
    from opgraph.benchmarks import compare

    with pytest.raises(SystemExit) as e:
        compare.main(["a.json", "b.json", "--format", "jsn"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "usage: opgraph-bench compare A.json B.json [--format table|markdown|json|csv]; "
        "opgraph-bench compare --help lists them",
        "opgraph-bench compare: error: argument --format: unknown format 'jsn' (did you mean 'json'?); "
        "choose from table, markdown, json, csv"]


@pytest.mark.parametrize("argv, flag, first, then", [
    (("--model", "L4", "--model", "L5"), "--model", "L4", "L5"),           # L4 was dropped, unsaid
    (("--model=L4", "--mod", "L5"), "--model", "L4", "L5"),                # joined value, abbreviation
    (("--model", "L4", "--dtype", "float32", "--dtype=float64"), "--dtype", "float32", "float64"),
])
def test_a_flag_of_one_value_given_twice_is_an_error(capsys, argv, flag, first, then):
    """Fresh-user report: ``--model L4 --model L5`` ran L5 alone, saying nothing."""
    status, err = error_of(capsys, *argv, "--summary")
    assert status == 2 and err[0] == USAGE_LINE
    assert err[1].startswith(f"opgraph-bench: error: argument {flag}: given twice ({first!r}, then {then!r})")
    if flag == "--model":
        assert err[1].endswith(f"give one list: --model {first},{then}")


def test_the_same_value_given_twice_is_no_error(capsys):
    status, err = error_of(capsys, "--model", "L4", "--model", "L4", "--dtype", "float32", "--dtype=float32",
                           "--summary")
    assert status == 0 and not any("given twice" in line for line in err)


def test_a_switch_may_repeat():
    from opgraph.benchmarks.arguments import build_parser
    from opgraph.benchmarks.flag_values import given_twice

    assert given_twice(build_parser(), ["--no-check", "--no-check", "--quiet", "--quiet"]) is None


@pytest.mark.parametrize("argv, message", [
    (("--repeat", "autoo"), r"argument --repeat: 'autoo' is not an integer \(did you mean 'auto'\?\); give a count"),
    (("--engine-limit", "alll"), r"--engine-limit: .*\(did you mean 'all'\?\)"),
    (("--device", "gpu"), r"argument --device: unknown device 'gpu' \(did you mean 'cuda'\?\)"),
    # the value as written, not the Python list it was split into
    (("--lowering", "@L4=ftt"), r"argument --lowering: @L4='ftt': unknown algorithm 'ftt' \(did you mean 'fft'\?\)"),
    # a misspelt key, not an unknown algorithm 'fused-reference'
    (("--lowering", "auto,includ=fused-reference"), r"argument --lowering: includ='fused-reference': unknown key 'includ' "
                                                    r"\(did you mean 'include'\?\); known keys: include, exclude"),
])
def test_more_values_a_fresh_user_mistyped(capsys, argv, message):
    import re

    status, err = error_of(capsys, "--model", "L4", *argv)
    assert status == 2 and re.search(message, err[-1]), err


@pytest.mark.parametrize("value, said", [
    ("auto,include=pool-scann", "include='pool-scann': names no algorithm, rule tag or fusion rule "
                                "(did you mean 'pool-scan'?); known: "),
    ("auto,include=fused-reference,exclude=fused", "exclude=['fused']: covers include=['fused-reference']: "),
    ("gemm,include=gemm,exclude=gemm", "exclude=['gemm']: also in include=['gemm']: ")])
def test_a_bad_include_or_exclude_name_is_a_usage_error_said_once(capsys, value, said):
    """Fresh-user report: ``--lowering auto,include=pool-scann`` said
    ``error: parameter --lowering include=pool-scann: include='pool-scann': ...``,
    the item twice and no usage line, unlike the other bad flag values: the
    names are checked as the flag is parsed, an argparse error like theirs."""
    status, err = error_of(capsys, "--model", "L4", "--batch", "1", "--device", "cpu", "--lowering", value)
    assert status == 2 and err[0] == USAGE_LINE and len(err) == 2, err
    assert err[1].startswith(f"opgraph-bench: error: argument --lowering: {said}"), err
    assert err[1].count("--lowering") == 1 and "parameter" not in err[1]
