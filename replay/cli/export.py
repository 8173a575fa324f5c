"""``replay export RUN.h5 --out DIR``: the state before a step as a plain torch checkpoint."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from ..errors import EXIT_OK
from ._replaying import engine_options, replaying

if TYPE_CHECKING:
    from ..workflows.export import ExportReport
    from ..workflows.session import ReplayOptions

__all__ = ["export"]


@click.command()
@click.argument("run", type=click.Path(dir_okay=False, path_type=str))
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=str),
    help="A new (or empty) directory to write the checkpoint into.",
)
@click.option(
    "--step",
    type=int,
    help="Export the state right before this step (replayed from the snapshot before it, "
    "every step checked bitwise). Default: the state right before the first failure, after "
    "the last healthy step (the newest snapshot when nothing failed).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@engine_options
def export(
    run: str,
    out: str,
    step: int | None,
    as_json: bool,
    options: ReplayOptions,
) -> int:
    """Write the state before a step of RUN as a torch.save checkpoint to resume the real run.

    One file per recorded object (model.pt, optimizer.pt, scheduler.pt, scaler.pt, others),
    grads.pt, rng.pt and skip.json (where to resume, which steps to skip), and a README.md
    showing how to load them without replay installed. A state between two snapshots is
    replayed from the one before it, each step checked bitwise against the recording. The
    checkpoint is written beside --out and renamed into place: never a partial one. Runs the
    recorded entry points (as bisect does, under the same trust rule). Exit codes: 0 written,
    2 usage error (--out exists and is not an empty directory, is a link or lies under a
    non-directory; --step outside the window), 3 unusable recording or the checkpoint could not
    be written (a full disk), 4 unusable entry point, 5 replay failed (a replayed step differs).
    """
    from ..workflows import run_export

    replaying(as_json, lambda: run_export(run, out, step=step, options=options), render_export)
    return EXIT_OK


def render_export(report: ExportReport) -> str:
    """Where the checkpoint went, what it holds, and what to skip on resume."""
    how = (
        f"the snapshot of step {report.snapshot}"
        if report.replayed == 0
        else f"replayed {report.replayed} step(s) from the snapshot of step {report.snapshot}, "
        f"{report.verified} checked bitwise against the recording"
    )
    lines = [f"exported the state before step {report.step} ({how}) to {report.out}/"]
    lines.append("  " + ", ".join(report.files.values()))
    for s in report.skip:
        ident = f" (values {json.dumps(s['values'])})" if s.get("values") else ""
        lines.append(f"  skip on resume: step {s['step']}{ident}")
    lines += [f"  note: {n}" for n in report.notes]
    lines.append(f"  how to load it: {report.out}/README.md")
    return "\n".join(lines)
