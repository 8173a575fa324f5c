"""The search: first symptom in the recorded health, newest healthy snapshot before it, then a
step-by-step replay to the first failing step, and a second replay of that step.

Cost: at most ``snapshot_every + 1`` replayed steps (the snapshot found is the newest one at or
before the first symptom) plus one for the second check. The state before each replayed step is
kept in memory by the subject, so the second check replays one step, not the window again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum

from ..reports import BisectReport
from ..reports.verdict import exception_info
from .compare import HINT_RAISED, compare_replays, compare_rows, with_exception_type
from .criteria import Criterion
from .subject import Row, Subject


class NoteKind(str, Enum):
    """What a verdict note says, for code that replaces one kind of note (it used to match a
    substring of the wording)."""

    GENERAL = "general"
    NONDETERMINISM = "nondeterminism"  # the replay differs from the recording

    def __str__(self) -> str:
        return str(self.value)


class Note(str):
    """A verdict note: its text (a plain ``str`` wherever it is shown or written as JSON) and
    its :class:`NoteKind`."""

    kind: NoteKind

    def __new__(cls, text: str, kind: NoteKind = NoteKind.GENERAL) -> Note:
        note = super().__new__(cls, text)
        note.kind = kind
        return note


def note_kind(note: str) -> NoteKind:
    """The kind of a note (a plain ``str`` is a general note)."""
    return note.kind if isinstance(note, Note) else NoteKind.GENERAL


__all__ = [
    "SearchError",
    "find_culprit",
    "newest_healthy",
    "Note",
    "NoteKind",
    "note_kind",
]


class SearchError(Exception):
    """The recording cannot answer (the failure started before what it keeps, ...)."""


def newest_healthy(
    snapshots: Sequence[int], healthy: Callable[[int], bool]
) -> tuple[int | None, int]:
    """The newest snapshot for which ``healthy`` holds, assuming health only ever goes bad once
    (NaN/Inf in a state do not heal). Returns (snapshot or None, checks made).

    The newest is checked first: it is nearly always healthy (the failure is after it), and it
    is the one the replay loads next, so the common case costs one read. Otherwise a binary
    search over the older ones.
    """
    if not snapshots:
        return None, 0
    if healthy(snapshots[-1]):
        return snapshots[-1], 1
    lo, hi, best, checks = 0, len(snapshots) - 2, None, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        checks += 1
        if healthy(snapshots[mid]):
            best, lo = snapshots[mid], mid + 1
        else:
            hi = mid - 1
    return best, checks


def find_culprit(
    subject: Subject,
    criterion: Criterion,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> BisectReport:
    """Find the first step that fails ``criterion`` by replaying as few steps as possible: the
    report's search fields (the trace, the divergence's cause and where it ran come later)."""
    first, last = subject.window
    v = BisectReport(
        kind=criterion.kind,
        criterion=criterion.describe(),
        window=[first, last],
        device=subject.device,
    )
    rows = subject.recorded_rows()
    if rows:
        v.checked = [int(rows[0]["step"]), int(rows[-1]["step"])]
    symptom = criterion.first_symptom(rows)
    if symptom is None:
        v.healthy = True
        return v
    bound = symptom.bound
    v.symptom_step = symptom.step
    if bound < first:
        raise SearchError(
            f"the recording first shows the failure at step {bound}, before the replayable "
            f"window (steps {first}..{last}): the steps that led to it are no longer kept; "
            "record with a larger reach (Recorder(reach=...), and keep_bytes for large batches)"
        )
    if bound > last:
        v.notes.append(
            f"the failure is recorded at step {bound}, but steps after {last} cannot be "
            f"replayed (their records were not kept); replaying up to step {last}"
        )
        bound = last
    candidates = [s for s in subject.snapshots if first <= s <= bound]
    if criterion.checks_snapshots:
        start, v.snapshots_checked = newest_healthy(candidates, subject.snapshot_healthy)
        if start is None:
            raise SearchError(
                f"every kept snapshot at or before step {bound} already holds NaN/Inf: the "
                "failure started before the replayable window"
            )
    else:
        start = candidates[-1]
    v.snapshot = start
    by_step = {int(r["step"]): r for r in rows}
    fails = criterion.watcher([r for r in rows if r["step"] < start])
    culprit: Row | None = None
    total = bound - start + 1
    for i, t in enumerate(range(start, bound + 1)):
        replayed = subject.replay(t)
        v.replayed_steps += 1
        if progress is not None:
            progress(i + 1, total)
        recorded = with_exception_type(by_step.get(t), subject.recorded_exception)
        v.divergence = v.divergence or compare_rows(recorded, replayed)
        # Columns a replay does not reproduce (wall time, memory) keep their recorded values.
        row = {**(recorded or {}), **replayed}
        if fails(row):
            culprit = row
            break
        if replayed.get("exception") is not None and criterion.kind != "exception":
            e = replayed["exception"]
            raise SearchError(
                f"step {t} raised {e['type']}: {e['message']} on replay, which the recording "
                f"does not show: {HINT_RAISED}"
            )
    v.deterministic = v.divergence is None
    if culprit is None:
        v.first_bad_step = symptom.bound
        v.reproducible = False
        v.notes.append(
            f"replaying steps {start}..{bound} did not reproduce the failure the recording shows "
            f"at step {symptom.bound}: suspect non-determinism, hardware, or state the step reads "
            "that no snapshot holds (see why it differs)"
        )
        return v
    t = int(culprit["step"])
    v.first_bad_step = t
    v.take_row(culprit)
    v.exception = exception_info(culprit.get("exception"))
    if criterion.kind == "exception":
        want = (subject.recorded_exception(symptom.step) or {}).get("type")
        got = v.exception["type"] if v.exception else None
        if want and got != want:
            v.notes.append(
                f"the recording raised {want} at step {symptom.step}, the replay raised {got} "
                f"at step {t}"
            )
    again = subject.replay_again(t)
    v.rechecked_steps = 1
    same = compare_replays(culprit, again) is None
    v.reproducible = same and v.deterministic
    if not same:
        v.notes.append(
            f"two replays of step {t} from the same state disagree: suspect hardware or "
            "non-determinism (a data race, an uninitialised read, a flaky device)"
        )
    elif not v.deterministic:
        d = v.divergence
        assert d is not None  # (not deterministic: it differs somewhere)
        v.notes.append(
            Note(
                f"the replay differs from the recording at step {d.step} "
                f"({d.column}): suspect non-determinism (or changed code) between the "
                "recording and this replay",
                NoteKind.NONDETERMINISM,
            )
        )
    return v
