"""Private folders in the temporary directory, and the ones killed replays left there.

A replay's scratch folder (``engine/hands_off.py``: what the program run again writes goes
there), a trace's op spool and a multi-rank replay's or a preflight's folder are removed when
they end; a process killed first cannot. A self-check ends with its run by SIGKILL (mid-replay
when the run is short), and one day of this suite left 98 scratch folders in /tmp, each with
whatever its program wrote on the way to its Recorder. So each folder's name says whose it is
(the pid namespace and the process id), and making one removes this user's folders of the same
kind whose process is gone.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

__all__ = ["alive", "private_dir"]


def _namespace() -> int:
    """The pid namespace's id: a process id means nothing outside it (containers may share a
    temporary directory)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def private_dir(kind: str) -> str:
    """A new folder (mode 0700), ``replay-<kind>-<namespace>-<pid>-XXXXXXXX``, in the temporary
    directory, made after removing those of ``kind`` that belong to this user and to a process
    of this namespace that is gone."""
    root = tempfile.gettempdir()
    prefix = f"replay-{kind}-{_namespace()}-"
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    for name in names:
        pid = name[len(prefix) :].partition("-")[0] if name.startswith(prefix) else ""
        if not (pid.isascii() and pid.isdigit()) or alive(int(pid)):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        # Only a real folder of this user's (never a link, nor someone else's folder named so):
        # rmtree does not follow links inside it.
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True
