"""``records.warnings_noted``: a warning raised while a column compiles is kept
in the column's notes and shown the moment it is raised (not when the compile
returns, which a long autotune may take minutes to do), each message once per
command, and ``python -W error`` never masks the compile's own exception."""

from __future__ import annotations

import traceback
import warnings

import pytest

from opgraph.benchmarks import cli, driver
from opgraph.benchmarks.records import warnings_noted


def _shown_into(shown: list[str]):
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        shown.append(str(message))

    return show


def test_a_warning_is_shown_before_the_compile_returns():
    shown: list[str] = []
    notes: list[str] = []

    def compile_stub():
        warnings.warn("autotune cache x.json is corrupt", RuntimeWarning)
        assert shown == ["autotune cache x.json is corrupt"], "not shown while the compile runs"
        return "exe"

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = _shown_into(shown)
        with warnings_noted(notes):
            assert compile_stub() == "exe"
    assert shown == ["autotune cache x.json is corrupt"]  # once, not again at the end
    assert notes == ["warning: autotune cache x.json is corrupt"]


def test_every_compile_notes_a_warning_the_command_prints_once(capsys):
    """Each column's record gets the warning, though the command's printer
    (``cli._warning_printer``) shows each message once."""
    first: list[str] = []
    second: list[str] = []
    printed = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = cli._warning_printer()
        for notes in (first, second):
            with warnings_noted(notes):
                warnings.warn("hand edit not used", RuntimeWarning)
            printed.append(capsys.readouterr().err)
    assert printed == ["opgraph-bench: warning: hand edit not used\n", ""]  # once, by the first compile
    assert first == second == ["warning: hand edit not used"]


def test_a_once_filter_shows_a_warning_raised_twice_in_one_compile_once():
    shown: list[str] = []
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("once")
        warnings.showwarning = _shown_into(shown)
        with warnings_noted(notes):
            for _ in range(2):
                warnings.warn("variants function failed", RuntimeWarning)
    assert shown == ["variants function failed"] and notes == ["warning: variants function failed"]


def test_an_ignored_warning_is_still_noted_but_not_shown():
    shown: list[str] = []
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.showwarning = _shown_into(shown)
        with warnings_noted(notes):
            warnings.warn("cache unwritable", RuntimeWarning)
    assert notes == ["warning: cache unwritable"] and shown == []


def test_under_w_error_the_compiles_own_exception_is_not_masked():
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="the compile failed") as info:
            with warnings_noted(notes):
                warnings.warn("autotune cache x.json is corrupt", RuntimeWarning)
                raise ValueError("the compile failed")
    assert not isinstance(info.value.__context__, Warning)
    assert notes == ["warning: autotune cache x.json is corrupt"]


def test_under_w_error_a_warning_is_raised_once_the_compile_has_finished():
    notes: list[str] = []
    finished = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="is corrupt"):
            with warnings_noted(notes):
                warnings.warn("autotune cache x.json is corrupt", RuntimeWarning)
                finished = True
    assert finished and notes == ["warning: autotune cache x.json is corrupt"]


def test_the_command_prints_a_compiles_warning_as_it_happens(monkeypatch, capsys):
    """Through ``opgraph-bench``: the line is on standard error before the
    column's compile returns, once for the command though every column warns."""
    import json

    compile_ = driver.og.compile
    seen: list[str] = []

    def compile_that_warns(*args, **kwargs):
        warnings.warn("autotune cache tune.json is corrupt: not JSON", RuntimeWarning)
        seen.append(capsys.readouterr().err)  # what the command had printed by now
        return compile_(*args, **kwargs)

    monkeypatch.setattr(driver.og, "compile", compile_that_warns)
    status = cli.main(["--model", "L5", "--batch", "1", "--device", "cpu", "--warmup", "0", "--repeat", "1",
                       "--no-check", "--no-per-layer", "--lowering", "gemm,direct", "--format", "json", "--quiet"])
    out, err = capsys.readouterr()
    assert status == 0, err
    line = "opgraph-bench: warning: autotune cache tune.json is corrupt: not JSON\n"
    assert seen[0] == line and all(s == "" for s in seen[1:]) and len(seen) >= 2
    for rec in json.loads(out)["results"]:
        assert "warning: autotune cache tune.json is corrupt: not JSON" in rec["notes"]


