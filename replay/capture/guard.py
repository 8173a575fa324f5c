"""Two process-wide modes a Recorder must know about: replay importing user code, and preflight.

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import EntryPointError

__all__ = [
    "TrainingAtImportError",
    "PreflightStop",
    "Preflight",
    "replay_runs_user_code",
    "refuse_if_replaying",
    "recorder_started_during",
    "preflight_from_env",
    "PREFLIGHT_ENV",
]

PREFLIGHT_ENV = "REPLAY_PREFLIGHT"

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


def refuse_if_replaying() -> None:
    """Called first by ``Recorder.__init__``: never a second training run under replay."""
    if not _running:
        return
    msg = (
        f"{_running[-1]} constructed a replay.Recorder: the script trains when it is imported. "
        'Move the training loop under `if __name__ == "__main__":` (replay imports the file '
        "to find build_fn and step_fn, and must not run the training job again)"
    )
    _refused.append(msg)
    raise TrainingAtImportError(msg)


def recorder_started_during() -> bool:
    return bool(_refused)


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
