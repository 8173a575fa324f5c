"""The options of every command that replays (``bisect``, ``verify``, ``overfit``)."""

from __future__ import annotations

from typing import Any

import click

__all__ = ["engine_options"]


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
