"""``replay trust RUN.h5``: remember that you read what a recording runs (docs/trust.md)."""

from __future__ import annotations

import click

from ..errors import EXIT_OK, ReplayError
from ..safetext import term_safe
from ..store import open_recording
from ..trust import KeyUnusable, remember, standing

__all__ = ["trust"]


@click.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=str))
def trust(runs: tuple[str, ...]) -> int:
    """Trust RUNS: the replaying commands then run their code without --trust.

    A recording runs code when replayed (its program again, or its build_fn). One you recorded
    is signed with your key and needs nothing; one from a colleague, a bug report or another
    machine is foreign until you read what it runs (the refusal prints the command) and trust
    it here. What is remembered is the digest of everything that decides what runs: a copy
    edited afterwards is foreign again. The trust store is beside your key
    ($REPLAY_HOME, else $XDG_DATA_HOME/replay or ~/.local/share/replay).
    """
    for run in runs:
        with open_recording(run) as rec:
            got = standing(rec.meta, rec.sources, rec.run_id, rec.format_version)
        if got.kind != "foreign":
            click.echo(f"{term_safe(run)}: already {got.words()}")
            continue
        try:
            store = remember(got.digest)
        except KeyUnusable as e:
            raise ReplayError(f"cannot remember {run}: {e}") from None
        click.echo(f"{term_safe(run)}: trusted (was {got.why}); remembered in {store}")
    return EXIT_OK
