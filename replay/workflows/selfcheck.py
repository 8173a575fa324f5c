"""The self-check: replay a live recording's first steps while its run trains (docs/selfcheck.md).

Started by the Recorder (``replay/record/selfcheck.py``) as a child process at the lowest
priority, one thread::

    python -m replay.workflows.selfcheck RUN --after T --steps K [--later S] [--device D]
                                         [--rtol R]

It waits until the writer process has committed step ``T``, replays ``K`` steps from the oldest kept
snapshot as ``replay verify`` would (by re-entry, or through ``build_fn``), and writes its verdict
beside the recording (``run.selfcheck.json``, ``replay/store/selfcheck.py``). When the steps do not
replay it writes **one line** to the training's stderr at once; everything else it (and the re-run
program) prints goes nowhere: the training's output stays the training's.

``--later S``: when the first steps replay, the check then becomes (by ``exec``: a fresh
interpreter, since the re-run program's own modules keep their state) the *later* check, which
waits for the snapshot of step ``S`` and replays ``K`` steps from it (``--from S --earlier A B``).
The first steps of a run can replay while a snapshot taken once training is under way does not
(a DQN step that returns at once while its replay memory fills). ``--rtol``: a
replay on another device than the recording's (a GPU run checked on the CPU) cannot be bitwise;
its losses must then agree within ``R``, which still catches every structural failure (a
program that cannot be rebuilt, a missing object, state changed outside the step).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import math
import os
import signal
import sys
import time
from typing import Any

from ..child import SELF_CHECK, python_module
from ..errors import EntryPointError, RecordingError, ReplayError, first_line
from ..limits import env_number
from ..reports import VerifyReport
from ..safetext import term_safe
from ..store import open_recording
from ..store.liveness import writer_state
from ..store.selfcheck import RTOL, SelfCheck, write_selfcheck
from .session import ReplayOptions
from .verify import run_verify

__all__ = ["run_selfcheck", "judge", "main"]

WAIT = 300.0  # seconds for the writer process to commit the first steps to check
POLL = 0.5  # seconds between looks at the file, waiting for the first steps
POLL_LATER = 2.0  # waiting for the later steps, which may be hours away


def _checkable(run: str, after: int, steps: int, start: int | None = None) -> int | None:
    """The last step to check once the writer has committed step ``after``: ``steps`` steps
    from the oldest kept snapshot, or from the oldest at or after ``start`` (a short run may be
    over, its ring moved on, by now; ``run_verify`` pins them when it opens the file)."""
    try:
        rec = open_recording(run)
    except ReplayError:
        return None
    with rec:
        w = rec.replayable_window()
        if w is not None and start is not None:
            w = w.from_snapshot(start)
        if w is None or w.last < min(after, w.first + steps - 1):
            return None
        return min(w.last, w.first + steps - 1)


def _run_over(run: str, training_pid: int, unheld: list[float]) -> bool:
    """Whether the file can no longer grow: no writer holds it (a writer process still
    committing what a killed run left holds it), and either the training process is gone or
    no writer has held it for a second (its Recorder closed; the process may train on, or
    evaluate, without it). ``unheld``: when this started seeing no writer (kept by the
    caller). Was: the check waited its full 300 s for steps that would never come, an orphan
    outliving the run; and a later check waited for a snapshot of a closed recording for as
    long as its process lived."""
    if writer_state(run) is not None:
        unheld.clear()
        return False
    # The training process started this one: once it exits, even as a zombie nobody reaped
    # yet, this process has another parent.
    if os.getppid() != training_pid:
        return True
    now = time.monotonic()
    if not unheld:
        unheld.append(now)  # a writer taken over by another (store/writer_process.py) is brief
    return now - unheld[0] >= 1.0


def judge(report: VerifyReport, rtol: float | None, device: str) -> SelfCheck:
    """The verdict on ``replay verify``'s report of the checked steps."""
    first = int(report.window[0]) if report.window else 0
    steps = (first, first + max(0, report.replayed_steps - 1))
    if report.deterministic:
        return SelfCheck("ok", f"bitwise on {device}", steps)
    cause = report.cause
    if rtol is not None and (cause is None or cause.kind != "raised"):
        compared = [s for s in report.steps if s.compared]
        close = [s for s in compared if _close(s.loss, s.recorded_loss, rtol) and not s.exception]
        if close and len(close) == len(compared):
            return SelfCheck("ok", f"within rtol {rtol:g} on {device}", steps)
    return SelfCheck(
        "failed",
        f"bitwise on {device}" if rtol is None else f"within rtol {rtol:g} on {device}",
        steps,
        kind=(cause.kind if cause is not None else "") or "differs",
        summary=(cause.summary if cause is not None else "")
        or "the replayed steps differ from the recording",
        hint=cause.hint if cause is not None else "",
    )


