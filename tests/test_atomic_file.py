"""``opgraph.atomic_file.write_atomic``: the one writer of the autotune cache
and of ``opgraph-bench --output`` keeps a file's mode (or the umask's for a
new one), writes through a symbolic link to its target, and leaves nothing
behind when it fails; a device or FIFO (``/dev/null``, ``/dev/stdout``) is
written into, never replaced; ``check_writable`` tries, changing nothing."""

import os
import stat
import subprocess
import sys
import threading

import pytest

from opgraph.atomic_file import check_writable, descriptor_of, write_atomic, writes_into


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


def test_bytes_are_written_as_they_are_keeping_the_mode(tmp_path, umask_022):
    """The gzip-compressed autotune cache (``*.json.gz``) is written as bytes."""
    path = tmp_path / "c.json.gz"
    write_atomic(path, b"\x1f\x8b\x00\xff")
    assert path.read_bytes() == b"\x1f\x8b\x00\xff" and mode(path) == 0o644
    os.chmod(path, 0o600)
    write_atomic(path, b"\r\n")  # no newline translation either
    assert path.read_bytes() == b"\r\n" and mode(path) == 0o600


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


def read_fifo_in_thread(path):
    """Start a reader of the FIFO at ``path``; returns (thread, chunks)."""
    chunks: list[bytes] = []

    def read():
        with open(path, "rb") as f:
            chunks.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, chunks


def test_a_fifo_receives_the_text_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader, chunks = read_fifo_in_thread(fifo)
    write_atomic(fifo, "through the pipe\n")
    reader.join(10)
    assert not reader.is_alive() and chunks == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary left


def test_a_symbolic_link_to_a_fifo_writes_into_the_fifo(tmp_path):
    fifo, link = tmp_path / "pipe", tmp_path / "out.json"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    reader, chunks = read_fifo_in_thread(fifo)
    write_atomic(link, "{}\n")
    reader.join(10)
    assert chunks == [b"{}\n"]
    assert link.is_symlink() and os.readlink(link) == str(fifo) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert writes_into(link) and writes_into(fifo) and not writes_into(tmp_path / "new.json")


@pytest.mark.skipif(not os.access("/dev/null", os.W_OK), reason="/dev/null is not writable here")
def test_dev_null_is_written_into_and_stays_a_character_device():
    before = os.stat("/dev/null")
    write_atomic("/dev/null", "discarded")  # written into, never replaced
    after = os.stat("/dev/null")
    assert os.path.exists("/dev/null") and stat.S_ISCHR(after.st_mode)
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_dev_stdout_on_a_pipe_is_written_into():
    """``/dev/stdout`` links to /proc/self/fd/1, which on a pipe names no folder
    (its temporary file was '/proc/<pid>/fd/.opgraph-....tmp': not found)."""
    code = "from opgraph.atomic_file import write_atomic; write_atomic('/dev/stdout', 'to the pipe\\n')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "to the pipe\n"


def test_descriptor_paths_name_this_process_descriptors(tmp_path):
    link = tmp_path / "out.json"
    link.symlink_to("/dev/stdout")
    assert [descriptor_of(p) for p in ("/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd/7",
                                       "/proc/self/fd/7", f"/proc/{os.getpid()}/fd/7", link)] == [0, 1, 2, 7, 7, 7, 1]
    assert descriptor_of("/proc/1/fd/1") is None or os.getpid() == 1  # another process's: a path as any
    assert descriptor_of(tmp_path / "new.json") is None and descriptor_of("/dev/null") is None


@pytest.mark.parametrize("flags", [os.O_WRONLY | os.O_APPEND, os.O_WRONLY], ids=[">>", ">"])
def test_a_descriptor_on_a_regular_file_is_written_into_not_replaced(tmp_path, flags):
    """``opgraph-bench --output /dev/stdout >> log``: /proc/self/fd/1 resolves
    to ``log``; replacing it by a rename cut the shell's descriptor off from
    the file and dropped what it held. Written at the descriptor's offset: the
    end for ``>>``, after what was written through it for ``>``."""
    path = tmp_path / "log"
    path.write_text("kept\n")
    inode = os.stat(path).st_ino
    fd = os.open(path, flags)
    try:
        if not flags & os.O_APPEND:
            os.lseek(fd, 0, os.SEEK_END)
        for name in (f"/dev/fd/{fd}", f"/proc/self/fd/{fd}"):
            assert writes_into(name)
            check_writable(name)
            write_atomic(name, f"{name}\n")
    finally:
        os.close(fd)
    assert path.read_text() == f"kept\n/dev/fd/{fd}\n/proc/self/fd/{fd}\n"
    assert os.stat(path).st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log"]  # no temporary file


def test_a_descriptor_not_open_for_writing_is_refused(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("input")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match=f"descriptor {fd} is open for reading only") as e:
            check_writable(f"/dev/fd/{fd}")
        assert e.value.filename == f"/dev/fd/{fd}"
    finally:
        os.close(fd)
    with pytest.raises(OSError, match=f"descriptor {fd} is not open"):
        check_writable(f"/dev/fd/{fd}")
    assert path.read_text() == "input"


def test_check_writable_tries_creating_and_changes_nothing(tmp_path):
    check_writable(tmp_path / "new.json")
    existing = tmp_path / "old.json"
    existing.write_text("kept")
    check_writable(existing)
    assert existing.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]
    with pytest.raises(NotADirectoryError):
        check_writable(existing / "out.json")
    with pytest.raises(IsADirectoryError):
        check_writable(tmp_path)
    with pytest.raises(OSError):  # refused even to root, whom os.access never refuses
        check_writable("/proc/opgraph-test.json")
    assert not os.path.exists("/proc/opgraph-test.json")


def test_check_writable_does_not_open_a_fifo(tmp_path):
    """Opening a FIFO for writing blocks until a reader comes: the check must not."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    checker = threading.Thread(target=check_writable, args=(fifo,), daemon=True)
    checker.start()
    checker.join(10)
    if checker.is_alive():  # unblock it before failing
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    assert not checker.is_alive()
