"""``replay overfit RUN.h5``: train on one recorded batch until the loss goes to ~0 (or not)."""

from __future__ import annotations

import json

import click

from ._process import user_stdout_to_stderr
from ._replaying import engine_options

__all__ = ["overfit"]


@click.command()
@click.argument("run", type=click.Path(dir_okay=False, path_type=str))
@click.option(
    "--step",
    "step",
    type=int,
    default=None,
    help="Whose batch to overfit (default: the first replayable step).",
)
@click.option(
    "--iters",
    type=click.IntRange(1, 100_000),
    default=200,
    show_default=True,
    help="Training iterations on that batch.",
)
@click.option("--lr", type=float, default=None, help="Override the learning rate of every group.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@engine_options
def overfit(
    run: str,
    step: int | None,
    iters: int,
    lr: float | None,
    as_json: bool,
    device: str | None,
    entry: str | None,
    trust: bool,
) -> int:
    """Rebuild the model from RUN's state and train it on one recorded batch, again and again.

    The first law of debugging training: a model that cannot drive the loss on a single batch
    to about zero has a bug in its data, forward, loss or update path, whatever its size.
    Exit 0 when the loss gets there, 1 when it does not.
    """
    from ..overfit import overfit_batch, render
    from ..store import open_recording

    with open_recording(run) as rec:
        if rec.replayable_window() is None:
            from ..errors import RecordingError

            raise RecordingError(
                f"{run}: no replayable state (no kept snapshot with its batches), so there is "
                "nothing to rebuild the model from"
            )
    with user_stdout_to_stderr(as_json):
        result = overfit_batch(
            run, step=step, iters=iters, lr=lr, device=device, entry=entry, trust=trust
        )
    click.echo(json.dumps(result, indent=2) if as_json else render(result))
    return 0 if result["overfits"] else 1
