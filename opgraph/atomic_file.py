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
  stays readable to the users who could read it before.
"""

from __future__ import annotations

import os
import secrets
import stat


def write_atomic(path: str | os.PathLike, text: str, *, prefix: str = ".opgraph-") -> None:
    """Replace the file at ``path`` (or the file a symbolic link there points
    to) by ``text``, UTF-8, atomically (module docstring).

    Args:
        path: the file; its folder must exist.
        text: the new content; newlines are written as given.
        prefix: the name prefix of the temporary file beside the target.

    Raises:
        OSError: the folder cannot be written, the disk is full, ...; the
            temporary file is removed and the old file is left as it was.
    """
    target = os.path.realpath(os.fspath(path))
    folder = os.path.dirname(target)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None  # a new file: os.open's 0o666 masked by the umask
    fd, tmp = _create_beside(folder, prefix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            if mode is not None:
                os.chmod(tmp, mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _create_beside(folder: str, prefix: str) -> tuple[int, str]:
    """A new file of a fresh name in ``folder``, opened for writing with mode
    0o666 less the umask (the kernel applies it)."""
    while True:
        tmp = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue


__all__ = ["write_atomic"]
