"""``opgraph.atomic_file.write_atomic``: the one writer of the autotune cache
and of ``opgraph-bench --output`` keeps a file's mode (or the umask's for a
new one), writes through a symbolic link to its target, and leaves nothing
behind when it fails."""

import os
import stat

import pytest

from opgraph.atomic_file import write_atomic


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_the_umask_mode(tmp_path, umask_022):
    path = tmp_path / "new.json"
    write_atomic(path, "{}\n")
    assert path.read_text() == "{}\n" and mode(path) == 0o644


def test_an_existing_file_keeps_its_mode(tmp_path, umask_022):
    path = tmp_path / "shared.json"
    path.write_text("old")
    for bits in (0o664, 0o600, 0o640):
        os.chmod(path, bits)
        write_atomic(path, "new")
        assert path.read_text() == "new" and mode(path) == bits


def test_a_symbolic_link_keeps_linking_to_the_rewritten_target(tmp_path):
    real = tmp_path / "store" / "cache.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "cache.json"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"
    assert not list(real.parent.glob(".opgraph-*")) and not list(tmp_path.glob(".opgraph-*"))


def test_a_dangling_link_creates_its_target(tmp_path):
    real, link = tmp_path / "made.json", tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, "x")
    assert link.is_symlink() and real.read_text() == "x"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "keep.json"
    path.write_text("old")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, "new")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]
