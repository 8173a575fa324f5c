"""One exception hierarchy; every message says what to do next. No torch import here."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

__all__ = [
    "ReplayError",
    "UsageError",
    "RecordingError",
    "IncompleteRankSetError",
    "EntryPointError",
    "NonFiniteLossError",
    "RecorderWarning",
    "warn_at_user_line",
    "first_line",
    "EXIT_OK",
    "EXIT_NOTHING_FOUND",
    "EXIT_USAGE",
    "EXIT_BAD_RECORDING",
    "EXIT_BAD_ENTRY",
    "EXIT_REPLAY_FAILED",
    "EXIT_INTERNAL",
    "EXIT_INCOMPLETE_RANKS",
    "EXIT_DATA_CHANGED",
    "DataChangedError",
    "EXIT_INTERRUPTED",
    "exit_code_of",
    "error_of_exit_code",
]

# Exit codes shared by every command (documented in the README).
EXIT_OK = 0
# the command's question has no: bisect on a healthy window, verify with a divergence, overfit
# that does not overfit, whatif where no change removes the failure, preflight not replayable
EXIT_NOTHING_FOUND = 1
EXIT_USAGE = 2  # click's own code for misuse
EXIT_BAD_RECORDING = 3  # missing, unreadable, foreign, newer or empty recording
EXIT_BAD_ENTRY = 4  # an entry point cannot be imported, or a foreign recording's code refused
EXIT_REPLAY_FAILED = 5  # replay itself failed (state cannot be restored, device missing)
EXIT_INTERNAL = 6  # an unexpected error: a bug in replay (the catch-all in replay.cli.main)
EXIT_INCOMPLETE_RANKS = 7  # a DDP rank set with a missing or damaged rank file
EXIT_DATA_CHANGED = 8  # a batch recorded by reference is not what the dataset gives now
EXIT_INTERRUPTED = 130


class ReplayError(Exception):
    """Base of every error ``replay`` raises on purpose."""

    exit_code = EXIT_REPLAY_FAILED


class UsageError(ReplayError):
    """The command was called wrongly (a malformed ``--entry``...): exit 2, as click's own."""

    exit_code = EXIT_USAGE


class RecordingError(ReplayError):
    """The file is not a usable recording (missing, not HDF5, foreign, too new, truncated)."""

    exit_code = EXIT_BAD_RECORDING


class IncompleteRankSetError(RecordingError):
    """A DDP rank set lacks a rank's file or holds a damaged one: the first (step, rank) over
    the set cannot be known, so nothing is guessed over it (exit 7)."""

    exit_code = EXIT_INCOMPLETE_RANKS


class DataChangedError(ReplayError):
    """A batch recorded by reference, drawn again from the dataset, does not match its digest:
    the data changed since the recording, and the step is not replayed."""

    exit_code = EXIT_DATA_CHANGED


class EntryPointError(ReplayError):
    """A recorded entry point (``build_fn``/``step_fn``) cannot be imported or is unusable."""

    exit_code = EXIT_BAD_ENTRY


class NonFiniteLossError(FloatingPointError):
    """Raised by ``Recorder.step`` after recording a step whose loss is NaN or infinite.

    The step is already on disk: run ``replay bisect RUN.h5`` to find where it started.
    """

    def __init__(
        self,
        step: int,
        loss: float,
        path: str,
        *,
        ranks: tuple[int, ...] | None = None,
        bisect_path: str | None = None,
        stopped_at: int | None = None,
    ) -> None:
        # Under DDP every rank raises at the same step; ``ranks`` names the ones whose own loss
        # or gradients went bad (this rank's loss may well be finite), ``bisect_path`` is the
        # base path that names the whole rank set. ``stopped_at``: the step the ranks stopped
        # at when it is later than ``step`` (a loss that went bad with finite gradients is
        # agreed on at the next gradient all-reduce).
        self.step, self.loss, self.path, self.ranks = step, loss, path, ranks
        self.stopped_at = step if stopped_at is None else stopped_at
        if ranks is None:
            what = f"loss is {loss} at step {step}"
        else:
            who = ", ".join(map(str, ranks))
            what = f"non-finite loss or gradients on rank{'s' if len(ranks) > 1 else ''} {who} at "
            if self.stopped_at == step:
                what += f"step {step} (this rank's loss: {loss}); every rank stops at this step"
            else:
                what += (
                    f"step {step}; every rank stops at step {self.stopped_at} (this rank's loss "
                    f"there: {loss})"
                )
        super().__init__(
            f"{what}; the step is recorded in {path}. "
            f"Run `replay bisect {bisect_path or path}` to find the first op that produced it."
        )


class RecorderWarning(UserWarning):
    """The recorder degraded (stopped recording, throttled) but training goes on."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _outside(frame: FrameType | None) -> tuple[FrameType | None, int]:
    """The first frame outside this package from ``frame`` out, and its ``stacklevel``."""
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return frame, level


def user_line() -> tuple[str, int] | None:
    """``(file, line)`` of the program's own line that called into replay (``None``: none)."""
    frame, _ = _outside(sys._getframe(0).f_back)
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def warn_at_user_line(message: str, made_at: tuple[str, int] | None = None) -> None:
    """A :class:`RecorderWarning` shown at the program's own line: the first frame outside this
    package, however deep in it the warning was found (``rec.step``, ``replay.step``, a capture
    helper), where a fixed ``stacklevel`` named ``replay/__init__.py`` for a step handed over
    with ``replay.step``. Call it on the training thread. ``made_at``: the line to name when
    no frame of the program's is left (interpreter exit, which warnings calls ``sys:1``)."""
    frame, level = _outside(sys._getframe(0).f_back)  # (None at exit: atexit calls from C)
    if frame is None and made_at is not None:
        warnings.warn_explicit(message, RecorderWarning, *made_at)
        return
    warnings.warn(message, RecorderWarning, stacklevel=level)


def first_line(error: BaseException) -> str:
    """How an error is quoted inside one of replay's one-line messages: the first line of its
    message, or its type's name when the message is empty."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def exit_code_of(error: BaseException) -> int:
    """The exit code an exception ends a command with, the one mapping every command, the TUI
    and each rank of a multi-rank replay use: a :class:`ReplayError` its own, an interrupt 130,
    anything else :data:`EXIT_INTERNAL` (a bug in replay)."""
    if isinstance(error, ReplayError):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_INTERNAL


def error_of_exit_code(code: int, message: str) -> ReplayError:
    """The other way: the error a child's exit code stands for (a rank's, in multirank), with
    ``message``; a code of no :class:`ReplayError` of its own is a failed replay."""
    for cls in (
        UsageError,
        RecordingError,
        EntryPointError,
        IncompleteRankSetError,
        DataChangedError,
    ):
        if cls.exit_code == code:
            return cls(message)
    return ReplayError(message)
