"""``replay preflight``: before a nine-hour job, check that its steps replay bitwise.

Runs the user's own command for a few steps with recording into a temporary file (the first
``Recorder`` of that process takes its path and step count from ``REPLAY_PREFLIGHT`` and ends
the run cleanly once they are recorded), then replays them with ``replay verify`` in a fresh
process, as ``replay bisect`` would after a crash, and says whether the run is replayable and,
if not, why and what to change. No torch here: both halves run in child processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .capture.guard import PREFLIGHT_ENV
from .child import ChildRun, end_group, run_replay, start_group
from .reports import BisectReport, VerifyReport
from .store.tmpdirs import private_dir

__all__ = ["PreflightReport", "run_preflight"]

_TAIL = 12  # lines of the run's own output kept for a report


@dataclass
class PreflightReport:
    command: list[str]
    steps: int
    replayable: bool = False
    reason: str = ""  # why not, in a sentence: the cause kind or what went wrong first
    run_exit: int | None = None
    run_seconds: float = 0.0
    run_tail: list[str] = field(default_factory=list)
    recording: str | None = None
    verify: VerifyReport | None = None  # what ``replay verify --json`` printed
    verify_exit: int | None = None
    verify_error: str | None = None
    kept: str | None = None  # where the recording was kept (--keep, or a failed run's)
    # the run failed within the preflight steps: ``replay bisect --json`` of its recording, or
    # why bisect gave none
    failure: BisectReport | None = None
    failure_error: str | None = None
    ranks: int | None = None  # a rank set (a torchrun command): how many rank files

    def json(self) -> dict[str, Any]:
        v = self.verify
        return {
            "replayable": self.replayable,
            "reason": self.reason,
            "command": self.command,
            "steps": self.steps,
            "run_exit": self.run_exit,
            "run_seconds": round(self.run_seconds, 3),
            "verify_exit": self.verify_exit,
            "verify_error": self.verify_error,
            "cause": v.cause.to_json() if v is not None and v.cause is not None else None,
            "first_divergence": (
                v.first_divergence.to_json() if v is not None and v.first_divergence else None
            ),
            "replayed_steps": v.replayed_steps if v is not None else None,
            "failure": (
                {"error": self.failure_error}
                if self.failure_error is not None
                else None
                if self.failure is None
                else self.failure.to_json()
            ),
            "ranks": self.ranks,
            "recording": self.kept,
        }


def _stopped(timeout: float | None) -> str:
    return f"(replay preflight: stopped the run after {timeout:g} s)"


def _run_streaming(
    cmd: list[str], env: dict[str, str], timeout: float | None, echo: Callable[[str], None]
) -> tuple[int, list[str]]:
    """Run ``cmd`` in its own process group, passing its output on line by line (to our
    stderr); keep the last lines. At ``timeout`` the whole group is killed: a silent command
    (``sleep 600``) or a forked child still holding the pipe never extends it, since the pipe is
    read on a thread and waited for only until the deadline."""
    tail: list[str] = []
    proc = start_group(cmd, env, stderr=subprocess.STDOUT)
    deadline = None if timeout is None else time.monotonic() + timeout
    lines: queue.Queue[str | None] = queue.Queue()
    out = proc.stdout
    assert out is not None

    def pump() -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in out:
                lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, name="replay-preflight-output", daemon=True).start()
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                end_group(proc)
                tail.append(_stopped(timeout))
                break
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                break
            echo(line)
            tail.append(line)
            del tail[:-_TAIL]
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return proc.wait(timeout=left), tail
        except subprocess.TimeoutExpired:
            end_group(proc)
            tail.append(_stopped(timeout))
            return proc.wait(), tail
    finally:
        if proc.poll() is None:
            end_group(proc)


def _replay_child(verb: str, path: str, timeout: float | None) -> ChildRun:
    """``replay VERB PATH --json`` on the recording just made, as any user would run it."""
    env = {k: v for k, v in os.environ.items() if k != PREFLIGHT_ENV}
    return run_replay(verb, path, "--json", timeout=timeout, env=env)


def run_preflight(
    command: list[str],
    *,
    steps: int = 8,
    keep: str | None = None,
    timeout: float | None = None,
    echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> PreflightReport:
    """Record ``steps`` steps of ``command`` and replay them in a fresh process."""
    rep = PreflightReport(list(command), steps)
    if keep:
        # ``--keep PATH`` names a regular file (replaced) or nothing yet: never a device, a FIFO,
        # a socket or a link (as root, ``--keep /dev/full`` replaced the machine's /dev/full)
        from .errors import UsageError
        from .store.safefile import UnsafePath, refuse_non_regular

        try:
            refuse_non_regular(keep, "--keep")
        except UnsafePath as e:
            raise UsageError(str(e).replace("Record to", "Name")) from None
    # Removed on every path (a failed run, a timeout, an error), unless the recording is kept.
    tmp = private_dir("preflight")
    try:
        _record_and_verify(rep, command, steps, keep, timeout, echo, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if rep.verify is not None and rep.verify.deterministic and rep.run_exit == 0:
        rep.replayable = True
        rep.reason = "every replayed step matches the recording bitwise"
    elif rep.verify is not None and not rep.verify.deterministic:
        cause = rep.verify.cause
        rep.reason = (cause.kind if cause else "") or "the replay differs from the recording"
    elif rep.verify_error is not None:
        rep.reason = rep.verify_error
    return rep


def _record_and_verify(
    rep: PreflightReport,
    command: list[str],
    steps: int,
    keep: str | None,
    timeout: float | None,
    echo: Callable[[str], None],
    tmp: str,
) -> None:
    path = os.path.abspath(keep) if keep else os.path.join(tmp, "preflight.h5")
    env = {**os.environ, PREFLIGHT_ENV: json.dumps({"path": path, "steps": steps})}
    t0 = time.perf_counter()
    try:
        rep.run_exit, rep.run_tail = _run_streaming(command, env, timeout, echo)
    except OSError as e:
        rep.reason = f"the command could not start: {e.strerror or e}"
        return
    rep.run_seconds = time.perf_counter() - t0
    if rep.run_tail[-1:] == [_stopped(timeout)]:
        rep.reason = f"the command was still running after --timeout {timeout:g} s: ended"
    files = _recorded_files(path)  # one file, or a torchrun command's rank set
    if len(files) > 1 or (files and files[0] != path):
        rep.ranks = len(files)
    if not files:
        rep.reason = rep.reason or (
            "the command created no replay.Recorder (or died before its first step)"
            if rep.run_exit == 0
            else f"the command exited with {rep.run_exit} before recording a step"
        )
        return
    rep.recording = path
    rep.kept = path if keep else None
    if rep.run_exit not in (0, None) and not rep.reason:
        rep.reason = f"the command exited with {rep.run_exit} while recording"
        # its steps may still replay: verify says more than the exit code alone
    run = _replay_child("verify", path, timeout)
    rep.verify_exit = run.code
    if run.code in (0, 1):
        try:
            rep.verify = VerifyReport.from_json(json.loads(run.stdout))
        except (ValueError, KeyError, TypeError):
            rep.verify_error = "replay verify printed no JSON"
    else:
        rep.verify_error = run.replay_error(run.error_line("no output"))
    if rep.run_exit not in (0, None) and _health_failed(path):
        _bisect_failure(rep, path, keep, timeout)


def _recorded_files(path: str) -> list[str]:
    """The recording preflight asked for: ``path``, or the rank files a torchrun command's
    ranks wrote beside it (``preflight.rank0.h5``, ...)."""
    if os.path.isfile(path):
        return [path]
    from .errors import RecordingError
    from .ranks.names import resolve_rank_files

    try:
        return resolve_rank_files(path) or []
    except RecordingError:
        return []


def _health_failed(path: str) -> bool:
    """Whether the recording's health shows a NaN/Inf or an exception (torch-free)."""
    from .errors import ReplayError
    from .store import open_recording

    with contextlib.suppress(ReplayError):  # (an unreadable recording shows nothing)
        for f in _recorded_files(path):
            with open_recording(f) as rec:
                if any(s is not None for s in rec.first_bad().values()):
                    return True
    return False


