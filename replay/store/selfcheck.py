"""The self-check's verdict beside a recording: ``run.h5`` -> ``run.selfcheck.json``.

While a run trains, a background process replays its first steps and says whether they replay
(docs/selfcheck.md). The writer process owns the recording then (SWMR: nothing can be added to
the file once it is live), so the verdict is a small JSON file beside it, written whole by a
rename: a reader sees no verdict or a complete one. Its shape is in docs/format.md. Torch-free:
``info`` and the TUI read it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from .safefile import replace_whole
from .tmpdirs import alive

__all__ = ["SelfCheck", "selfcheck_path", "read_selfcheck", "write_selfcheck", "STATUSES"]

# 2: run_id (version 1 files have none); 3: earlier (the first steps' span); 4: pid (the
# checking process: a "running" verdict whose process is gone reads as an error)
VERSION = 4
RTOL = 1e-3  # a GPU run checked on the CPU (or with cuDNN's autotuner): losses within this
STATUSES = ("running", "ok", "failed", "skipped", "error")
_MAX_BYTES = 64 << 10  # a verdict is a few hundred bytes; anything larger is not ours


@dataclass(frozen=True)
class SelfCheck:
    """``status``: ``running``, ``ok`` (the steps replay), ``failed`` (they do not: ``kind`` is
    verify's cause, ``raised``, ``nondeterministic`` or ``outside_state``, or ``program`` when
    the program could not be run again), ``skipped`` (``reason`` says why) or ``error`` (the
    check itself broke; says nothing of the recording)."""

    status: str
    check: str = ""  # what ran: "bitwise on cpu", "within rtol 1e-3 on cpu (recorded on cuda)"
    steps: tuple[int, int] | None = None
    kind: str | None = None
    summary: str = ""
    hint: str = ""
    seconds: float | None = None
    run_id: str | None = None  # the recording's: a verdict beside another recording is not its
    # the later check's verdict: the first steps, which replayed (``steps`` are the later ones,
    # from a snapshot taken once training was under way)
    earlier: tuple[int, int] | None = None
    pid: int | None = None  # the process that checks (``running``) or checked

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def line(self) -> str:
        """One line for a person: what the check found and what to do."""
        span = f" (steps {self.steps[0]}..{self.steps[1]})" if self.steps else ""
        later = self.earlier is not None and self.steps is not None
        if self.status == "ok":
            if later:
                return (
                    f"replays: the self-check replayed the first steps ({_span(self.earlier)}) "
                    f"and, from a later snapshot, steps {_span(self.steps)} {self.check}"
                )
            return f"replays: the self-check replayed the first steps{span} {self.check}"
        if self.status == "failed":
            what = f"{self.kind}: " if self.kind else ""
            if later:
                span = (
                    f" (steps {_span(self.steps)}, from a snapshot taken once training was under "
                    f"way; the first steps, {_span(self.earlier)}, replayed)"
                )
            return f"does NOT replay: the self-check{span} found {what}{self.summary}" + (
                f"; {self.hint}" if self.hint else ""
            )
        if self.status == "running":
            return "the self-check is replaying the first steps"
        if self.status == "skipped":
            return f"not self-checked: {self.summary}"
        return f"the self-check could not run ({self.summary}); run `replay preflight`"

    def short(self) -> str:
        """A few words for a narrow panel (the TUI's overview)."""
        span = f"steps {_span(self.steps)}, " if self.steps else ""
        if self.earlier is not None and self.steps is not None:
            span = f"steps {_span(self.earlier)} and {_span(self.steps)}, "
        if self.status == "ok":
            return f"replays ({span}{self.check})"
        if self.status == "failed":
            return f"does NOT replay ({self.kind or 'differs'}; replay info says why)"
        return {"running": "running", "skipped": "skipped"}.get(self.status, "could not run")

    def to_json(self) -> dict[str, Any]:
        pairs = {k: list(v) if (v := getattr(self, k)) else None for k in ("steps", "earlier")}
        return {"version": VERSION, **asdict(self), **pairs}

    @classmethod
    def from_json(cls, d: Any) -> SelfCheck | None:
        """A verdict read back, or ``None`` when ``d`` is not one (a file is untrusted input)."""
        if not isinstance(d, dict) or d.get("status") not in STATUSES:
            return None
        seconds = d.get("seconds")
        pid = d.get("pid")

        def text(k: str) -> str:
            v = d.get(k)
            return v[:500] if isinstance(v, str) else ""

        return cls(
            status=str(d["status"]),
            check=text("check"),
            steps=_pair(d.get("steps")),
            kind=text("kind") or None,
            summary=text("summary"),
            hint=text("hint"),
            seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
            run_id=text("run_id") or None,
            earlier=_pair(d.get("earlier")),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
        )


def _pair(raw: Any) -> tuple[int, int] | None:
    if (
        isinstance(raw, list)
        and len(raw) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in raw)
    ):
        return int(raw[0]), int(raw[1])
    return None


def _span(steps: tuple[int, int] | None) -> str:
    return f"{steps[0]}..{steps[1]}" if steps else ""


def selfcheck_path(path: str) -> str:
    root, _ = os.path.splitext(path)
    return f"{root}.selfcheck.json"


def read_selfcheck(
    path: str, run_id: str | None = None, *, as_written: bool = False
) -> SelfCheck | None:
    """The verdict beside recording ``path``, or ``None`` (none yet, or not a verdict).
    ``run_id``: the recording's; a verdict that does not name it (another run's, left by an
    earlier recording at the same path; or one naming no run, planted) is ``None`` too. A
    ``running`` verdict whose process is gone (killed with the run, or by hand) reads as an
    ``error``: nothing will ever replace it (``as_written``: as the file says)."""
    v = _read(path)
    if v is None or (run_id and v.run_id != run_id):
        return None
    if not as_written and v.status == "running" and v.pid is not None and not _checking(v.pid):
        return SelfCheck(
            "error",
            steps=v.steps,
            summary=f"the self-check process (pid {v.pid}) ended before its verdict (a check "
            "ends with the run that started it)",
            run_id=v.run_id,
            pid=v.pid,
        )
    return v


def _checking(pid: int) -> bool:
    """Whether process ``pid`` lives and is a self-check (not a later process given its pid)."""
    if not alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            if fh.read().rsplit(b")", 1)[-1].split()[:1] == [b"Z"]:
                return False  # a zombie: it has ended
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"selfcheck" in fh.read()
    except OSError:
        return True  # no /proc here: alive is all we can tell


def _read(path: str) -> SelfCheck | None:
    try:
        fd = os.open(selfcheck_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not os.path.isfile(selfcheck_path(path)):
                return None
            raw = fh.read(_MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_BYTES:
        return None
    try:
        return SelfCheck.from_json(json.loads(raw.decode("utf-8")))
    except (ValueError, UnicodeDecodeError):
        return None


def write_selfcheck(path: str, verdict: SelfCheck) -> None:
    """Write the verdict beside ``path`` whole (``safefile.replace_whole``)."""
    with replace_whole(selfcheck_path(path), "the self-check verdict") as fh:
        fh.write(json.dumps(verdict.to_json()).encode())