def test_a_force_key_that_forces_nothing_reaches_the_column_notes():
    """Fresh-user report: ``policy.force key 'inception_*/3x3' matches no node`` (a UserWarning of
    passes/lower.py) was printed but not kept in the column's JSON notes; deprecation notices of
    libraries are still only shown."""
    notes = []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with warnings_noted(notes):
            warnings.warn("policy.force key 'inception_*/3x3' matches no node of graph 'alexnet'", UserWarning)
            warnings.warn("old API", DeprecationWarning)
    assert notes == ["warning: policy.force key 'inception_*/3x3' matches no node of graph 'alexnet'"]


def test_a_filter_scoped_to_the_warning_module_is_honoured():
    """The warning was issued again without its module, so ``-W
    ignore::RuntimeWarning:opgraph.passes.autotune_cache`` did not hide it
    (and ``warnings.filterwarnings(module=...)`` matched nothing)."""
    from opgraph.passes import autotune_cache

    shown: list[str] = []
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"opgraph\.passes\.autotune_cache")
        warnings.showwarning = _shown_into(shown)
        with warnings_noted(notes):
            warnings.warn_explicit("cache unwritable", RuntimeWarning, autotune_cache.__file__, 1)
            warnings.warn("from elsewhere", RuntimeWarning)
    assert notes == ["warning: cache unwritable", "warning: from elsewhere"]
    assert shown == ["from elsewhere"]


def test_a_hand_edited_cache_choice_that_is_used_is_in_the_column_notes(monkeypatch, capsys, tmp_path):
    """A fresh user edited a cached choice to a 200x slower correct candidate: the column timed
    it and said nothing (only ``exe.report.notes`` did; a used edit raises no warning)."""
    import json

    path = tmp_path / "tune.json"
    monkeypatch.setenv("OPGRAPH_CACHE", str(path))
    argv = ["--model", "L5", "--batch", "1", "--device", "cpu", "--warmup", "0", "--repeat", "1", "--no-check",
            "--no-per-layer", "--lowering", "auto", "--format", "json", "--quiet"]
    assert cli.main(argv) == 0
    (first,) = json.loads(capsys.readouterr().out)["results"]
    assert not [n for n in first["notes"] if "hand-edited" in n]
    data = json.loads(path.read_text())
    key, entry = next((k, e) for k, e in sorted(data["entries"].items())
                      if any(c["status"] == "ok" and c["algorithm"] != e["algorithm"] for c in e["candidates"]))
    other = next(c for c in entry["candidates"] if c["status"] == "ok" and c["algorithm"] != entry["algorithm"]
                 and c["algorithm"] != entry.get("tuned", {}).get("algorithm"))
    entry.update(algorithm=other["algorithm"], options=other["options"])
    path.write_text(json.dumps(data))
    assert cli.main(argv) == 0
    (rec,) = json.loads(capsys.readouterr().out)["results"]
    used = [n for n in rec["notes"] if "hand-edited choice" in n]
    assert len(used) == 1 and f"hand-edited choice {other['algorithm']}" in used[0] and " used (" in used[0], rec["notes"]


def test_a_warning_from_a_file_no_module_was_imported_from_is_still_issued():
    """A warning attributed to a file that is no imported module's (``warn_explicit`` with another
    file, code run from a string) was issued again with ``module=None``, which ``warn_explicit``
    drops without a word: never shown, and under ``-W error`` never raised. It is issued as
    Python would without the block: shown, or raised under an error filter."""
    def issue():
        warnings.warn_explicit("from elsewhere", RuntimeWarning, "elsewhere.py", 7)

    expected: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
            expected.append((str(message), filename, lineno))
        issue()
        shown: list = []
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
            shown.append((str(message), filename, lineno))
        notes: list[str] = []
        with warnings_noted(notes):
            issue()
    assert shown == expected == [("from elsewhere", "elsewhere.py", 7)]
    assert notes == ["warning: from elsewhere"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="from elsewhere"):
            issue()  # as Python raises it without the block
        with pytest.raises(RuntimeWarning, match="from elsewhere"):
            with warnings_noted([]):
                issue()


