"""The options of every command that replays (``bisect``, ``verify``, ``trace``, ``whatif``,
``export``, ``overfit``). ``--trust``: docs/trust.md."""

from __future__ import annotations

from typing import Any

import click

__all__ = ["engine_options", "rank_options"]


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
        help="Run the code of a recording you did not sign or trust, this once (read what the "
        "refusal names first; `replay trust RUN` remembers it). See docs/trust.md.",
    )(fn)
    fn = click.option(
        "--reenter",
        is_flag=True,
        help="Run the recorded program again up to its Recorder and replay on its objects, "
        "even when the recording names a build_fn (the default without one).",
    )(fn)
    fn = click.option(
        "--entry",
        default=None,
        metavar="MODULE_OR_FILE:build,step",
        help="Import build_fn and step_fn from here instead of where the recording says.",
    )(fn)
    return fn


def rank_options(fn: Any) -> Any:
    """``--rank N --alone``: replay one rank of a DDP rank set in this process (approximate)."""
    fn = click.option(
        "--alone",
        is_flag=True,
        help="With a DDP rank set: replay one rank in this process, without its peers "
        "(approximate after the first step from a snapshot: no all-reduce).",
    )(fn)
    fn = click.option(
        "--rank",
        type=click.IntRange(min=0),
        default=None,
        metavar="N",
        help="With --alone: the rank to replay (default: the first that went bad).",
    )(fn)
    return fn
