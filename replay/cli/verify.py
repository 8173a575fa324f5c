"""``replay verify RUN.h5``: replay the whole replayable window and compare every step bitwise."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import click

from ..errors import EXIT_NOTHING_FOUND, EXIT_OK
from ._replaying import engine_options, rank_options, replaying

if TYPE_CHECKING:
    from ..workflows.session import ReplayOptions

__all__ = ["verify"]


@click.command()
@click.argument("run", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "--all", "every_step", is_flag=True, help="Replay the whole window, each snapshot afresh."
)
@click.option(
    "--from", "start", type=int, metavar="STEP",
    help="Replay from the newest snapshot at or before STEP to the end of the window.",
)  # fmt: skip
@engine_options
@rank_options
def verify(
    run: str,
    as_json: bool,
    every_step: bool,
    start: int | None,
    options: ReplayOptions,
    rank: int | None,
    alone: bool,
) -> int:
    """Replay RUN's steps and check they reproduce bitwise: the newest snapshots' steps (the
    last 101-150 by default), or the whole window with --all (each kept snapshot afresh, as a
    bisect of a failure after it would start), or from --from STEP on.

    Compares each replayed loss and parameter fingerprint with the recorded ones. When a step
    differs, says why: the replay raised (the step needs state its batch and objects do not
    bring), state changed outside the step (which objects drifted by the next snapshot), or
    real non-determinism (two replays from the same state disagree).

    \b
    A DDP run: RUN names its rank set (run.h5 for run.rank0.h5, run.rank1.h5, ...); every rank
    is replayed together, one process each, and checked against its own file.
    --rank N --alone replays one rank in this process (approximate: no all-reduce).

    Exit codes: 0 every step matches, 1 some step differs, 3 unusable recording, 4 unusable
    entry point, 5 replay failed, 6 internal error.
    """
    from ..workflows import run_verify
    from .render import render_verify

    report = replaying(
        as_json,
        partial(
            run_verify,
            run,
            options=options,
            rank=rank,
            alone=alone,
            start=start,
            every_step=every_step,
            log=None if as_json else lambda m: click.echo(m, err=True),
        ),
        render_verify,
        progress="replay verify",
    )
    return EXIT_OK if report.deterministic else EXIT_NOTHING_FOUND
