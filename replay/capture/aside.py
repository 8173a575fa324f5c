"""One thread beside training that runs a job while the training thread goes on: the gradient
probe's norm on the CPU, computed while the optimizer updates the parameters (``probe.py`` says
when that is safe). torch releases the GIL inside its kernels, so the two run on two cores.

The thread is started on first use, once per process (a forked child starts its own), and is a
daemon: a process that exits never waits for it.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Job", "run_aside"]


class Job:
    """A job handed to the thread; :meth:`result` waits for it (and re-raises what it raised)."""

    __slots__ = ("fn", "done", "value", "error")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def result(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


_jobs: queue.SimpleQueue[Job] | None = None
_pid = 0


def _work(jobs: queue.SimpleQueue[Job]) -> None:
    while True:
        job = jobs.get()
        try:
            job.value = job.fn()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits for the job
            job.error = e
        finally:
            job.fn = _done  # (drops what the job held: gradients, until the next step)
            job.done.set()


def _done() -> None:
    return None


def run_aside(fn: Callable[[], Any]) -> Job:
    """Start ``fn`` on the thread beside training; the returned job waits for it."""
    global _jobs, _pid
    if _jobs is None or _pid != os.getpid():
        _jobs, _pid = queue.SimpleQueue(), os.getpid()
        threading.Thread(target=_work, args=(_jobs,), name="replay-aside", daemon=True).start()
    job = Job(fn)
    _jobs.put(job)
    return job
