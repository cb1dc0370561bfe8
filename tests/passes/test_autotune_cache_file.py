"""Where the autotune cache lives and in what form (``passes.autotune_cache.locate``):
one rule for ``OPGRAPH_CACHE`` and ``policy.cache``; a ``.json.gz`` path is a
gzip-compressed file, read and written as such (atomically, keeping its mode
and symbolic link); a corrupt one is reported and rebuilt.

Fresh-user report: ``OPGRAPH_CACHE=/tmp/u1/new.json.gz`` (or ``up.JSON``)
made a FOLDER of that name holding ``autotune.json``, while the policy's
``cache`` of the same path wrote plain JSON into a file of that name."""

import gzip
import json
import re
import os
import stat
import warnings

import pytest

from opgraph.passes.autotune import AutotunePass
from opgraph.passes.autotune_cache import FORMAT, AutotuneCache, default_path, locate
from opgraph.passes.base import PassContext, Pipeline
from opgraph.passes.lower import LowerPass
from opgraph.passes.policy import LoweringPolicy

from passes_stubs import StubTimer, install_scale_rules
from test_autotune import VERSIONS_A, scale_graph


def compile_with(outs, timer, cache=None):
    """Lower and autotune ``outs``; ``cache``: the policy's, else ``OPGRAPH_CACHE`` decides."""
    policy = LoweringPolicy(autotune=True, **({} if cache is None else {"cache": str(cache)}))
    ctx = PassContext(policy=policy, timer=timer, versions=lambda: dict(VERSIONS_A), device_name=lambda: "test-cpu")
    Pipeline("t", [LowerPass(), AutotunePass()]).run(outs[0].graph, outs, ctx)
    return ctx.report


def set_cache(monkeypatch, source, path):
    """``(policy cache or None)`` after pointing ``source`` (env or policy) at ``path``."""
    if source == "env":
        monkeypatch.setenv("OPGRAPH_CACHE", str(path))
        return None
    monkeypatch.delenv("OPGRAPH_CACHE", raising=False)
    return path


def gunzipped(path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))


