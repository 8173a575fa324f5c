"""Where ``replay export`` writes: a new directory that appears whole or not at all.

The checkpoint is written into a temporary folder beside ``--out`` (same file system) and renamed
into place at the end: a full disk, an I/O error or an interrupt leaves no partial checkpoint (a
0-byte ``grads.pt`` was left behind on a full disk). ``--out`` itself is never written through:
an existing link, device or file there is a usage error (exit 2); a folder that cannot be made
or written is exit 3 (issue 32, items 2 and 6). Every problem is one line, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator

from ..errors import EXIT_BAD_RECORDING, ReplayError, UsageError

__all__ = ["ExportWriteError", "check_out", "staged_dir"]


class ExportWriteError(ReplayError):
    """The checkpoint could not be written (disk full, no permission): nothing was left."""

    exit_code = EXIT_BAD_RECORDING


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def check_out(out: str) -> None:
    """Refuse, before any user code runs, an ``--out`` that export would write over or through:
    anything there but an empty directory, a link (dangling or not), a parent that is not a
    directory (``/dev/full/x``)."""
    if not out:
        raise UsageError("--out: an empty path; name a new directory")
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise UsageError(f"--out {out}: a part of the path is not a directory") from None
    except OSError as e:
        raise UsageError(f"--out {out}: cannot be looked at ({_why(e)})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"--out {out}: is a symbolic link, which export never follows")
        if not stat.S_ISDIR(st.st_mode) or os.listdir(out):
            raise UsageError(f"--out {out}: exists and is not an empty directory; name a new one")
        return
    probe = os.path.dirname(os.path.abspath(out))
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"--out {out}: {probe} is not a directory")


@contextlib.contextmanager
def staged_dir(out: str) -> Iterator[str]:
    """Yield a fresh temporary folder beside ``out``; on a clean exit rename it to ``out``.

    On any failure the folder is removed and an ``OSError`` becomes :class:`ExportWriteError`."""
    parent = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out) or 'export'}.", dir=parent)
    except OSError as e:
        raise ExportWriteError(f"--out {out}: its folder cannot be written ({_why(e)})") from None
    try:
        yield tmp
        mask = os.umask(0)  # (read by setting it: put back at once)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes 0700; the user's umask decides
        _rename_into_place(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise UsageError(
                f"--out {out}: something appeared there meanwhile; name a new one"
            ) from None
        raise ExportWriteError(
            f"--out {out}: the checkpoint could not be written ({_why(e)}); nothing was left there"
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _rename_into_place(tmp: str, out: str) -> None:
    """``rename(2)`` replaces an empty directory atomically, and never a non-empty one or a
    link to one (it replaces the link itself); the link check closes the window since
    :func:`check_out`."""
    if os.path.islink(out):
        raise OSError(errno.EEXIST, "a link appeared at --out")
    os.rename(tmp, out)