def _close(a: Any, b: Any, rtol: float) -> bool:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def run_selfcheck(
    run: str,
    after: int,
    steps: int,
    device: str | None = None,
    rtol: float | None = None,
    training_pid: int | None = None,
    start: int | None = None,
    gpu_bytes: int | None = None,
) -> SelfCheck:
    """Wait for step ``after`` in ``run``, replay ``steps`` steps from its oldest snapshot
    (``start``: from its oldest at or after that step), and judge. ``training_pid``: the
    process recording ``run`` (default: this one's parent). The first steps come within
    ``WAIT`` seconds or not at all; later ones are waited for as long as the run goes on.
    ``gpu_bytes``: what a replay on GPU ``device`` needs free there, read right before it
    replays (:class:`NoRoom` when it is not: the training's memory comes first)."""
    deadline = time.monotonic() + WAIT if start is None else math.inf
    parent = training_pid if training_pid is not None else os.getppid()
    unheld: list[float] = []
    while _checkable(run, after, steps, start) is None:
        if time.monotonic() > deadline:
            return SelfCheck("error", summary=f"step {after} did not reach the file in {WAIT:g} s")
        if _run_over(run, parent, unheld):
            return SelfCheck("error", summary=f"the run ended before step {after} reached the file")
        time.sleep(POLL if start is None else POLL_LATER)
    if gpu_bytes is not None and device is not None and device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        if free < gpu_bytes:
            raise NoRoom(free, gpu_bytes)
    t0 = time.monotonic()
    try:
        report = run_verify(run, options=ReplayOptions(device), first_steps=steps, start=start)
    except EntryPointError as e:
        return SelfCheck(
            "failed",
            kind="program",
            summary=str(e),
            hint="replay runs the program again up to its Recorder (docs/reentry.md)",
        )
    except RecordingError as e:  # the file moved on under the check (a fast run's ring)
        return SelfCheck("error", summary=str(e))
    except ReplayError as e:
        return SelfCheck("failed", kind="replay", summary=str(e))
    verdict = judge(report, rtol, device or report.device or "cpu")
    return dataclasses.replace(verdict, seconds=round(time.monotonic() - t0, 3))


class NoRoom(Exception):
    """The training GPU has no room for a replay beside training (it grew since the check
    started): the check goes on on the CPU."""

    def __init__(self, free: int, need: int) -> None:
        super().__init__(f"{free >> 20} MiB free of the {need >> 20} MiB a replay needs")


def _quiet(report_fd: int | None) -> int:
    """Send this process's stdout and stderr nowhere; return the descriptor for the one line a
    failed check writes: ``report_fd`` (the pipe the training process reads and copies onto its
    stderr), or, started by hand, a copy of the old stderr."""
    saved = report_fd if report_fd is not None else os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    return saved


