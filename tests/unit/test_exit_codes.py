"""One mapping between exceptions and exit codes (replay.errors), used by every command, the TUI
and the ranks of a multi-rank replay (issue 34, item 4: three copies, the TUI's knew two codes)."""

from __future__ import annotations

import pytest

from replay.errors import (
    EXIT_BAD_ENTRY,
    EXIT_BAD_RECORDING,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_REPLAY_FAILED,
    EXIT_USAGE,
    EntryPointError,
    RecordingError,
    ReplayError,
    UsageError,
    error_of_exit_code,
    exit_code_of,
)
from replay.workflows.outdir import ExportWriteError


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UsageError("x"), EXIT_USAGE),
        (RecordingError("x"), EXIT_BAD_RECORDING),
        (EntryPointError("x"), EXIT_BAD_ENTRY),
        (ReplayError("x"), EXIT_REPLAY_FAILED),
        (KeyboardInterrupt(), EXIT_INTERRUPTED),
        (ValueError("x"), EXIT_INTERNAL),
    ],
)
def test_each_error_has_one_exit_code_and_a_rank_s_code_comes_back_as_its_error(error, code):
    assert exit_code_of(error) == code
    if isinstance(error, ReplayError):
        back = error_of_exit_code(code, "rank 1: x")
        assert type(back) is type(error) and str(back) == "rank 1: x"


def test_an_error_class_with_its_own_code_keeps_it():
    assert exit_code_of(ExportWriteError("x")) == EXIT_BAD_RECORDING
    assert type(error_of_exit_code(EXIT_INTERNAL, "bug")) is ReplayError
