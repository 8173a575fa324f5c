"""Whether a recording's writer is still at work, from the lock file beside it.

A writer process holds an exclusive ``flock`` on ``RUN.h5.lock`` for as long as it has the file
open (see ``writer.py``); the kernel drops the lock when that process exits, ``kill -9`` included.
The lock file holds JSON: who writes (``pid``, ``writer_pid``, ``host``) and, once the training
process has died without closing the recording, ``"state": "draining"`` with the number of steps
the writer process still has to commit (``steps_to_come``). Readers only look: they never create
the lock file and never keep a lock.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["lock_info", "lock_path", "WriterState", "writer_state", "wait_for_drain"]


def lock_path(path: str) -> str:
    """The lock file beside a recording while it is written: ``run.h5`` -> ``run.h5.lock``."""
    return f"{path}.lock"


@dataclass(frozen=True)
class WriterState:
    draining: bool  # training died; the writer process is committing what it published
    steps_to_come: int | None  # when draining: steps still to be committed
    pid: int | None  # the training process
    writer_pid: int | None
    host: str | None


def lock_info(fd: int) -> dict[str, Any]:
    """What the writer wrote into its open lock file ``fd`` (``{}``: nothing readable)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def writer_state(path: str) -> WriterState | None:
    """The live writer of ``path``, or ``None`` when no process is writing it."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock files are written either
        return None
    # Never a link, and never blocking: a FIFO planted at the lock's name would hang the open.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(lock_path(path), flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # not a lock any writer of ours made
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: a writer lives
        except OSError:
            return None
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # what a killed writer left: nobody holds it
        info = lock_info(fd)
    finally:
        os.close(fd)

    def _int(key: str) -> int | None:
        v = info.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    host = info.get("host")
    return WriterState(
        draining=info.get("state") == "draining",
        steps_to_come=_int("steps_to_come"),
        pid=_int("pid"),
        writer_pid=_int("writer_pid"),
        host=host if isinstance(host, str) else None,
    )


def wait_for_drain(path: str, *, timeout: float, on_wait: object = None) -> bool:
    """Wait while the writer of ``path`` drains after its training died. Returns ``False`` if it
    was still draining after ``timeout`` seconds. ``on_wait(state)`` is called once, first."""
    state = writer_state(path)
    if state is not None and state.draining and callable(on_wait):
        on_wait(state)
    deadline = time.monotonic() + timeout
    delay = 0.02
    while state is not None and state.draining:
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
        state = writer_state(path)
    return True