def _dies_with(training_pid: int | None) -> bool:
    """Ask the kernel to end this process when the training process that started it ends (a
    check never outlives its run; Linux's parent-death signal, kept across the ``exec`` into
    the later check); ``False`` when that process is gone already."""
    if training_pid is None:
        return True
    with contextlib.suppress(OSError, AttributeError):  # (not Linux: the waits end with the run)
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    return os.getppid() == training_pid


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m replay.workflows.selfcheck")
    p.add_argument("run")
    p.add_argument("--after", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--rtol", type=float, default=None)
    p.add_argument("--training-pid", type=int, default=None)
    p.add_argument("--run-id", default=None, help="the recording's run id, kept in the verdict")
    p.add_argument("--later", type=int, default=None, help="then check from this step's snapshot")
    p.add_argument("--from", dest="start", type=int, default=None, help="(the later check)")
    p.add_argument("--earlier", type=int, nargs=2, default=None, help="(the first steps checked)")
    p.add_argument("--report-fd", type=int, default=None, help="where the one line goes")
    p.add_argument("--gpu-bytes", type=int, default=None, help="room a GPU replay needs")
    args = p.parse_args(argv)
    if not _dies_with(args.training_pid):
        return 0  # the run is over already: nothing to check for anyone
    with contextlib.suppress(OSError):  # the training's cores come first (how much: 0..19)
        os.nice(min(19, max(0, env_number("REPLAY_SELF_CHECK_NICE", 19))))
    err = _quiet(args.report_fd)
    try:
        verdict = run_selfcheck(
            args.run, args.after, args.steps, args.device, args.rtol, args.training_pid,
            args.start, args.gpu_bytes,
        )  # fmt: skip
    except NoRoom:
        # no second model on the training GPU: the same check on the CPU, with no GPU in sight
        _exec_check(args, err, {"device": "cpu", "rtol": RTOL, "gpu_bytes": None}, cpu_only=True)
        verdict = SelfCheck("error", summary="the check could not move to the CPU")
    except BaseException as e:  # noqa: BLE001 - the check breaking says nothing of the recording
        verdict = SelfCheck("error", summary=f"{type(e).__name__}: {first_line(e)[:300]}")
    earlier = tuple(args.earlier) if args.earlier else None
    if earlier is not None and verdict.status == "error":
        return 0  # (the run ended first, most often): the first steps' verdict stands
    verdict = dataclasses.replace(verdict, run_id=args.run_id, earlier=earlier, pid=os.getpid())
    with contextlib.suppress(OSError):
        write_selfcheck(args.run, verdict)
    if verdict.failed:
        line = term_safe(f"replay: warning: {args.run} {verdict.line()}; training goes on")
        os.write(err, (line + "\n").encode("utf-8", "replace"))
    elif verdict.status == "ok" and args.later is not None and verdict.steps is not None:
        if verdict.steps[0] < args.later:
            _become_later_check(args, verdict.steps, err)
    return 0


def _become_later_check(args: argparse.Namespace, earlier: tuple[int, int], err: int) -> None:
    """Replace this process with the later check (a fresh interpreter: the re-run program's
    modules keep the state the first replay left in them)."""
    later = {"after": args.later + args.steps - 1, "start": args.later, "later": None}
    _exec_check(args, err, {**later, "earlier": list(earlier)})


def _exec_check(
    args: argparse.Namespace, err: int, changes: dict[str, Any], cpu_only: bool = False
) -> None:
    """Replace this process with the check ``args`` describe, ``changes`` made (``cpu_only``:
    with no GPU visible). Exit handlers run first (coverage, logging); the report pipe goes on
    (started by hand: the old stderr goes back to descriptor 2). Returns only when the
    ``exec`` failed."""
    a = {**vars(args), **changes}
    cmd = python_module(SELF_CHECK, a["run"])
    cmd += ["--after", str(a["after"]), "--steps", str(a["steps"])]
    cmd += ["--training-pid", str(a["training_pid"] or os.getppid())]
    for flag, key in (
        ("--from", "start"), ("--later", "later"), ("--run-id", "run_id"),
        ("--device", "device"), ("--gpu-bytes", "gpu_bytes"), ("--rtol", "rtol"),
    ):  # fmt: skip
        if a[key] is not None:
            cmd += [flag, str(a[key])]  # (--rtol: a float's str is its repr, every digit)
    if a["earlier"] is not None:
        cmd += ["--earlier", *map(str, a["earlier"])]
    if args.report_fd is not None:
        cmd += ["--report-fd", str(err)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="") if cpu_only else None
    atexit._run_exitfuncs()
    sys.stdout.flush()
    if args.report_fd is None:
        os.dup2(err, 2)
    try:
        if env is None:
            os.execv(sys.executable, cmd)
        os.execve(sys.executable, cmd, env)
    except OSError:  # (the interpreter gone since): the verdict so far stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)


if __name__ == "__main__":
    sys.exit(main())
