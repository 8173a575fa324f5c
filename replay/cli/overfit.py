"""``replay overfit RUN.h5``: train on one recorded batch until the loss goes to ~0 (or not)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import click

from ..errors import EXIT_NOTHING_FOUND, EXIT_OK, RecordingError
from ..reports import OverfitReport
from ..store import open_recording
from ._replaying import engine_options, replaying

if TYPE_CHECKING:
    from ..workflows.session import ReplayOptions

__all__ = ["overfit"]

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """The curve in at most 60 block characters (log scale over decades); '×' for non-finite."""
    if not values:
        return ""
    step = max(1, math.ceil(len(values) / 60))
    pts = [values[i] for i in range(0, len(values), step)]
    fin = [v for v in pts if math.isfinite(v)]
    if not fin:
        return "×" * len(pts)
    use_log = min(fin) > 0 and max(fin) / min(fin) > 100
    f = (lambda v: math.log10(v)) if use_log else (lambda v: v)
    lo, hi = f(min(fin)), f(max(fin))
    span = (hi - lo) or 1.0
    return "".join(
        _BARS[min(7, int((f(v) - lo) / span * 7.999))] if math.isfinite(v) else "×" for v in pts
    )


def render(r: OverfitReport) -> str:
    """``overfit_batch``'s result as a person reads it."""
    from ..workflows.overfit import CLOSE

    head = f"{r.path}: overfitting the batch of step {r.step} for {r.iters} iterations"
    if r.lr is not None:
        head += f" (lr {r.lr:.3g})"
    lines = [head, f"  loss  {sparkline(r.curve)}"]
    c = r.curve
    marks = [0, 9, 49, 99, 199, 499, 999]
    pts = [f"{i + 1}: {c[i]:.4g}" for i in marks if i < len(c)]
    if c and len(c) - 1 not in marks:
        pts.append(f"{len(c)}: {c[-1]:.4g}")
    lines.append("  " + ", ".join(pts))
    if r.error:
        lines.append(f"  ✗ stopped: {r.error}")
    how_far = (
        f" ({100 * r.progress:.0f}% of the way from {r.first_loss:.4g} to the goal)"
        if r.progress is not None
        else ""
    )
    if r.verdict == "overfits":
        lines.append(
            f"  ✓ overfits: the loss reached {r.goal:.3g} at iteration {r.reached_at} "
            f"(from {r.first_loss:.4g}); the data, forward, loss and update path can learn"
        )
    elif r.verdict == "close":
        lines.append(
            f"  ✓ nearly overfits: lowest loss {r.min_loss:.4g}, within "
            f"{100 * (CLOSE - 1):.0f}% of the goal {r.goal:.3g}{how_far}; the model learns "
            "this batch (more --iters would get there)"
        )
    elif r.verdict == "still_falling":
        lines.append(
            f"  ~ not there yet: lowest loss {r.min_loss:.4g} (goal {r.goal:.3g}){how_far}, "
            f"and still falling ({100 * (r.recent_drop or 0.0):.0f}% over the last quarter): run "
            "longer (--iters) or with a larger --lr before concluding anything"
        )
    else:
        lines.append(
            f"  ✗ does not overfit: lowest loss {r.min_loss:.4g} (goal {r.goal:.3g})"
            f"{how_far}, and it stopped falling. A "
            "model that cannot memorise one batch has a bug: check labels vs outputs, the loss "
            "(no softmax before cross_entropy), zero_grad/step, frozen or dead layers, the "
            "learning rate (try --lr), and run `replay doctor`."
        )
    return "\n".join(lines)


@click.command()
@click.argument("run", type=click.Path(dir_okay=False, path_type=str))
@click.option(
    "--step",
    type=int,
    help="Whose batch to overfit (default: the first replayable step).",
)
@click.option(
    "--iters",
    type=click.IntRange(1, 100_000),
    default=200,
    show_default=True,
    help="Training iterations on that batch.",
)
@click.option("--lr", type=float, help="Override the learning rate of every group.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@engine_options
def overfit(
    run: str,
    step: int | None,
    iters: int,
    lr: float | None,
    as_json: bool,
    options: ReplayOptions,
) -> int:
    """Rebuild the model from RUN's state and train it on one recorded batch, again and again.

    The first law of debugging training: a model that cannot drive the loss on a single batch
    to about zero has a bug in its data, forward, loss or update path, whatever its size.
    Exit 0 when the loss gets there, 1 when it does not.
    """
    from ..workflows.overfit import overfit_batch

    with open_recording(run) as rec:
        if rec.replayable_window() is None:
            raise RecordingError(
                f"{run}: no replayable state (no kept snapshot with its batches), so there is "
                "nothing to rebuild the model from"
            )
    result = replaying(
        as_json, lambda: overfit_batch(run, step=step, iters=iters, lr=lr, options=options), render
    )
    return EXIT_OK if result.overfits else EXIT_NOTHING_FOUND
