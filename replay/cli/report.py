"""``replay report RUN -o report.html``: the verdict as one self-contained page. Reads the store
only (no torch, no recorded code), like ``replay info``."""

from __future__ import annotations

import json
import os

import click

from ..errors import EXIT_OK, RecordingError, UsageError
from ..reports import BisectReport
from ..safetext import term_safe

__all__ = ["report"]


@click.command()
@click.argument("run", type=click.Path(path_type=str))
@click.option(
    "-o",
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=str),
    help="The HTML file to write (replaced when it exists).",
)
@click.option(
    "--bisect",
    "bisect_json",
    type=click.Path(dir_okay=False, path_type=str),
    help="What `replay bisect RUN --json` printed, for what only bisect knows (reproducible?).",
)
def report(run: str, out: str, bisect_json: str | None) -> int:
    """Write RUN's verdict as one HTML page a team can open: no network, no JavaScript needed.

    \b
    The verdict (first bad step, cause, op, module, source line, samples), the self-check,
    the command that reproduces it; loss, gradient norm, learning rate and update ratio over
    the steps with the first bad step and the replayable window marked; per-layer values over
    steps; the traced ops around the culprit (sortable); doctor's findings; for a DDP rank set
    (run.h5 for run.rank<N>.h5) every rank. Without a forensics sidecar it shows what the
    recording alone holds: `replay bisect RUN` adds the op-level part. Runs no recorded code.
    """
    from ..report import write_report

    if out.endswith((".h5", ".hdf5")) or (
        os.path.exists(out) and os.path.exists(run) and os.path.samefile(out, run)
    ):
        raise UsageError(f"{out}: refusing to write the report over a recording")
    bisect = None
    if bisect_json is not None:  # (untrusted too: escaped on the page)
        try:
            with open(bisect_json, encoding="utf-8") as fh:
                bisect = BisectReport.from_json(json.load(fh))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            said = f"{bisect_json}: not a `replay bisect --json` report ({e})"
            raise RecordingError(said) from None
    size = write_report(run, out, bisect=bisect)
    click.echo(f"wrote {term_safe(out)} ({size:,} bytes)")
    return EXIT_OK
