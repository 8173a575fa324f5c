"""What every command that replays (``bisect``, ``verify``, ``trace``, ``whatif``, ``export``,
``overfit``) shares: its engine options, declared once and handed over as one
``ReplayOptions`` value (``--trust``: docs/trust.md), and one body that runs the workflow
and prints its report (memray's one command for every reporter)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import click

from ._process import big_imports, user_stdout_to_stderr

__all__ = ["engine_options", "rank_options", "replaying"]


class _Report(Protocol):
    def to_json(self) -> Any: ...


R = TypeVar("R", bound=_Report)


def replaying(
    as_json: bool,
    work: Callable[..., R],
    render: Callable[[R], str],
    *,
    progress: str | None = None,
) -> R:
    """The body of every replaying command: runs the workflow ``work()`` (with a progress bar
    named ``progress``: ``work(opened=..., progress=bar)``, ``opened`` once its engine is up)
    with whatever the user's code prints sent to stderr under ``--json``, then prints the report
    as JSON or in words (``render``) and returns it (each command's exit code follows from it)."""
    from ..bisect.progress import Progress

    bar = Progress(progress) if progress is not None else None
    try:
        with user_stdout_to_stderr(as_json), big_imports() as phase:
            report = work() if bar is None else work(opened=phase.end, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else render(report))
    return report


def engine_options(body: Any) -> Any:
    """The four engine options, handed to the command as one ``options``
    (:class:`replay.workflows.session.ReplayOptions`, which every workflow takes)."""

    @functools.wraps(body)
    def command(
        *args: Any, device: str | None, entry: str | None, trust: bool, reenter: bool, **kw: Any
    ) -> Any:
        from ..workflows.session import ReplayOptions

        return body(*args, options=ReplayOptions(device, entry, trust, reenter), **kw)

    fn = click.option(
        "--device",
        metavar="DEVICE",
        help="Replay on DEVICE (cpu, cuda, cuda:1). Default: where it was recorded if present.",
    )(command)
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
    return click.option(
        "--entry",
        metavar="MODULE_OR_FILE:build,step",
        help="Import build_fn and step_fn from here instead of where the recording says.",
    )(fn)


def rank_options(fn: Any) -> Any:
    """``--rank N --alone``: replay one rank of a DDP rank set in this process (approximate)."""
    fn = click.option(
        "--alone",
        is_flag=True,
        help="With a DDP rank set: replay one rank in this process, without its peers "
        "(approximate after the first step from a snapshot: no all-reduce).",
    )(fn)
    return click.option(
        "--rank",
        type=click.IntRange(min=0),
        metavar="N",
        help="With --alone: the rank to replay (default: the first that went bad).",
    )(fn)
