"""What ``bisect`` and ``verify`` share: opening a recording and starting the engine."""

from __future__ import annotations

from typing import Any

import click

from ._process import big_imports

__all__ = ["engine_options", "open_engine"]


def engine_options(fn: Any) -> Any:
    fn = click.option(
        "--device",
        default=None,
        metavar="DEVICE",
        help="Replay on DEVICE (cpu, cuda, cuda:1). Default: where it was recorded if present.",
    )(fn)
    fn = click.option(
        "--trust",
        is_flag=True,
        help="Import the entry points of a recording made by another user or on another host "
        "(read the files it names first).",
    )(fn)
    fn = click.option(
        "--entry",
        default=None,
        metavar="MODULE_OR_FILE:build,step",
        help="Import build_fn and step_fn from here instead of where the recording says.",
    )(fn)
    return fn


def open_engine(
    run: str, device: str | None, entry: str | None, trust: bool = False
) -> tuple[Any, Any]:
    """``(recording, engine)``; torch is imported here, not at ``replay --help`` time."""
    with big_imports():
        from ..engine.entry import parse_entry_override

        override = None
        if entry is not None:
            try:
                override = parse_entry_override(entry)
            except ValueError as e:
                raise click.UsageError(str(e)) from None
        from ..engine import Engine
        from ..store import open_recording

        rec = open_recording(run)
        try:
            return rec, Engine(rec, device=device, entry=override, trust=trust)
        except BaseException:
            rec.close()
            raise
