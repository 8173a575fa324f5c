"""Files the store writes beside a recording: only regular files it created itself.

As root, a recording path that was a device or a FIFO was replaced (``/dev/full``), and symlinks
planted at ``RUN.h5.lock`` and ``RUN.h5.creating`` had their victim overwritten (issue 32). Every
such name is now created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and written through that descriptor,
and a name is replaced only when it holds a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["UnsafePath", "create_new", "open_lock", "refuse_non_regular", "replace_whole"]

# Every file the store creates beside a recording is made with these flags: a name someone
# planted first (a symlink to a victim file, a device) is an error, never followed (issue 32).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_NEW = os.O_CREAT | os.O_EXCL | _NOFOLLOW


class UnsafePath(OSError):
    """A name the store would write is something other than a regular file it may replace."""


def _kind(mode: int) -> str:
    return {
        stat.S_IFLNK: "a symbolic link",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
        stat.S_IFDIR: "a directory",
    }.get(stat.S_IFMT(mode), "not a regular file")


def refuse_non_regular(path: str, what: str = "the recording path") -> None:
    """Raise :class:`UnsafePath` when ``path`` exists and is not a regular file (a device, a
    FIFO, a socket, a directory, a symbolic link): the store replaces only regular files."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(
            f"{what} {path} is {_kind(st.st_mode)}, not a regular file; nothing is written "
            "there. Record to a regular file's path"
        )


def create_new(path: str, flags: int = os.O_RDWR, *, stale_ok: bool = False) -> int:
    """Create ``path`` with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and return its descriptor.

    ``stale_ok``: a *regular* file left at that name by a killed process (one link, not a
    symlink) is removed and the name created afresh; anything else there is an error."""
    try:
        return os.open(path, flags | _NEW, 0o644)
    except FileExistsError:
        if not stale_ok:
            raise
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        what = _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a file with other links"
        raise UnsafePath(
            f"{path} exists and is {what}; it was not made by replay, so it is neither followed "
            "nor replaced. Remove it"
        )
    os.unlink(path)
    return os.open(path, flags | _NEW, 0o644)


def staging_name(path: str) -> str:
    """This process's own temporary name for ``path``: two commands writing it at once never
    write into, or rename, each other's file. One a killed process left is replaced."""
    return f"{path}.{os.getpid()}.tmp"


@contextlib.contextmanager
def replace_whole(path: str, what: str, tmp: str | None = None) -> Iterator[BinaryIO]:
    """A file whose content replaces ``path`` (a regular file, or none) once written: ``path`` is
    never seen half-written, and a link or device planted at either name is an error. ``tmp``:
    the name it is written under (default: this process's own, :func:`staging_name`)."""
    refuse_non_regular(path, what)
    tmp = tmp or staging_name(path)
    fd = create_new(tmp, os.O_RDWR, stale_ok=True)
    try:
        with os.fdopen(fd, "w+b") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:  # (a full disk, an interrupt): no temporary file is left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_lock(name: str) -> int:
    """The lock file, created with ``O_EXCL|O_NOFOLLOW``; one a killed writer left is opened
    without following a link, and used only when it is a regular file with one link (a planted
    symlink or hard link to a victim file would have the victim overwritten with the lock's JSON)."""
    with contextlib.suppress(FileExistsError):
        return create_new(name)
    try:
        fd = os.open(name, os.O_RDWR | os.O_NONBLOCK | _NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(
                f"the lock file {name} is a symbolic link, which replay never follows; remove it"
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a file with other links"
        raise UnsafePath(f"the lock file {name} is {what}, not one replay made; remove it")
    return fd
