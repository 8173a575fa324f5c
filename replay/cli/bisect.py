"""``replay bisect RUN.h5``: the first bad step, why, and whether it reproduces."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..bisect.criteria import Criterion
    from ..workflows.session import ReplayOptions

from ..errors import EXIT_NOTHING_FOUND, EXIT_OK, RecordingError
from ..safetext import term_safe
from ..store import open_recording
from ._replaying import engine_options, rank_options, replaying

__all__ = ["bisect"]


def _criterion(kind: str, until: str | None, spike: float | None) -> Criterion | None:
    """The failure criterion, checked before any file is opened or user code imported.

    Returns a criterion, or ``None`` for "auto" (decided from the recorded health).
    """
    from ..bisect import PredicateError
    from ..bisect.criteria import criterion_named

    chosen = [n for n, x in (("--until", until), ("--spike", spike)) if x is not None]
    if len(chosen) > 1 or (chosen and kind != "auto"):
        raise click.UsageError("use one of --kind, --until and --spike")
    if spike is not None:
        if not spike > 0:
            raise click.UsageError("--spike FACTOR must be a positive number")
        until = f"loss > {spike!r} * median_loss"
    try:
        return criterion_named(kind, until)
    except PredicateError as e:
        raise click.UsageError(f"--until: {e}") from None


@click.command()
@click.argument("run", type=click.Path(path_type=str))
@click.option(
    "--kind",
    type=click.Choice(["auto", "nonfinite", "exception"]),
    default="auto",
    show_default=True,
    help="Failure to look for; auto: whichever the recording shows first.",
)
@click.option("--until", metavar="EXPR", help='Failure predicate, e.g. "loss > 4 * median_loss".')
@click.option(
    "--spike", type=float, metavar="FACTOR", help="Loss > FACTOR x median of earlier losses."
)
@click.option("--no-trace", is_flag=True, help="Skip the per-op trace of the culprit step.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@engine_options
@rank_options
def bisect(
    run: str,
    kind: str,
    until: str | None,
    spike: float | None,
    no_trace: bool,
    as_json: bool,
    options: ReplayOptions,
    rank: int | None,
    alone: bool,
) -> int:
    """Find the first step of RUN that fails, replaying only from the last healthy snapshot.

    \b
    Failure kinds: nonfinite (NaN/Inf in loss, gradients or parameters; a step the
    GradScaler skipped is not a failure), exception (the step raised), or a predicate
    over the recorded metrics (--until, --spike; see docs/bisect.md).
    A DDP run: RUN names its rank set (run.h5 for run.rank0.h5, run.rank1.h5, ..., a directory
    or a glob); every rank is replayed together, one process each, led by the first (step,
    rank) whose own values went bad. --rank N --alone replays one rank in this process
    (approximate: no all-reduce).
    Exit codes: 0 culprit found, 1 the recorded window is healthy, 2 usage error,
    3 unusable recording, 4 unusable entry point, 5 replay failed, 6 internal error.
    """
    from ..workflows import run_bisect
    from .render import render_verdict

    criterion = _criterion(kind, until, spike)
    _quote_self_check(run)
    report = replaying(
        as_json,
        partial(
            run_bisect,
            run,
            criterion=criterion,
            trace=not no_trace,
            options=options,
            log=None if as_json else lambda m: click.echo(m, err=True),
            rank=rank,
            alone=alone,
        ),
        render_verdict,
        progress="replay bisect",
    )
    return EXIT_NOTHING_FOUND if report.healthy else EXIT_OK


def _quote_self_check(run: str) -> None:
    """A recording whose self-check failed while it trained: say so first (docs/selfcheck.md)."""
    from ..store.selfcheck import read_selfcheck

    try:  # (not a single file: a rank set is checked with its ranks together, never quoted)
        with open_recording(run, health_only=True) as rec:
            run_id = rec.run_id
    except (RecordingError, OSError):
        return
    v = read_selfcheck(run, run_id)
    if v is not None and v.failed:
        click.echo(term_safe(f"replay: note: while it trained, {run} {v.line()}"), err=True)
