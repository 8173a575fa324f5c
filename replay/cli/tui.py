"""``replay tui RUN.h5``: browse a recording and its forensics in the terminal (Textual)."""

from __future__ import annotations

import click

__all__ = ["tui"]


@click.command()
@click.argument("run", type=click.Path(path_type=str))
def tui(run: str) -> int:
    """Browse RUN and its forensics: overview, ops, layers, gradients, memory, source, batch, ranks.

    RUN is a recording, or a DDP run's rank set (the base path run.h5 for run.rank0.h5,
    run.rank1.h5, ..., a directory or a glob): the views show the culprit rank, and view 8 shows
    every rank side by side.

    Keys: 1-8 switch views, ? lists every key, q quits. Works on a recording still being
    written (it refreshes every 2 s). Run `replay bisect RUN` first for the per-op views.
    """
    # textual is imported only here: `replay --help` stays instant
    from replay_tui.app import make_app

    app = make_app(run)  # a bad file raises RecordingError here, before the screen is taken
    app.run()
    if app.failure is not None:
        # A damaged part found while browsing: one line and exit 3 (RecordingError), or the
        # catch-all's line and exit 6, from replay.cli.main, once the terminal is restored.
        raise app.failure
    return int(app.return_code or 0)
