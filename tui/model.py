"""What the screens read: one recording and, when ``replay bisect`` wrote one, its forensics sidecar.

Everything goes through the store's reader (``replay.store``, ``replay.store.forensics``): numpy and
h5py only, never torch, never user code, never pickle. Methods that touch the disk are called from
``@work(thread=True)`` workers; the screens keep what they return.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from replay.errors import RecordingError
from replay.ranks.scan import rank_set
from replay.ranks.summary import RankSetSummary, summarise
from replay.reports import TraceVerdict
from replay.safetext import term_safe, term_safe_tree
from replay.store import Recording, open_recording
from replay.store.liveness import WriterState, writer_state
from replay.words import samples_text

if TYPE_CHECKING:
    from replay.store.forensics import ForensicsReader

__all__ = ["RunModel", "SafeForensics", "Marks", "shorten_path", "NO_FORENSICS_HINT"]

NO_FORENSICS_HINT = (
    "No forensics for this run yet. Run `replay bisect {name}` to find the first bad step and "
    "op, or trace any step: `replay trace {name} --step N`, or press t on the overview to trace "
    "the step under the cursor. This view fills in when it finishes."
)


def shorten_path(path: str | None, base: str) -> str:
    """``path`` relative to ``base`` (the recording's folder) or the working directory when it is
    inside them, so that screens show ``model.py:27``, not a long absolute path."""
    if not path:
        return "?"
    for root in (base, os.getcwd()):
        try:
            rel = os.path.relpath(path, root)
        except ValueError:
            continue
        if not rel.startswith(".."):
            return rel
    # elsewhere: the last two components say enough on a narrow screen (full paths are in
    # `replay info`)
    parts = os.path.normpath(path).split(os.sep)
    return os.sep.join(["…", *parts[-2:]]) if len(parts) > 3 else path


class SafeForensics:
    """A forensics reader whose strings are safe to show (``replay.safetext.term_safe``).

    Every string of a sidecar came from a file; the screens get them through this wrapper only,
    so none of them can reach the terminal raw. Numbers pass through unchanged.
    """

    def __init__(self, reader: ForensicsReader) -> None:
        self._r = reader
        self.step = reader.step
        self.n_ops = reader.n_ops
        self.ops_columns = reader.ops_columns  # numbers only: nothing to make safe
        self.verdict = TraceVerdict.from_json(term_safe_tree(reader.verdict))
        self._strings: dict[str, list[str]] = {}

    def strings(self, name: str) -> list[str]:
        if name not in self._strings:
            self._strings[name] = [term_safe(s) for s in self._r.strings(name)]
        return self._strings[name]

    def op_row(self, i: int) -> dict[str, Any]:
        return term_safe_tree(self._r.op_row(i))

    def modules(self) -> list[dict[str, Any]]:
        return term_safe_tree(self._r.modules())

    def params(self) -> list[dict[str, Any]]:
        return term_safe_tree(self._r.params())

    def memory(self) -> dict[str, Any]:
        return term_safe_tree(self._r.memory())

    def sources(self) -> dict[str, Any]:
        return term_safe_tree(self._r.sources())

    def close(self) -> None:
        self._r.close()


@dataclass
class Marks:
    """Steps worth marking on the overview plots."""

    snapshots: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # GradScaler skipped the update (AMP)
    exceptions: list[int] = field(default_factory=list)
    symptom: int | None = None  # first step whose health shows NaN/Inf
    first_bad: int | None = None  # the step bisect blamed (forensics verdict)


class RunModel:
    """A recording plus its optional forensics. ``refresh()`` re-reads a file still being written.

    Example::

        m = RunModel.open("run.h5")
        m.health["loss"], m.marks().symptom, m.forensics.verdict if m.forensics else None
    """

    def __init__(self, rec: Recording, *, rank_spec: str | None = None) -> None:
        self.rec = rec
        # The rank set this recording was picked from (``replay tui run.h5`` on a DDP run), read
        # again on every refresh for the Ranks view; None for a single recording.
        self.rank_spec = rank_spec
        self.ranks: RankSetSummary | None = None
        self.path = rec.path
        self.base = os.path.dirname(os.path.abspath(rec.path))
        self.name = term_safe(os.path.basename(rec.path))
        # What the screens show of the recording's meta: every string made safe for the terminal
        # (the file is untrusted input); rec.meta itself stays as recorded.
        self.meta: dict[str, Any] = term_safe_tree(rec.meta)
        self.forensics: SafeForensics | None = None
        self.forensics_error: str | None = None
        self._forensics_mtime: float | None = None
        self.health: dict[str, np.ndarray] = {}
        self.status: dict[str, int] = {}
        self.writer: WriterState | None = None  # the live writer of the file, if any
        self.refresh()

    @property
    def env(self) -> dict[str, Any]:
        return self.meta.get("env") or {}

    @property
    def entry(self) -> dict[str, Any]:
        return self.meta.get("entry") or {}

    def recorded_sources(self) -> dict[str, str]:
        """The entry points' files as recorded, safe to show (newlines kept)."""
        try:
            recorded = self.rec.sources
        except RecordingError:
            return {}
        return {term_safe(p): term_safe(t, multiline=True) for p, t in recorded.items()}

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RunModel:
        """Open ``path``; raises :class:`RecordingError` with one line when it is not a recording.

        A DDP rank set (the base path ``run.h5`` of ``run.rank<N>.h5``, a directory or a glob)
        opens the culprit rank's file, the one ``replay bisect`` would replay (rank 0's when no
        rank failed), and keeps every rank's summary in ``ranks``.
        """
        spec = os.fspath(path)
        scan = rank_set(spec)  # a missing or damaged rank file: IncompleteRankSetError
        if scan is None:
            return cls(open_recording(spec))
        picked, _ = scan.culprit_file()
        return cls(open_recording(picked), rank_spec=spec)

    def close(self) -> None:
        if self.forensics is not None:
            self.forensics.close()
        self.rec.close()

    # -- live files ------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Re-read health and status, open a sidecar that appeared; True when anything changed."""
        old = self._signature()
        self.status = self.rec.status()
        self.writer = writer_state(self.rec.path)
        self.health = self.rec.health()
        self._load_forensics()
        if self.rank_spec is not None:
            try:
                scan = rank_set(self.rank_spec)
                self.ranks = summarise(scan) if scan is not None else self.ranks
            except (RecordingError, OSError):
                pass  # a rank file mid-rewrite: keep the last summary, the next poll retries
        return old != self._signature()

    def _signature(self) -> tuple[Any, ...]:
        """Changes when the recording, its sidecar, its writer or any rank changed."""
        return (
            self.status.get("steps_total"),
            self.status.get("last_step"),
            self._forensics_mtime,
            self.writer,
            self.ranks.signature() if self.ranks is not None else None,
        )

    def state_text(self) -> str:
        """How the recording stands: closed, still written, or its training dead and its
        writer still committing what training published (``replay info`` says the same)."""
        w = self.writer
        if w is not None and w.draining:
            more = f": {w.steps_to_come} steps to come" if w.steps_to_come else ""
            return f"training died; its writer is still committing{more}"
        if self.status.get("closed"):
            return "closed"
        if w is not None:
            return "live (being recorded)"
        return "not closed (its training and writer died)"

    def _load_forensics(self) -> None:
        path = self.rec.forensics_path
        try:
            mtime = os.path.getmtime(path)
        except OSError:
            return
        if mtime == self._forensics_mtime:
            return
        from replay.store.forensics import ForensicsReader, NotAForensicsFile

        self._forensics_mtime = mtime
        try:
            reader = ForensicsReader.open(path)
        except (NotAForensicsFile, OSError) as e:
            self.forensics_error = term_safe(str(e).splitlines()[0])
            return
        if reader.run_id != self.rec.run_id:
            reader.close()
            self.forensics_error = (
                f"{os.path.basename(path)} belongs to another run; run `replay bisect {self.name}` "
                "again to regenerate it"
            )
            return
        if self.forensics is not None:
            self.forensics.close()
        self.forensics, self.forensics_error = SafeForensics(reader), None

    @property
    def no_forensics_message(self) -> str:
        return self.forensics_error or NO_FORENSICS_HINT.format(name=self.name)

    # -- what the screens show -------------------------------------------------------------------

    def marks(self) -> Marks:
        h = self.health
        m = Marks(snapshots=[int(s) for s in self.rec.snapshot_steps()])
        if len(h.get("step", ())):
            m.skipped = [int(s) for s in h["step"][h["scaler_skipped"] == 1]]
            m.exceptions = [int(s) for s in h["step"][h["raised"] == 1]]
            m.symptom = self.rec.first_failure()
        if self.forensics is not None:
            m.first_bad = int(self.forensics.step)
        return m

    def focus_step(self) -> int | None:
        """The step the run is about: the traced one, else the first failure, else the last."""
        marks = self.marks()
        for s in (marks.first_bad, marks.symptom):
            if s is not None:
                return s
        steps = self.rec.steps()
        return int(steps[-1]) if len(steps) else None

    def batch_steps(self) -> list[int]:
        return [int(s) for s in self.rec.steps()]

    def culprit_samples(self) -> tuple[str, list[Any]]:
        """The verdict's samples and how they index the batch view's tensors (its
        ``sample_layout``: ``batchstats.culprit_parts``); none when they lie along another
        axis than dim 0 (time-major batches), but for micro-batches' ``[micro-batch, row]``."""
        v = self.forensics.verdict if self.forensics is not None else None
        layout = (v.sample_layout if v is not None else None) or "rows"
        if v is None or ((v.sample_axes or [0]) != [0] and layout != "micro"):
            return layout, []
        return layout, list(v.samples or [])

    def culprit_samples_elsewhere(self) -> str | None:
        """The verdict's samples when they lie along another axis than dim 0, as the report
        words them (``along dim 1: 7``, ``[micro-batch, row] along dims 0, 1: [2, 5]``)."""
        if self.forensics is None:
            return None
        v = self.forensics.verdict
        if (v.sample_axes or [0]) == [0] or not v.samples:
            return None
        return samples_text(v)

    def sources(self) -> dict[str, dict[int, str]]:
        """``{path: {line: text}}``: the forensics' lines, else the recorded entry-point files."""
        from replay.store.forensics import source_lines

        kept = self.forensics.sources() if self.forensics is not None else {}
        return source_lines(kept, self.recorded_sources())
