"""``replay preflight -- python train.py ARGS``: is this run replayable? Ask before launching it."""

from __future__ import annotations

import json

import click

__all__ = ["preflight"]


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--steps",
    default=8,
    show_default=True,
    type=click.IntRange(2, 10_000),
    help="Steps to record before the run is ended.",
)
@click.option(
    "--keep",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=str),
    help="Keep the preflight recording here (default: a temporary file, removed).",
)
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=float,
    help="Seconds the run and the replay may take, each.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def preflight(
    steps: int, keep: str | None, timeout: float, as_json: bool, command: tuple[str, ...]
) -> int:
    """Run COMMAND (your own training command) for a few steps, replay them, say if it is
    replayable bitwise.

    \b
        replay preflight -- python train.py --lr 3e-4 --batch-size 64

    The first replay.Recorder that COMMAND creates records into a temporary file (its own path
    is left alone), snapshots at step 0 and half-way, and ends the run cleanly after --steps
    steps. The steps are then replayed in a fresh process, as `replay bisect` would after a
    crash. When they differ, the report says why: the replayed step raised (it needs state that
    build_fn does not create), state changed outside the step (which objects), or real
    non-determinism; and what to change. The run's own output goes to stderr.
    Exit codes: 0 replayable, 1 not replayable, 2 usage error.
    """
    from ..preflight import render_preflight, run_preflight

    rep = run_preflight(
        list(command),
        steps=steps,
        keep=keep,
        timeout=timeout,
        echo=lambda line: click.echo(line, err=True),
    )
    click.echo(json.dumps(rep.json(), indent=2) if as_json else render_preflight(rep))
    return 0 if rep.replayable else 1
