"""``replay trace RUN.h5 --step N``: any step, per op, into the forensics file the TUI reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..errors import EXIT_OK
from ._replaying import engine_options, replaying

if TYPE_CHECKING:
    from ..workflows.session import ReplayOptions

__all__ = ["trace"]


@click.command()
@click.argument("run", type=click.Path(dir_okay=False, path_type=str))
@click.option("--step", type=int, help="The step to trace (default: the last).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@engine_options
def trace(
    run: str,
    step: int | None,
    as_json: bool,
    options: ReplayOptions,
) -> int:
    """Replay one step of RUN under per-op hooks, healthy or not, and write its forensics.

    What `replay bisect` does for the step it blames, for any step you choose: every aten op
    of forward, backward and the optimizer with its module, source line, statistics and
    memory, written to RUN.forensics.h5 for `replay tui RUN` (ops, layers, gradients, memory
    and source views). Exit codes: 0 traced, 2 a step outside the replayable window,
    3 unusable recording, 4 unusable entry point, 5 replay failed, 6 internal error.
    """
    from ..workflows.trace import run_trace
    from .render import render_trace

    replaying(as_json, lambda: run_trace(run, step, options), render_trace)
    return EXIT_OK