def _bisect_failure(
    rep: PreflightReport, path: str, keep: str | None, timeout: float | None
) -> None:
    """The run failed within the preflight steps: that is the finding. Bisect it, and keep the
    recording (with its forensics) where the user can open it."""
    run = _replay_child("bisect", path, timeout)
    try:
        rep.failure = BisectReport.from_json(json.loads(run.stdout)) if run.code in (0, 1) else None
    except (ValueError, KeyError, TypeError):
        rep.failure = None
    if rep.failure is None:
        rep.failure_error = run.replay_error("no verdict")
    step = rep.failure.first_bad_step if rep.failure is not None else None
    rep.reason = (
        f"the run failed at step {step} within the preflight steps"
        if step is not None
        else "the run failed within the preflight steps"
    )
    if keep:
        rep.kept = os.path.abspath(keep)
        return
    rep.recording = rep.kept = _keep_out_of_tmp(path)


def _keep_out_of_tmp(path: str) -> str:
    """Move a failed run's recording (its rank files, forensics sidecars) out of the temporary
    folder into the working directory, under a new name: ``replay-preflight-<time>.h5``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest_dir = os.getcwd()
    base = os.path.join(dest_dir, f"replay-preflight-{stamp}.h5")
    n = 1
    while os.path.lexists(base):
        base = os.path.join(dest_dir, f"replay-preflight-{stamp}-{n}.h5")
        n += 1
    src_root = os.path.splitext(path)[0]
    dst_root = os.path.splitext(base)[0]
    folder = os.path.dirname(path)
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if full.startswith(src_root + ".") and os.path.isfile(full) and not os.path.islink(full):
            shutil.move(full, dst_root + full[len(src_root) :])
    return base