def _attribution(path) -> tuple[str, int, str]:
    """Where Python attributes the corrupt cache's warning (file, line) and its message."""
    from opgraph.passes.autotune_cache import AutotuneCache

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AutotuneCache(path)
    (w,) = caught
    return w.filename, w.lineno, str(w.message)


def test_under_w_error_the_raised_warning_names_where_it_was_issued(tmp_path):
    """The warning raised once the compile has finished was the autotune cache's (category and
    message), but its traceback, and so a column's error record, named ``benchmarks/records.py``
    (where it was raised again), not the cache module that issued it: its innermost frames are now
    those of the issue, down to the line Python attributes the warning to."""
    from opgraph.benchmarks.records import error_reason, error_record
    from opgraph.passes import autotune_cache

    path = tmp_path / "tune.json"
    path.write_text("not json")
    filename, lineno, message = _attribution(path)
    assert filename == autotune_cache.__file__
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning) as info:
            with warnings_noted(notes):
                autotune_cache.AutotuneCache(path)
    assert type(info.value) is RuntimeWarning and str(info.value) == message
    assert notes == [f"warning: {message}"]
    frames = traceback.extract_tb(info.value.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == (filename, lineno)
    assert [f.name for f in frames[-3:]] == ["__init__", "_read", "warn"]  # AutotuneCache's, the caller's
    assert frames[-4].name == "warnings_noted"  # raised there, once the block (the call above) had ended
    err = error_record(info.value)
    assert err["type"] == "RuntimeWarning" and err["frames"][-1] == f"passes/autotune_cache.py:{lineno} in warn"
    assert error_reason(err).endswith(f"(at passes/autotune_cache.py:{lineno} in warn)")


def test_under_w_error_a_warning_attributed_off_the_stack_is_raised_as_it_was():
    """A warning whose file and line are no frame of the block's stack (``warn_explicit`` from
    elsewhere, or a ``stacklevel`` reaching above the block) keeps the traceback it was raised with."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="from elsewhere") as info:
            with warnings_noted([]):
                warnings.warn_explicit("from elsewhere", RuntimeWarning, "elsewhere.py", 7)
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "note_and_show"


def test_under_w_error_a_columns_reason_names_the_cache_module(monkeypatch, capsys, tmp_path):
    """Through ``opgraph-bench`` with ``-W error::RuntimeWarning:opgraph.passes.autotune_cache``: the
    column that read a corrupt cache is an error whose reason names the cache module's line that
    warned, where it named ``benchmarks/records.py``."""
    import json

    path = tmp_path / "tune.json"
    path.write_text("not json")
    filename, lineno, message = _attribution(path)
    monkeypatch.setenv("OPGRAPH_CACHE", str(path))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=RuntimeWarning, module=r"opgraph\.passes\.autotune_cache")
        status = cli.main(["--model", "L5", "--batch", "1", "--device", "cpu", "--warmup", "0", "--repeat", "1",
                           "--no-check", "--no-per-layer", "--lowering", "auto", "--format", "json", "--quiet"])
    out, err = capsys.readouterr()
    (rec,) = json.loads(out)["results"]
    assert status == 3 and rec["status"] == "error", err
    assert rec["error"]["type"] == "RuntimeWarning" and rec["error"]["message"] == message
    assert rec["reason"] == f"RuntimeWarning: {message} (at passes/autotune_cache.py:{lineno} in warn)"
    assert rec["error"]["frames"][-2].startswith("passes/autotune_cache.py:")  # AutotuneCache's caller
