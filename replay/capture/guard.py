"""Three process-wide modes a Recorder must know about: replay re-entering the program, replay
importing user code, and preflight.

**Replay re-entering the program** (docs/reentry.md). ``replay bisect`` runs the recorded
program again in its own process (:func:`reentering`); the first Recorder (or framework
callback) the program constructs hands its live objects and step function to replay
(:func:`take_over`; a Recorder made without a step function does so at its first step, which
brings one), which restores the snapshot into them and replays; the Recorder then raises
:class:`ReplayFinished`, which unwinds the program before any training.

**Replay importing user code.** ``replay bisect`` imports the recorded script to find
``build_fn`` and ``step_fn``. A script that trains at import time (its loop not under
``if __name__ == "__main__":``) would start a second training run and write a new recording; a
Recorder constructed while replay imports or builds refuses to start instead, and the import
fails with that reason even when the script caught the exception.

**Preflight.** ``replay preflight -- python train.py ...`` runs the user's own command with
``REPLAY_PREFLIGHT`` set: the first Recorder of that process records into the given file, takes
snapshots often enough for the check, and ends the run cleanly after the given number of steps.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import EntryPointError

__all__ = [
    "LiveProgram",
    "ReplayFinished",
    "reentering",
    "replaying",
    "take_over",
    "takes_over_at_first_step",
    "TrainingAtImportError",
    "PreflightStop",
    "Preflight",
    "replay_runs_user_code",
    "refuse_if_replaying",
    "preflight_from_env",
    "PREFLIGHT_ENV",
    "REENTERED_ENV",
    "StartedByReplayedProgram",
]

PREFLIGHT_ENV = "REPLAY_PREFLIGHT"
# Set by ``reentering`` to the pid of the process that re-runs the program: a process that the
# re-run program starts (multiprocessing, a subprocess) inherits it, and its Recorder refuses.
REENTERED_ENV = "REPLAY_REENTERED_BY"

_running: list[str] = []  # what replay is importing or building now (innermost last)
_refused: list[str] = []  # a Recorder was refused while replay ran user code


class TrainingAtImportError(EntryPointError):
    """A Recorder was constructed while replay imported or built the recorded entry points."""


class PreflightStop(SystemExit):
    """Ends a preflight run cleanly (exit 0) once its steps are recorded.

    A ``SystemExit``: the user's ``except Exception`` around the loop lets it through, and the
    ``with Recorder(...)`` block closes the file on the way out.
    """

    def __init__(self) -> None:
        super().__init__(0)


@contextlib.contextmanager
def replay_runs_user_code(what: str) -> Iterator[None]:
    """Around replay's import of the user's file and its call of ``build_fn``."""
    _running.append(what)
    mark = len(_refused)
    try:
        yield
    except BaseException:
        if len(_refused) > mark:  # whatever the import turned the refusal into
            raise TrainingAtImportError(_refused[-1]) from None
        raise
    finally:
        _running.pop()
    if len(_refused) > mark:  # the script caught the refusal and went on
        raise TrainingAtImportError(_refused[-1])


class StartedByReplayedProgram(SystemExit):
    """A Recorder made in a process the re-run program started (hogwild's ``mp.Process``
    workers): replay takes over a Recorder in the process it re-runs, never in one that process
    starts, so this one ends its process before anything trains or is written. A
    ``SystemExit`` with the reason: multiprocessing and Python print it as one line."""


def refuse_if_replaying() -> None:
    """Called first by ``Recorder.__init__``: never a second training run under replay."""
    by = os.environ.get(REENTERED_ENV)
    if by and _owner != [os.getpid()]:
        raise StartedByReplayedProgram(
            f"replay: a process the replayed program started (pid {os.getpid()}) constructed a "
            f"replay.Recorder; replay re-runs the program in pid {by} and takes over a Recorder "
            "there, never in a process it starts (multiprocessing): this process does not "
            "train. Record such a program with build_fn (docs/recording.md)"
        )
    if not _running:
        return
    msg = (
        f"{_running[-1]} constructed a replay.Recorder: the script trains when it is imported. "
        'Move the training loop under `if __name__ == "__main__":` (replay imports the file '
        "to find build_fn and step_fn, and must not run the training job again)"
    )
    _refused.append(msg)
    raise TrainingAtImportError(msg)


@dataclass
class LiveProgram:
    """What the re-run program handed its first Recorder: the objects (``model`` the plain
    module), the step function, and the model the step is called with (a DDP or compiled
    wrapper, ``None`` when it is the plain module)."""

    objects: Any  # capture.objects.RunObjects
    step_fn: Callable[..., Any]
    wrapper: Any = None
    loader: Any = None  # Recorder(loader=...): batches recorded by reference are drawn from it


class ReplayFinished(BaseException):
    """Unwinds the re-run program once replay is done with it.

    A ``BaseException`` that is neither ``SystemExit`` nor ``KeyboardInterrupt``: the program's
    ``except Exception`` lets it through, its ``finally`` blocks and context managers run, and
    frameworks that tear down on any exception (Lightning's ``fit``) tear down and re-raise.
    """

    def __init__(self) -> None:
        super().__init__("replay took over this program; its training does not run")


_reentry: list[Callable[[LiveProgram], None]] = []
_taken: list[bool] = []
_owner: list[int] = []  # the pid ``reentering`` runs in (a forked child is another process)


@contextlib.contextmanager
def reentering(on_takeover: Callable[[LiveProgram], None]) -> Iterator[list[bool]]:
    """Around replay's run of the recorded program: its first Recorder calls ``on_takeover``.
    Yields a list that holds ``True`` once a Recorder took over. NB: not reentrant."""
    _reentry[:] = [on_takeover]
    _taken.clear()
    _owner[:] = [os.getpid()]
    before = os.environ.get(REENTERED_ENV)
    os.environ[REENTERED_ENV] = str(os.getpid())
    try:
        yield _taken
    finally:
        _reentry.clear()
        _owner.clear()
        if before is None:
            os.environ.pop(REENTERED_ENV, None)
        else:
            os.environ[REENTERED_ENV] = before


def replaying() -> bool:
    """True while ``replay`` runs this program again to replay its recording (everything before
    the Recorder runs again; the Recorder then replays and ends the program). A program may skip
    a logging service or a slow download with it::

        if not replay.replaying():
            wandb.init(...)
    """
    return bool(_reentry) or bool(_taken)


def take_over(live: Callable[[], LiveProgram]) -> None:
    """Called first thing by a Recorder: under re-entry, replay takes the program's objects and
    then :class:`ReplayFinished` ends the program; otherwise nothing. A Recorder constructed
    after the take-over (the program caught ``ReplayFinished``) ends it again."""
    if _taken:
        raise ReplayFinished()
    if not _reentry:
        return
    on = _reentry.pop()
    _taken.append(True)
    on(live())  # never raises: the replay's outcome, or its error, is kept by the caller
    raise ReplayFinished()


def takes_over_at_first_step() -> bool:
    """Whether replay is re-running this program and no Recorder took over yet: a Recorder
    made without a step function then waits for its first step, which brings one, and takes
    over there (:func:`take_over` with it) instead of at its construction."""
    return bool(_reentry) and not _taken


@dataclass
class Preflight:
    path: str
    steps: int


_claimed: list[bool] = []


def preflight_from_env() -> Preflight | None:
    """The preflight request for this process's first Recorder, if ``replay preflight`` ran it."""
    raw = os.environ.get(PREFLIGHT_ENV)
    if not raw or _claimed:
        return None
    try:
        spec: Any = json.loads(raw)
        pf = Preflight(str(spec["path"]), max(2, int(spec["steps"])))
    except (ValueError, KeyError, TypeError):
        return None
    _claimed.append(True)
    return pf