@pytest.mark.parametrize("source", ["env", "policy"])
@pytest.mark.parametrize("name", ["new.json.gz", "UP.JSON.GZ", "autotune-cache.Json.Gz"])
def test_a_json_gz_path_is_a_gzip_compressed_file_from_either_setting(monkeypatch, tmp_path, source, name):
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    path = tmp_path / "u1" / name
    cache = set_cache(monkeypatch, source, path)
    outs = scale_graph()[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a .json.gz path is no guess: nothing to report
        first = compile_with(outs, StubTimer({"fast": 1.0, "slow": 5.0}), cache)
    assert path.is_file(), f"{path} is a folder" if path.is_dir() else "no file"
    data = gunzipped(path)
    assert data["format"] == FORMAT and len(data["entries"]) == 1
    assert first.autotune["cache_path"] == str(path)
    counter = StubTimer({"slow": 0.1})  # would pick 'slow' if it timed anything
    again = compile_with(outs, counter, cache)
    assert counter.calls == [] and again.node("s0").how == "cache" and again.node("s0").algorithm == "fast"


@pytest.mark.parametrize("source", ["env", "policy"])
@pytest.mark.parametrize("name", ["up.JSON", "x.Json"])
def test_a_json_path_in_any_case_is_a_plain_file_from_either_setting(monkeypatch, tmp_path, source, name):
    install_scale_rules(monkeypatch, ["reference", "fast"])
    path = tmp_path / name
    compile_with(scale_graph()[1], StubTimer({"fast": 1.0}), set_cache(monkeypatch, source, path))
    assert path.is_file() and json.loads(path.read_text())["format"] == FORMAT


def test_the_gzip_bytes_hold_the_plain_files_text_and_no_time_stamp(tmp_path):
    plain, packed = AutotuneCache(tmp_path / "c.json"), AutotuneCache(tmp_path / "c.json.gz")
    for cache in (plain, packed):
        cache.put("k", {"algorithm": "fast", "options": {}})
        cache.save()
    assert gzip.decompress((tmp_path / "c.json.gz").read_bytes()) == (tmp_path / "c.json").read_bytes()
    first = (tmp_path / "c.json.gz").read_bytes()
    packed.put("k", {"algorithm": "fast", "options": {}})
    packed.save()  # the same decisions later: the same bytes (mtime 0 in the header)
    assert (tmp_path / "c.json.gz").read_bytes() == first


def test_a_gzip_cache_merges_what_another_process_wrote(tmp_path):
    path = tmp_path / "c.json.gz"
    cache, other = AutotuneCache(path), AutotuneCache(path)
    other.put("theirs", {"algorithm": "fft", "options": {}})
    other.save()
    cache.put("ours", {"algorithm": "gemm", "options": {}})
    cache.save()
    assert set(gunzipped(path)["entries"]) == {"theirs", "ours"}
    assert set(AutotuneCache(path).entries) == {"theirs", "ours"}


def test_a_gzip_cache_behind_a_symbolic_link_keeps_its_link_and_mode(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast"])
    shared = tmp_path / "shared" / "autotune-cache.json.gz"
    shared.parent.mkdir()
    shared.write_bytes(gzip.compress(json.dumps({"format": FORMAT, "entries": {}}).encode()))
    os.chmod(shared, 0o640)
    link = tmp_path / "mine.json.gz"
    link.symlink_to(shared)
    compile_with(scale_graph()[1], StubTimer({"fast": 1.0}), link)
    assert link.is_symlink() and os.readlink(link) == str(shared)
    assert len(gunzipped(shared)["entries"]) == 1 and stat.S_IMODE(os.stat(shared).st_mode) == 0o640
    assert not list(shared.parent.glob(".autotune-*")) and not list(tmp_path.glob(".autotune-*"))


def _truncated() -> bytes:
    return gzip.compress(json.dumps({"format": FORMAT, "entries": {"k": {"algorithm": "x"}}}).encode())[:-12]


def _bad_crc() -> bytes:
    data = bytearray(gzip.compress(json.dumps({"format": FORMAT, "entries": {}}).encode()))
    data[-6] ^= 0xFF  # the CRC-32 in the trailer
    return bytes(data)


@pytest.mark.parametrize("content, said", [
    (b"garbage", "is corrupt: not JSON (Expecting value"),  # no gzip magic: read as the text it is
    (b"", "is corrupt: not JSON (Expecting value"),
    (_truncated(), "is corrupt: its gzip data end early"),
    (_bad_crc(), "is corrupt: damaged gzip data (CRC check failed"),
    (gzip.compress(b"[]"), "is of the wrong format: an array"),
    (gzip.compress(b"{not json"), "is corrupt: not JSON (Expecting property name"),
], ids=["garbage", "empty", "truncated", "bad-crc", "wrong-shape", "not-json"])
def test_a_corrupt_gzip_cache_is_reported_and_rebuilt(monkeypatch, tmp_path, content, said):
    install_scale_rules(monkeypatch, ["reference", "fast"])
    path = tmp_path / "c.json.gz"
    path.write_bytes(content)
    with pytest.warns(RuntimeWarning) as caught:
        report = compile_with(scale_graph()[1], StubTimer({"fast": 1.0}), path)
    (message,) = [str(w.message) for w in caught if "autotune cache" in str(w.message)]
    assert message.startswith(f"autotune cache {path} {said}") and message.endswith("; it will be rebuilt")
    assert "Error" not in message, message  # Python's words: BadGzipFile, zlib's 'Error -3 while ...'
    assert report.node("s0").algorithm == "fast" and message in report.notes
    assert len(gunzipped(path)["entries"]) == 1  # rebuilt, gzipped
    assert not list(tmp_path.glob(".autotune-*"))


def test_a_corrupt_cache_is_rebuilt_when_nothing_was_tuned(monkeypatch, tmp_path):
    """Every node with one candidate: nothing new to write, yet the corrupt file is written again
    (empty and valid), as its warning says, so the next compile reads it without a warning (it
    was left as garbage, and warned about on every compile)."""
    install_scale_rules(monkeypatch, ["reference"])
    path = tmp_path / "c.json.gz"
    path.write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning, match="it will be rebuilt"):
        compile_with(scale_graph()[1], StubTimer({}), path)
    assert gunzipped(path) == {"format": FORMAT, "entries": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_with(scale_graph()[1], StubTimer({}), path)


@pytest.mark.parametrize("name, write, held", [
    ("c.json", lambda text: gzip.compress(text), "gzip-compressed data where its name says plain JSON"),
    ("c.json.gz", lambda text: text, "plain JSON data where its name says gzip-compressed"),
], ids=["gzip-as-json", "json-as-gz"])
def test_a_cache_whose_name_and_content_disagree_is_read_as_it_is_and_kept(monkeypatch, tmp_path, name, write, held):
    """Review: a plain cache under *.json.gz (as an older version wrote a policy cache of that name),
    or gzip under *.json (a renamed or linked copy), was called corrupt and rebuilt, losing every
    entry; the content now decides how it is read, the name how it is written, and it is said."""
    install_scale_rules(monkeypatch, ["reference", "fast"])
    path = tmp_path / name
    old = {f"other-{i}": {"algorithm": "gemm", "options": {}} for i in range(3)}
    path.write_bytes(write(json.dumps({"format": FORMAT, "entries": old}).encode()))
    with pytest.warns(RuntimeWarning, match=re.escape(f"autotune cache {path} holds {held}")):
        compile_with(scale_graph()[1], StubTimer({"fast": 1.0}), path)
    raw = path.read_bytes()
    entries = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)["entries"]
    assert set(old) < set(entries) and len(entries) == 4  # the three kept, the new one added


@pytest.mark.parametrize("source", ["OPGRAPH_CACHE", "policy cache"])
def test_locate_is_one_rule_for_both_settings(tmp_path, source):
    (tmp_path / "made").mkdir()
    (tmp_path / "odd.name").mkdir()  # an existing folder stays a folder, whatever its name
    (tmp_path / "plainfile").write_text("")
    assert locate("off", source) == locate(" None ", source) == (None, None)
    assert locate(tmp_path / "c.json", source) == (str(tmp_path / "c.json"), None)
    assert locate(tmp_path / "c.JSON.gz", source) == (str(tmp_path / "c.JSON.gz"), None)
    for folder in ("made", "odd.name", "new", ".hidden"):  # existing, existing, no suffix, a dot file
        assert locate(tmp_path / folder, source) == (str(tmp_path / folder / "autotune.json"), None)
    assert locate(f"{tmp_path}/new.json/", source) == (str(tmp_path / "new.json" / "autotune.json"), None)
    assert locate("~/c.json.gz", source).path == os.path.expanduser("~/c.json.gz")


@pytest.mark.parametrize("source", ["OPGRAPH_CACHE", "policy cache"])
@pytest.mark.parametrize("name, how", [
    ("cache.txt", "has the suffix '.txt', neither .json nor .json.gz"),
    ("cache.gz", "has the suffix '.gz', neither .json nor .json.gz"),
    ("plainfile", "has no suffix, which names a folder, but a file is there"),
])
def test_an_unknown_suffix_is_a_plain_file_and_says_so(tmp_path, source, name, how):
    (tmp_path / "plainfile").write_text("")
    path = tmp_path / name
    where = locate(path, source)
    assert where.path == str(path)
    assert where.warning == (f"autotune cache: {source}={str(path)!r} {how}: taken as the plain-JSON cache file "
                             f"{path} (a name ending in .json.gz is a gzip-compressed one; a path ending in '/', "
                             "or a name without a suffix, a folder that gets autotune.json)")


def test_an_unknown_suffix_is_reported_when_the_cache_is_opened(monkeypatch, tmp_path):
    install_scale_rules(monkeypatch, ["reference", "fast"])
    path = tmp_path / "cache.txt"
    monkeypatch.setenv("OPGRAPH_CACHE", str(path))
    with pytest.warns(RuntimeWarning, match=r"OPGRAPH_CACHE=.*cache\.txt' has the suffix '\.txt'.*taken as the "
                                            r"plain-JSON cache file"):
        report = compile_with(scale_graph()[1], StubTimer({"fast": 1.0}))
    assert path.is_file() and json.loads(path.read_text())["format"] == FORMAT
    assert any("has the suffix '.txt'" in n for n in report.notes)


def test_a_folder_an_earlier_version_made_of_a_json_gz_setting_keeps_its_decisions(monkeypatch, tmp_path):
    """Before the fix, OPGRAPH_CACHE=.../new.json.gz made that folder with an
    autotune.json in it: it is used, with a warning, rather than failing to
    read and write a folder as a file."""
    install_scale_rules(monkeypatch, ["reference", "fast", "slow"])
    folder = tmp_path / "new.json.gz"
    monkeypatch.setenv("OPGRAPH_CACHE", str(folder))
    assert default_path() == str(folder)  # a gzip file, now
    folder.mkdir()
    assert default_path() == str(folder / "autotune.json")
    outs = scale_graph()[1]
    with pytest.warns(RuntimeWarning, match="names a gzip-compressed cache file by its suffix, but a folder is there"):
        compile_with(outs, StubTimer({"fast": 1.0}))
    counter = StubTimer({"slow": 0.1})
    with pytest.warns(RuntimeWarning, match="taken as that folder"):
        report = compile_with(outs, counter)
    assert counter.calls == [] and report.node("s0").how == "cache"
    assert json.loads((folder / "autotune.json").read_text())["format"] == FORMAT
