"""Another ``replay`` command in a child process: the one way replay's own code runs one
(``preflight`` verifies and bisects the run it recorded; the TUI traces a step and tries a change
without importing torch or running user code itself).

The child is ``python -m replay VERB ARGS`` in its own process group, stdin closed, its output
captured as text; at ``timeout`` the whole group is killed (its recorder's writer and DataLoader
workers with it).

Every Python child the project starts (these, the writer process, the self-check, the rank
workers, the reader's probe) is started by :func:`python_module`: ``python -m MOD`` would put
its working directory first on ``sys.path``, so a ``replay.py`` or ``replay/`` there (an RL
replay buffer is a common file name) would be imported instead of this package, and run. The
child is ``python -c BOOT MOD ARGS`` instead: ``BOOT`` replaces that first entry with the folder
this package was imported from before it imports anything, checks that ``replay`` is this one,
and runs ``MOD`` as ``__main__``. ``PYTHONPATH`` keeps working (a program's own modules).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ChildRun",
    "start_group",
    "end_group",
    "run_replay",
    "python_module",
    "free_port",
    "CLI",
    "WRITER",
    "SELF_CHECK",
    "RANK_WORKER",
]

# The child entry points: every module the project runs as a child process's ``__main__``.
CLI = "replay"  # another replay command (this module's run_replay; preflight; the TUI)
WRITER = "replay.store.writer_process"  # the recorder's writer process
SELF_CHECK = "replay.workflows.selfcheck"  # the background self-check
RANK_WORKER = "replay.workflows.rank_worker"  # one rank of a rank set replayed together
ENTRY_POINTS = (CLI, WRITER, SELF_CHECK, RANK_WORKER)

# The folder holding this ``replay`` package: a child imports it from there, and only there.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOOT = (
    "import sys\n"
    f"if sys.argv[2] == {SELF_CHECK!r}:  # ends with the training that started it (selfcheck.md)\n"
    "    import ctypes\n"
    "    try:\n"
    "        ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL\n"
    "    except (OSError, AttributeError):\n"
    "        pass\n"
    "sys.path[0:1] = [sys.argv[1]]\n"
    "import os, runpy, replay\n"
    "if os.path.dirname(os.path.dirname(os.path.abspath(replay.__file__))) != sys.argv[1]:\n"
    "    sys.exit('replay: error: the child imported ' + replay.__file__ + ', not ' + sys.argv[1])\n"
    "module = sys.argv[2]\n"
    "del sys.argv[1:3]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


def python_module(module: str, *args: str) -> list[str]:
    """The command line that runs ``module`` of this package as ``__main__`` in a child Python,
    whatever its working directory holds (module docstring)."""
    if module not in ENTRY_POINTS:
        raise ValueError(f"{module} is not one of replay's child entry points")
    return [sys.executable, "-c", _BOOT, ROOT, module, *args]


def free_port() -> int:
    """A TCP port free on this host now: the rendezvous (``MASTER_PORT``) of the children about
    to be started."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ChildRun:
    code: int  # the exit code; -1 when it was killed at the timeout
    stdout: str
    stderr: str

    def error_line(self, otherwise: str | None = None) -> str:
        """What went wrong in one line: the last line of stderr, else ``otherwise`` or the code."""
        return (self.stderr.strip().splitlines() or [otherwise or f"exit {self.code}"])[-1]

    def replay_error(self, otherwise: str) -> str:
        """The message of the child's last ``replay: error:`` line, else ``otherwise``."""
        errs = [ln for ln in self.stderr.splitlines() if ln.startswith("replay: error:")]
        return errs[-1].removeprefix("replay: error: ") if errs else otherwise


def start_group(
    cmd: list[str], env: Mapping[str, str] | None, *, stderr: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """``cmd`` as the leader of a new process group (session), stdin closed, stdout piped as
    text (``stderr``: piped too, or ``subprocess.STDOUT`` to merge it)."""
    return subprocess.Popen(
        cmd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        errors="replace",
        start_new_session=True,
    )


def end_group(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc``'s whole process group (it was started as its own session): the run's
    forked children, its recorder's writer and DataLoader workers go with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_replay(
    verb: str, *args: str, timeout: float | None = None, env: Mapping[str, str] | None = None
) -> ChildRun:
    """``replay VERB ARGS`` in a fresh process group (``env``: its environment, this one's by
    default), killed whole at ``timeout`` seconds."""
    proc = start_group(python_module(CLI, verb, *args), env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(proc)
        proc.communicate()
        return ChildRun(-1, "", f"replay: error: replay {verb} did not finish in {timeout:g} s")
    finally:
        if proc.poll() is None:
            end_group(proc)
    return ChildRun(proc.returncode, stdout, stderr)
