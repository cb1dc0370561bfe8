"""Writing a file atomically, keeping what a reader of the old file relied on.

One helper for every file opgraph rewrites (the autotune cache, the
``opgraph-bench --output`` document): a reader sees the old content or the
new, never half of it, and

* the text goes to a temporary file in the folder of the file it replaces,
  then ``os.replace`` renames it over that file (atomic on POSIX and on
  Windows within one volume);
* a symbolic link is followed: its target is replaced and the link stays (a
  cache path that links into a shared folder keeps linking there);
* an existing file keeps its permission bits; a new one gets those of the
  process's umask (``0o666 & ~umask``, as ``open(path, "w")`` would give),
  not the owner-only 0600 of ``tempfile.mkstemp``, so that a shared cache
  stays readable to the users who could read it before;
* a path that names something other than a regular file or a folder (a
  character or block device such as ``/dev/null``, a FIFO, a socket; also
  through a symbolic link, such as ``/dev/stdout``) is written into directly,
  never replaced: renaming a file over ``/dev/null`` would replace the
  system's device, and a pipe's reader would never see the text;
* a path naming one of this process's open descriptors (``/dev/stdout``,
  ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``; :func:`descriptor_of`)
  is written into that descriptor, at its offset, whatever it is open on:
  with ``> out.json`` or ``>> log`` the shell opened the file, and replacing
  it by a rename (``/proc/self/fd/1`` resolves to ``out.json``) would cut
  the shell's descriptor off from the file and drop what ``>>`` kept.

:func:`check_writable` tries, before any work, what :func:`write_atomic`
will do (``os.access`` says yes to root even where nothing can be created).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import sys


def _what_is(path: str) -> tuple:
    """``(fd, st)``: the open descriptor a descriptor's path names
    (:func:`descriptor_of`; ``st`` None), else None and the stat of what the
    path leads to, every link followed (/proc/self/fd/N's included; None: no
    file yet, or a dangling link's target)."""
    fd = descriptor_of(path)
    if fd is not None:
        return fd, None
    try:
        return None, os.stat(path)
    except FileNotFoundError:
        return None, None


def write_atomic(path: str | os.PathLike, text: str | bytes, *, prefix: str = ".opgraph-") -> None:
    """Replace the file at ``path`` (or the file a symbolic link there points
    to) by ``text``, UTF-8, atomically; write ``text`` into a device, FIFO
    or socket there instead (module docstring).

    Args:
        path: the file; its folder must exist.
        text: the new content; newlines are written as given. Bytes are
            written as they are (a gzip-compressed autotune cache).
        prefix: the name prefix of the temporary file beside the target.

    Raises:
        OSError: the folder cannot be written, the disk is full, ...; the
            temporary file is removed and the old file is left as it was;
            for a device, FIFO or socket: it cannot be opened for writing
            (a socket: ``ENXIO``) or refuses the text; for a descriptor's
            path: the descriptor is not open for writing (``EBADF``).
    """
    path = os.fspath(path)
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    fd, st = _what_is(path)
    if fd is not None:
        _write_descriptor(fd, data)
        return
    if st is not None and _written_into(st):
        _write_into(path, data)
        return
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    mode = None if st is None else stat.S_IMODE(st.st_mode)  # None: os.open's 0o666 less the umask
    fd, tmp = _create_beside(folder, prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.chmod(tmp, mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_writable(path: str | os.PathLike, *, prefix: str = ".opgraph-", beside: bool = True) -> None:
    """Try what writing ``path`` will need, changing nothing: for a path that
    does not exist, create and remove a temporary file in the folder of its
    target (as :func:`write_atomic` creates its own); for a regular file, open
    it for appending (nothing is written) and, with ``beside``, create and
    remove a temporary file beside it; a device, FIFO or socket is written
    into directly and is not opened here (opening a FIFO blocks until it has
    a reader); a descriptor's path (:func:`descriptor_of`) is checked to be
    open for writing.

    Args:
        path: the file to be written.
        prefix: the name prefix of the temporary file.
        beside: whether the writer needs a temporary file beside an existing
            file (False for a writer that rewrites the file in place).

    Raises:
        OSError: the attempt that failed (``e.filename`` is the temporary
            file or ``path``); ``IsADirectoryError`` for a folder; ``EBADF``
            for a descriptor that is not open, or open for reading only.
    """
    path = os.fspath(path)
    fd, st = _what_is(path)
    if fd is not None:
        _check_descriptor(fd, path)
        return
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if st is not None and _written_into(st):
        return
    if st is not None:
        with open(path, "ab"):
            pass
        if not beside:
            return
    fd, tmp = _create_beside(os.path.dirname(os.path.realpath(path)), prefix)
    os.close(fd)
    os.unlink(tmp)


def writes_into(path: str | os.PathLike) -> bool:
    """Whether :func:`write_atomic` writes into ``path`` rather than replacing
    it: something other than a regular file or a folder is there (a device,
    a FIFO, a socket), or it names an open descriptor of this process
    (``/dev/stdout``, on a pipe, a terminal or a file: :func:`descriptor_of`).
    A reader of such a path sees every write, so a writer that rewrites a
    whole document several times should write it once."""
    if descriptor_of(path) is not None:
        return True
    try:
        st = os.stat(path)
    except OSError:
        return False
    return _written_into(st)


#: The standard streams' paths -> their descriptors.
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
#: A descriptor's path: /dev/fd/N, /proc/self/fd/N, /proc/<pid>[/task/<tid>]/fd/N.
_FD_PATH = re.compile(r"/dev/fd/(\d+)|/proc/(self|thread-self|\d+)(?:/task/\d+)?/fd/(\d+)")


def descriptor_of(path: str | os.PathLike) -> int | None:
    """The open-file descriptor of this process that ``path`` names, or None:
    ``/dev/stdin``, ``/dev/stdout``, ``/dev/stderr`` (0, 1, 2), ``/dev/fd/N``,
    ``/proc/self/fd/N`` (``/proc/<this pid>/fd/N``, ``/proc/thread-self/fd/N``),
    also through symbolic links (of the path or of its folders) that lead
    there. Another process's ``/proc/<pid>/fd/N`` is None (a path as any)."""
    p = os.path.abspath(os.fspath(path))
    for _ in range(40):  # the kernel's limit on links followed
        p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
        if p in _STANDARD:
            return _STANDARD[p]
        m = _FD_PATH.fullmatch(p)
        if m and m.group(1) is not None:
            return int(m.group(1))
        if m and m.group(2) in ("self", "thread-self", str(os.getpid())):
            return int(m.group(3))
        try:
            link = os.readlink(p)
        except OSError:  # not a link (or nothing there)
            return None
        p = os.path.normpath(os.path.join(os.path.dirname(p), link))
    return None


def _check_descriptor(fd: int, path: str) -> None:
    """Raise ``EBADF`` (naming ``path``) unless descriptor ``fd`` is open for writing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: the write will tell
        return
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        raise OSError(errno.EBADF, f"descriptor {fd} is not open", path) from None
    if mode not in (os.O_WRONLY, os.O_RDWR):
        raise OSError(errno.EBADF, f"descriptor {fd} is open for reading only", path)


def _write_descriptor(fd: int, data: bytes) -> None:
    """Write ``data`` into descriptor ``fd`` at its offset (the end,
    for one opened to append), after what ``sys.stdout`` / ``sys.stderr``
    buffered for it; the descriptor stays open."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.fileno() == fd:
                stream.flush()
        except (AttributeError, OSError, ValueError):  # replaced by a stream without a descriptor
            pass
    data = memoryview(data)
    while data:
        data = data[os.write(fd, data):]


def _written_into(st: os.stat_result) -> bool:
    """Neither a regular file (replaced) nor a folder (refused)."""
    return not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode)


def _write_into(path: str, data: bytes) -> None:
    """Write ``data`` into the device, FIFO or socket at ``path`` without
    truncating or replacing it (a FIFO's open waits for a reader)."""
    fd = os.open(path, os.O_WRONLY)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _create_beside(folder: str, prefix: str) -> tuple[int, str]:
    """A new file of a fresh name in ``folder``, opened for writing with mode
    0o666 less the umask (the kernel applies it)."""
    while True:
        tmp = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue


__all__ = ["write_atomic", "check_writable", "writes_into", "descriptor_of"]
