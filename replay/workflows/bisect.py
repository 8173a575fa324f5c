"""Bisect a recording: the first bad step, why, whether it reproduces, and its per-op trace."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..bisect.criteria import Criterion
    from ..bisect.subject import Subject
    from ..engine import Engine
    from ..ranks.scan import RankScan
    from ..store.reader import Recording

from ..bisect import SearchError, auto_criterion, find_culprit
from ..bisect.compare import HINT_RAISED
from ..errors import ReplayError
from ..multirank.choice import APPROXIMATE, choose_ranks
from ..ranks.files import is_rank_recording
from ..reports import BisectReport
from ..reports.verdict import only_known
from ..safetext import say
from ..store import open_recording
from ..store.liveness import writer_state
from .segments import failing_segment
from .session import AS_RECORDED, ReplayOptions, together, with_engine

__all__ = ["bisect_engine", "run_bisect"]


def run_bisect(
    run: str,
    *,
    criterion: Criterion | None = None,
    trace: bool = True,
    options: ReplayOptions = AS_RECORDED,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
    opened: Callable[[], None] | None = None,
    rank: int | None = None,
    alone: bool = False,
) -> BisectReport:
    """The ``replay bisect`` report of ``run``.

    ``criterion``: a :class:`replay.bisect.Criterion`, or ``None`` for the failure the recording
    shows first. ``run`` may name a DDP rank set: the rank whose own values went bad first is
    replayed (``log`` hears which). ``trace``: trace the culprit step per op and write the
    forensics sidecar. ``opened``: called once the engine is up.

    A rank set is replayed with every rank together (``replay.multirank.launch``),
    led by the rank whose own values went bad first; ``alone`` replays one rank in this process
    (``rank``, or that culprit rank), labelled ``"approximate": true``.
    """
    choice = choose_ranks(run, rank, alone)
    if choice.together:
        assert choice.scan is not None
        if criterion is None:
            said = _rank_set_as_recorded(choice.scan, options)
            if said is not None:
                return said
        job = {"criterion": criterion, "trace": trace, "log": log}
        d = together(choice.scan, "bisect", options, opened, **job)
        return BisectReport.from_json(only_known(BisectReport, d))
    path, rank_set, moved = choice.path, None, None
    if choice.scan is not None and path == run:  # --alone without --rank: the culprit rank
        path, rank_set = choice.scan.culprit_file()
        if log is not None:
            log(f"rank set: {rank_set.summary}; replaying {path}")
    elif choice.scan is None:  # a resumed run's failure may lie in a later segment
        path, moved = failing_segment(path, criterion)
        if moved is not None and log is not None:
            log(moved)

    def work(rec: Recording, engine: Engine) -> BisectReport:
        if opened is not None:
            opened()
        report = bisect_engine(rec, engine, criterion, trace=trace, progress=progress)
        report.recording, report.rank_set = path, rank_set
        return report

    def healthy(rec: Recording) -> BisectReport | None:
        report = _healthy_as_recorded(rec, criterion, options) if rank_set is None else None
        if report is not None:
            report.recording = path
        return report

    report = with_engine(path, work, options, check=healthy)
    if moved is not None:
        report.notes.append(moved)
    if choice.approximate:
        report.approximate = True
        report.notes.append(APPROXIMATE)
    return report


def bisect_engine(
    rec: Recording,
    engine: Engine,
    criterion: Criterion | None,
    *,
    trace: bool = True,
    progress: Callable[[int, int], None] | None = None,
    reraise: tuple[type[BaseException], ...] = (),
    together: bool = False,
) -> BisectReport:
    """Bisect the recording ``rec`` on a started ``engine``: the first bad step, the per-op
    trace of it (``trace``) and why the replay differs from the recording when it does.

    One rank of a DDP run replayed alone is judged by its own local values (``RankSubject``);
    ``together``: every rank is replayed with its peers (``replay.multirank``), the rows as
    recorded. ``reraise``: the tracer's errors that must still end the replay (a lockstep
    failure)."""
    from ..engine.subject import EngineSubject
    from ..multirank.alone import RankSubject, adjust_verdict
    from .culprit import trace_verdict
    from .why import buffers_hint, explain_divergence, read_buffers

    subject: Subject = EngineSubject(engine)
    if is_rank_recording(rec.meta) and not together:
        subject = RankSubject(engine, int(rec.meta["distributed"]["rank"]))
    crit = criterion if criterion is not None else auto_criterion(subject.recorded_rows())
    try:
        report = find_culprit(subject, crit, progress=progress)
    except SearchError as e:
        # a replay that raised because the step samples from a collection the loop fills (a
        # replay memory): name it instead of the general hint
        found = read_buffers(engine) if HINT_RAISED in str(e) else []
        said = str(e).replace(HINT_RAISED, buffers_hint(found)) if found else str(e)
        raise ReplayError(said) from None
    if isinstance(subject, RankSubject):
        adjust_verdict(report, subject)
    traced = trace_verdict(engine, rec, report, reraise=reraise) if trace else None
    report.recording, report.entry_files = rec.path, list(engine.entry_files)
    report.ended = rec.ended()
    if traced is not None:
        report.take_trace(traced)
    if report.divergence is not None:
        report.divergence_cause = explain_divergence(engine, report.divergence, report.exception)
    return report


def _rank_set_as_recorded(scan: RankScan, options: ReplayOptions) -> BisectReport | None:
    """A rank set no rank of which went bad of its own, or whose first failure is a rank that
    died outside any step (its peers' next collective failing for want of it), from the files
    alone: no step of any rank shows a failure a replay could find. ``None`` otherwise."""
    failure = scan.first_bad
    if failure is not None and failure.kind != "died":
        return None
    path, rank_set = scan.culprit_file()
    with open_recording(path) as rec:
        report = _healthy_as_recorded(rec, None, options, rank_file=True)
    if report is None:
        return None
    report.recording, report.rank_set = scan.spec, rank_set
    if failure is not None:  # (the culprit file's ending is the failure's)
        report.rank = failure.rank
    return report


def _healthy_as_recorded(
    rec: Recording, criterion: Criterion | None, options: ReplayOptions, rank_file: bool = False
) -> BisectReport | None:
    """The report of a recording whose health shows no symptom, from the file alone: the
    program is not run again (minutes of its start-up, its imports and side effects) to learn
    nothing. ``None`` otherwise; a rank file (judged by its own values, unless ``rank_file``:
    its rank set's scan judged them) and a file with nothing replayable go the engine's way
    too."""
    from ..engine.device import choose_device

    window = rec.replayable_window()
    if window is None or (is_rank_recording(rec.meta) and not rank_file):
        return None
    rows = rec.health_rows()
    crit = criterion if criterion is not None else auto_criterion(rows)
    if crit.first_symptom(rows) is not None:
        return None
    recorded = rec.snapshot_devices(window.first).get("model", "cpu")
    writer, last = writer_state(rec.path), int(rows[-1]["step"]) if rows else None
    if writer is not None:  # (its training goes on: what it has written so far)
        say(
            f"replay: {rec.path} is still being written (training process {writer.pid}); its "
            f"health up to step {last} shows nothing to replay"
        )
    return BisectReport(
        healthy=True,
        kind=crit.kind,
        criterion=crit.describe(),
        window=[window.first, window.last],
        device=choose_device(recorded, options.device, lambda _: None),
        checked=[int(rows[0]["step"]), int(rows[-1]["step"])] if rows else None,
        ended=rec.ending(),
    )
