"""Replay a recording's whole window and compare every step bitwise; when one differs, say why."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store.reader import Recording

from ..bisect import verify_window
from ..jsonsafe import json_safe
from ..multirank.choice import APPROXIMATE, RankChoice, choose_ranks
from ..reports import VerifiedStep, VerifyReport
from ..reports.verdict import exception_info, only_known
from .segments import later_segments_note
from .session import AS_RECORDED, ReplayOptions, together, with_engine

__all__ = ["run_verify", "verify_engine"]


def run_verify(
    run: str,
    *,
    options: ReplayOptions = AS_RECORDED,
    progress: Callable[[int, int], None] | None = None,
    opened: Callable[[], None] | None = None,
    rank: int | None = None,
    alone: bool = False,
    log: Callable[[str], None] | None = None,
    first_steps: int | None = None,
    start: int | None = None,
    every_step: bool = False,
) -> VerifyReport:
    """The ``replay verify`` report of ``run`` (``deterministic``, ``steps``, ``cause``...).

    ``opened`` is called once the engine is up (user code imported and built), before the
    replay: the command uses it to end its start-up phase.

    ``run`` may name a DDP rank set: every rank is replayed together, one process each
    (``replay.multirank.launch``), and ``ranks`` holds each rank's own check;
    ``rank`` with ``alone`` replays that rank alone in this process (``"approximate": true``).
    ``first_steps``: replay only the window's first steps, read at once (the self-check of a
    live run, whose ring moves on); with ``start``, the first steps from the oldest kept
    snapshot at or after ``start`` (the self-check's later steps).
    """
    choice = choose_ranks(run, rank, alone)
    if choice.together:
        assert choice.scan is not None
        # (--from and --all reach the leader, whose replay every other rank follows: they were
        # dropped, and a rank set's verify replayed the newest snapshots' steps whatever asked)
        job = {"start": start, "every_step": every_step}
        d = together(choice.scan, "verify", options, opened, log=log, **job)
        return VerifyReport.from_json(only_known(VerifyReport, d))
    if choice.scan is not None and choice.path == run:  # --alone without --rank: rank 0
        files = choice.scan.paths
        choice = RankChoice(choice.scan, False, files[min(files)])
    pin_from = start if first_steps is not None else None
    if pin_from is not None:
        start = None  # the pinned window starts there (at a later snapshot, if that one is gone)

    def work(rec: Recording, engine: Engine) -> VerifyReport:
        if opened is not None:
            opened()
        return verify_engine(rec, engine, progress, start, every_step)

    report = with_engine(choice.path, work, options, pin_steps=first_steps, pin_from=pin_from)
    if choice.approximate:
        report.approximate = True
        report.notes = [APPROXIMATE, *(report.notes or [])]
    elif (
        first_steps is None and choice.scan is None and (later := later_segments_note(choice.path))
    ):
        report.notes = [*(report.notes or []), later]
    return report


def verify_engine(
    rec: Recording,
    engine: Engine,
    progress: Callable[[int, int], None] | None = None,
    start: int | None = None,
    every_step: bool = False,
) -> VerifyReport:
    """Replay the window of ``rec`` on a started ``engine``, compare every step bitwise and,
    when one differs, say why.

    By default only the window's dense part: the steps from the oldest of the newest
    ``keep_snapshots`` snapshots (a run's reach holds up to 10,000 steps, whose replay would
    take as long as training them); ``start``: from the snapshot at or before that step;
    ``every_step``: the whole window, each kept snapshot afresh."""
    from ..engine.subject import EngineSubject
    from .why import explain_divergence

    w, notes = engine.window, []
    if start is None and not every_step:
        cfg = rec.config
        dense = w.last + 1 - int(cfg.get("snapshot_every", 50)) * int(cfg.get("keep_snapshots", 3))
        older = [s for s in w.snapshots if s < dense]
        if older and any(s >= dense for s in w.snapshots):
            start = min(s for s in w.snapshots if s >= dense)
            notes.append(
                f"replayed steps {start}..{w.last}, from the newest snapshots; the window reaches "
                f"back to step {w.first} ({len(older)} older snapshots): `replay verify --all` "
                "replays it all, each snapshot afresh, or --from STEP from a step of it"
            )
    check = verify_window(EngineSubject(engine), progress=progress, start=start)
    fd = check.first_divergence
    cause = None
    if fd is not None:
        cause = explain_divergence(engine, fd, exception_info(check.replayed_exception(fd.step)))
    return VerifyReport(
        deterministic=check.deterministic,
        window=list(check.window),
        device=check.device,
        replayed_steps=check.replayed_steps,
        first_divergence=fd,
        steps=[
            VerifiedStep(
                step=s["step"],
                match=s["divergence"] is None,
                compared=s["compared"],
                loss=json_safe(s["replayed"]["loss"]),
                recorded_loss=json_safe(s["recorded"]["loss"]) if s["recorded"] else None,
                param_fingerprint=json_safe(s["replayed"]["param_fingerprint"]),
                recorded_param_fingerprint=(
                    json_safe(s["recorded"]["param_fingerprint"]) if s["recorded"] else None
                ),
                exception=exception_info(s["exception"]),
            )
            for s in check.steps
        ],
        cause=cause,
        recording=rec.path,
        entry_files=list(engine.entry_files),
        notes=notes or None,
    )
