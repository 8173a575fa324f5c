"""What the report page shows, read from a recording and its forensics sidecar (no torch).

The same readers the TUI and ``replay info``/``doctor`` use, and the same typed reports
(``replay.reports``: ``TraceVerdict``, ``DoctorReport``, ``BisectReport``), so that a number on
the page is the number on the other views. Nothing here runs recorded code or unpickles anything;
strings stay as recorded (the page escapes each one: ``escape.py``).
"""

from __future__ import annotations

import os
from contextlib import closing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RecordingError, first_line
from ..reports import BisectReport, Finding, TraceVerdict
from ..reports.verdict import Ended
from ..store import open_recording
from ..store.selfcheck import SelfCheck, read_selfcheck

if TYPE_CHECKING:
    from ..ranks.summary import RankSetSummary
    from ..store.reader import Recording

__all__ = ["RunFacts", "OpsAround", "LayerMap", "read_facts", "OPS_AROUND"]

OPS_AROUND = 100  # ops shown before and after the culprit (a trace may hold millions)
_MAX_LAYERS = 64  # rows of a heat map


@dataclass
class OpsAround:
    """The traced ops ``first..last`` around ``culprit``: one dict per op (``op_row``'s keys)."""

    culprit: int | None
    n_ops: int
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LayerMap:
    """Per layer over steps: ``values[layer, step]`` and the cells that went NaN/Inf."""

    title: str
    labels: list[str]
    steps: np.ndarray
    values: np.ndarray
    bad: np.ndarray


@dataclass
class RunFacts:
    """Everything the page shows of one recording (``read_facts``)."""

    path: str
    run_id: str
    meta: dict[str, Any]
    status: dict[str, int]
    health: dict[str, np.ndarray]
    window: tuple[int, int] | None
    snapshots: list[int]
    symptom: int | None  # first step whose health shows NaN/Inf or an exception
    ended: Ended | None  # the program raised outside any step (the file's /ended)
    selfcheck: SelfCheck | None
    n_params: int
    update_steps: np.ndarray  # steps of the update-ratio curve (each later snapshot of a pair)
    update_ratio: np.ndarray  # median over weight tensors of their per-step update ratio
    layers: list[LayerMap] = field(default_factory=list)
    verdict: TraceVerdict | None = None
    traced_step: int | None = None
    forensics_missing: str | None = None  # why there is no sidecar to show
    ops: OpsAround | None = None
    params: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, dict[int, str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    bisect: BisectReport | None = None
    ranks: RankSetSummary | None = None  # a rank set: every rank's summary

    @property
    def first_bad(self) -> int | None:
        """The step the page marks: bisect's (the traced step of a failure), else the first
        failure the health shows."""
        if self.verdict is not None and self.verdict.kind != "none":
            return self.traced_step
        return self.symptom


def _update_ratios(rec: Recording) -> tuple[np.ndarray, np.ndarray, LayerMap | None]:
    """Per pair of consecutive kept snapshots, each weight tensor's per-step update ratio (as
    ``replay doctor`` measures it: ``doctor/context.py``), and their median."""
    from ..doctor.context import Context

    with closing(Context(rec)) as ctx:
        s, values = ctx.update_ratio_table
    names = [p.name for p in ctx.params]
    finite = [col[np.isfinite(col)] for col in values.T]
    med = [float(np.median(ok)) if ok.size else np.nan for ok in finite]
    rows = [i for i in range(len(names)) if np.isfinite(values[i]).any()][:_MAX_LAYERS]
    title = "update ratio per weight tensor, between kept snapshots"
    bad = np.zeros((len(rows), len(s)), dtype=bool)
    layer_map = LayerMap(title, [names[i] for i in rows], s, values[rows], bad) if rows else None
    return s, np.asarray(med, dtype=np.float64), layer_map


def _object_grads(rec: Recording, h: dict[str, np.ndarray]) -> LayerMap | None:
    """The watched objects' own gradient norms per step (``<object>__grad_norm``), where the
    recording has them (a GAN's generator and discriminator, a second model)."""
    labels = [n for n in rec.watched_objects if f"{n}__grad_norm" in h]
    if not labels:
        return None
    values = np.stack([h[f"{n}__grad_norm"] for n in labels])
    bad = np.stack([h[f"{n}__grad_nonfinite"] == 1 for n in labels])
    return LayerMap(
        "gradient norm per watched model, each step", labels[:_MAX_LAYERS], h["step"], values, bad
    )


def _forensics(facts: RunFacts, rec: Recording) -> None:
    """The sidecar's verdict, ops around the culprit, parameters and source lines; or why
    there is none (absent, another run's, refused)."""
    from ..store.forensics import ForensicsReader, NotAForensicsFile, source_lines

    path = rec.forensics_path
    if not os.path.exists(path):
        facts.forensics_missing = "absent"
        return
    try:
        f = ForensicsReader.open(path)
    except (NotAForensicsFile, OSError) as e:
        facts.forensics_missing = f"refused: {first_line(e)}"
        return
    with f:
        if f.run_id != rec.run_id:
            facts.forensics_missing = "it belongs to another run"
            return
        v = facts.verdict = TraceVerdict.from_json(f.verdict)
        facts.traced_step = int(f.step)
        culprit = v.op_index
        if culprit is None and v.exception is not None:
            culprit = v.exception.get("op_index")
        center = culprit if culprit is not None else 0
        first, last = max(0, center - OPS_AROUND), min(f.n_ops, center + OPS_AROUND + 1)
        facts.ops = OpsAround(culprit, f.n_ops, [f.op_row(i) for i in range(first, last)])
        facts.params = f.params()
        try:
            recorded = rec.sources
        except RecordingError:
            recorded = {}
        facts.sources = source_lines(f.sources(), recorded)


def read_facts(run: str, *, bisect: BisectReport | None = None) -> RunFacts:
    """Read what the page shows of ``run``: a recording, or a DDP rank set's name (``run.h5``
    for ``run.rank<N>.h5``, a directory or a glob), whose culprit rank's file is shown (the
    one ``replay bisect`` replays) beside every rank's summary.

    Raises ``RecordingError`` (one line) when ``run`` is not a readable recording."""
    from ..doctor import diagnose
    from ..ranks.scan import rank_set
    from ..ranks.summary import summarise

    scan = None if os.path.isfile(run) else rank_set(run)
    path = scan.culprit_file()[0] if scan is not None else run
    with open_recording(path) as rec:
        h = rec.health()
        window = rec.replayable_window()
        update_steps, update_ratio, update_map = _update_ratios(rec)
        facts = RunFacts(
            path=path,
            run_id=rec.run_id,
            meta=rec.meta,
            status=rec.status(),
            health=h,
            window=(window.first, window.last) if window else None,
            snapshots=[int(s) for s in rec.snapshot_steps()],
            symptom=rec.first_failure(),
            ended=rec.ended(),
            selfcheck=read_selfcheck(rec.path, rec.run_id),
            n_params=sum(p.numel for p in rec.run_meta.model.params),
            update_steps=update_steps,
            update_ratio=update_ratio,
            bisect=bisect,
        )
        facts.layers = [m for m in (_object_grads(rec, h), update_map) if m is not None]
        _forensics(facts, rec)
    facts.findings = diagnose(path)
    if scan is not None:
        facts.ranks = summarise(scan)
    return facts
