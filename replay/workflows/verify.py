"""Replay a recording's whole window and compare every step bitwise; when one differs, say why."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store.reader import Recording

from .session import with_engine

__all__ = ["run_verify", "verify_work"]


def run_verify(
    run: str,
    *,
    device: str | None = None,
    entry: str | None = None,
    trust: bool = False,
    progress: Callable[[int, int], None] | None = None,
    opened: Callable[[], None] | None = None,
    rank: int | None = None,
    alone: bool = False,
    log: Callable[[str], None] | None = None,
    reenter: bool = False,
    first_steps: int | None = None,
) -> dict[str, Any]:
    """The ``replay verify --json`` report of ``run`` (``deterministic``, ``steps``, ``cause``...).

    ``opened`` is called once the engine is up (user code imported and built), before the
    replay: the command uses it to end its start-up phase.

    ``run`` may name a DDP rank set: every rank is replayed together, one process each
    (``replay.multirank.launch``), and ``ranks`` holds each rank's own check;
    ``rank`` with ``alone`` replays that rank alone in this process (``"approximate": true``).
    ``first_steps``: replay only the window's first steps, read at once (the self-check of a
    live run, whose ring moves on).
    """
    from .ranks import APPROXIMATE, RankChoice, choose_ranks

    choice = choose_ranks(run, rank, alone)
    if choice.together:
        from ..multirank.launch import replay_rank_set

        if opened is not None:
            opened()
        assert choice.scan is not None
        return replay_rank_set(
            choice.scan, "verify", device=device, entry=entry, trust=trust, log=log
        )
    files = choice.files
    if files is not None and choice.path == run:  # --alone without --rank: rank 0
        choice = RankChoice(choice.scan, False, files[min(files)])
    d = _verify_one(choice.path, device, entry, trust, progress, opened, reenter, first_steps)
    if choice.approximate:
        d["approximate"] = True
        d["notes"] = [APPROXIMATE]
    return d


def _verify_one(
    run: str,
    device: str | None,
    entry: str | None,
    trust: bool,
    progress: Callable[[int, int], None] | None,
    opened: Callable[[], None] | None,
    reenter: bool = False,
    first_steps: int | None = None,
) -> dict[str, Any]:
    work = verify_work(run, progress, opened)
    return with_engine(
        run,
        work,
        device=device,
        entry=entry,
        trust=trust,
        reenter=reenter,
        pin_steps=first_steps,
    )


def verify_work(
    run: str,
    progress: Callable[[int, int], None] | None = None,
    opened: Callable[[], None] | None = None,
) -> Callable[[Recording, Engine], dict[str, Any]]:
    """What :func:`run_verify` does with the engine up (a multi-rank replay's leader runs it)."""
    from ..bisect import verify_window
    from ..bisect.report import verify_json
    from ..engine.subject import EngineSubject
    from ..engine.why import explain_divergence

    def work(rec: Recording, engine: Engine) -> dict[str, Any]:
        if opened is not None:
            opened()
        report = verify_window(EngineSubject(engine), progress=progress)
        fd = report.first_divergence
        if fd is not None:
            report.cause = explain_divergence(
                engine, fd, report.replayed_exception(int(fd["step"]))
            )
        return verify_json(report, recording=run, entry_files=engine.entry_files)

    return work
