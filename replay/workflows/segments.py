"""A resumed run's segments, bisected from the first one's name.

A run resumed from a checkpoint records into the next segment file (``run.h5`` -> ``run.1.h5``,
``store/segments.py``). Its user knows the name they gave the Recorder: ``replay bisect run.h5``
of a failure recorded in ``run.1.h5`` said the window was healthy. The failure is searched in
the named segment first, then in each later one, by the recorded health alone (no replay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..bisect import auto_criterion
from ..errors import RecordingError
from ..store.reader import open_recording
from ..store.segments import later_segments

if TYPE_CHECKING:
    from ..bisect.criteria import Criterion

__all__ = ["failing_segment", "later_segments_note"]


def _symptom_step(path: str, criterion: Criterion | None) -> int | None:
    """The step where ``path``'s recorded health first shows the failure, or ``None``."""
    with open_recording(path, health_only=True) as rec:
        rows = rec.health_rows()
    symptom = (criterion or auto_criterion(rows)).first_symptom(rows)
    return None if symptom is None else symptom.bound


def failing_segment(path: str, criterion: Criterion | None) -> tuple[str, str | None]:
    """``(the segment to bisect, the note that says why it is not path)``: ``path`` itself
    when its health shows the failure or no later segment's does (an unreadable later segment
    is passed over: the named file's own verdict stands)."""
    try:
        if _symptom_step(path, criterion) is not None:
            return path, None
    except RecordingError:
        return path, None  # the bisect of it says what is wrong with the file
    for seg in later_segments(path):
        try:
            step = _symptom_step(seg, criterion)
        except RecordingError:
            continue
        if step is not None:
            return seg, (
                f"{path} is healthy; the run was resumed into {seg}, whose recording first "
                f"shows the failure at step {step}: bisected there"
            )
    return path, None


def later_segments_note(path: str) -> str | None:
    """What ``replay verify`` of a segment says about the run's later segments, if any."""
    later = later_segments(path)
    if not later:
        return None
    return f"the run goes on in {', '.join(later)} (resumed): `replay verify {later[0]}` replays it"
