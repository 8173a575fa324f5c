"""Limits a user may raise through the environment (a replay's timeouts, the live window's read
budget, the self-check's priority), each read where it applies. The standard library only: the
processes that coordinate others (a rank set's replay, a wait for a writer to drain) read them
without loading torch, which the engine's package would (~2 s of CPU a command)."""

from __future__ import annotations

import os
from typing import TypeVar

__all__ = ["env_number"]

_N = TypeVar("_N", int, float)


def env_number(name: str, default: _N) -> _N:
    """The environment variable ``name`` read as a number of ``default``'s type, or ``default``
    when it is unset or no such number (a limit the user may raise: never a failure)."""
    try:
        return type(default)(os.environ.get(name, default))
    except ValueError:
        return default
