"""Bisect a recording: the first bad step, why, whether it reproduces, and its per-op trace."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store.reader import Recording

from ..errors import ReplayError
from .session import with_engine

__all__ = ["bisect_work", "run_bisect"]


def run_bisect(
    run: str,
    *,
    criterion: Any = None,
    trace: bool = True,
    device: str | None = None,
    entry: str | None = None,
    trust: bool = False,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
    opened: Callable[[], None] | None = None,
    rank: int | None = None,
    alone: bool = False,
    reenter: bool = False,
) -> dict[str, Any]:
    """The ``replay bisect --json`` report of ``run``.

    ``criterion``: a :class:`replay.bisect.Criterion`, or ``None`` for the failure the recording
    shows first. ``run`` may name a DDP rank set: the rank whose own values went bad first is
    replayed (``log`` hears which). ``trace``: trace the culprit step per op and write the
    forensics sidecar. ``opened``: called once the engine is up.

    A rank set is replayed with every rank together (``replay.multirank.launch``),
    led by the rank whose own values went bad first; ``alone`` replays one rank in this process
    (``rank``, or that culprit rank), labelled ``"approximate": true``.
    """
    from .ranks import APPROXIMATE, choose_ranks

    choice = choose_ranks(run, rank, alone)
    if choice.together:
        from ..multirank.launch import replay_rank_set

        if opened is not None:
            opened()
        assert choice.scan is not None
        return replay_rank_set(
            choice.scan,
            "bisect",
            criterion=criterion,
            trace=trace,
            device=device,
            entry=entry,
            trust=trust,
            log=log,
        )
    path, rank_set = choice.path, None
    if choice.scan is not None and path == run:  # --alone without --rank: the culprit rank
        path, rank_set = choice.scan.culprit_file()
        if log is not None:
            log(f"rank set: {rank_set['summary']}; replaying {path}")
    d = _bisect_one(
        path, rank_set, criterion, trace, device, entry, trust, progress, log, opened, reenter
    )
    if choice.approximate:
        d["approximate"] = True
        d["notes"] = [*d.get("notes", []), APPROXIMATE]
    return d


def _bisect_one(
    run: str,
    rank_set: dict[str, Any] | None,
    criterion: Any,
    trace: bool,
    device: str | None,
    entry: str | None,
    trust: bool,
    progress: Callable[[int, int], None] | None,
    log: Callable[[str], None] | None,
    opened: Callable[[], None] | None,
    reenter: bool = False,
) -> dict[str, Any]:
    work = bisect_work(run, criterion, trace, rank_set=rank_set, progress=progress, opened=opened)
    return with_engine(run, work, device=device, entry=entry, trust=trust, reenter=reenter)


def bisect_work(
    run: str,
    criterion: Any,
    trace: bool,
    *,
    rank_set: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    opened: Callable[[], None] | None = None,
    together: bool = False,
) -> Callable[[Recording, Engine], dict[str, Any]]:
    """What :func:`run_bisect` does with the engine up. ``together``: the engine is one rank of
    a multi-rank replay, the leader's (``replay.multirank``): its all-reduce runs for real, so
    the search sees the recording as it is (no rank-local view), and a lockstep failure ends
    the trace as well as the search."""
    from ..bisect import SearchError, auto_criterion, find_culprit
    from ..bisect.report import verdict_json
    from ..distributed.bisect import RankSubject, adjust_verdict, is_rank_recording
    from ..engine.culprit import trace_verdict
    from ..engine.subject import EngineSubject
    from ..engine.why import explain_divergence

    def work(rec: Recording, engine: Engine) -> dict[str, Any]:
        if opened is not None:
            opened()
        subject: Any = EngineSubject(engine)
        if not together and is_rank_recording(rec.meta):
            subject = RankSubject(subject, int(rec.meta["distributed"]["rank"]))
        crit = criterion if criterion is not None else auto_criterion(subject.recorded_rows())
        try:
            verdict = find_culprit(subject, crit, progress=progress)
        except SearchError as e:
            raise ReplayError(str(e)) from None
        if isinstance(subject, RankSubject):
            adjust_verdict(verdict, subject)
        extra: dict[str, Any] = {"recording": run, "entry_files": engine.entry_files}
        if rank_set is not None:
            extra["rank_set"] = rank_set
        if trace:
            trace_verdict(engine, rec, verdict, extra, reraise=(ReplayError,) if together else ())
        if verdict.divergence is not None:
            extra["divergence_cause"] = explain_divergence(
                engine, verdict.divergence, verdict.exception
            )
        return verdict_json(verdict, **extra)

    return work
