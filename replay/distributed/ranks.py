"""Rank sets: the per-rank recordings of one DDP run, and the first (step, rank) that went bad.

Naming (docs/format.md): ``Recorder("run.h5")`` on rank *r* of a multi-process run writes
``run.rank<r>.h5``. A rank set is named by that base path (``run.h5``, when no plain ``run.h5``
exists), by a directory holding one such set, or by a glob (``'runs/run.rank*.h5'``).

Why the *local* columns decide: the all-reduce averages gradients, so one rank's NaN shows in every
rank's ``grad_norm`` and parameters at the same step. Only the loss, the exception and the gradient
measured before the all-reduce (``local_grad_norm``) belong to one rank.

numpy + h5py only (no torch): ``replay info`` and the TUI read rank sets without it.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import RecordingError
from ..store.reader import Recording, open_recording

__all__ = [
    "RankEvidence",
    "RankFailure",
    "RankSet",
    "base_path",
    "describe_failure",
    "first_bad_rank",
    "is_collective_error",
    "own_failures",
    "open_rank_set",
    "rank_evidence",
    "rank_health",
    "rank_of_name",
    "rank_path",
    "resolve_rank_files",
]

_RANK_RE = re.compile(r"^(?P<root>.*)\.rank(?P<rank>\d+)(?P<ext>\.[^./]*)?$")
# Exceptions a rank raises because *another* rank failed (a collective timed out or its peer
# vanished): never the culprit when a rank with its own failure exists at the same step.
_COLLECTIVE_ERRORS = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
# What gloo and NCCL say, inside a plain RuntimeError (DDP's all-reduce runs in a comm hook
# future: "Got the following error when running the callback: ..."), when a peer crashed or
# never joined the collective.
_PEER_GONE = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker crashing",
    "timed out waiting",
    "nccl communicator was aborted",
    "watchdog caught collective operation timeout",
)


def rank_path(path: str, rank: int) -> str:
    """The file rank ``rank`` records to: ``run.h5`` -> ``run.rank3.h5``.

    A path that already names this rank (``run.rank3.h5`` on rank 3) is kept as it is, so scripts
    that build per-rank names themselves do not get ``run.rank3.rank3.h5``.
    """
    m = _RANK_RE.match(path)
    if m and int(m["rank"]) == rank:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.h5'}"


def base_path(path: str) -> str | None:
    """The base path of a rank file (``run.rank3.h5`` -> ``run.h5``), ``None`` for other names."""
    m = _RANK_RE.match(path)
    return f"{m['root']}{m['ext'] or ''}" if m else None


def rank_of_name(path: str) -> int | None:
    """The rank a file's name says (``run.rank3.h5`` -> 3), ``None`` for other names."""
    m = _RANK_RE.match(path)
    return int(m["rank"]) if m else None


def _is_rank_file(path: str) -> bool:
    return rank_of_name(path) is not None and not path.endswith(".forensics.h5")


def resolve_rank_files(spec: str) -> list[str] | None:
    """The rank files ``spec`` names, sorted by rank; ``None`` when it names one plain recording.

    ``spec`` is a base path (``run.h5`` with ``run.rank*.h5`` beside it), a directory holding one
    rank set, or a glob. A path that exists is a file or a directory before it is a glob
    (``exp[1].h5`` names that file). Raises :class:`RecordingError` when it names nothing usable.
    """
    if os.path.isfile(spec):
        return None  # a plain recording, whatever its name holds (``exp[1].h5`` is a file)
    if any(c in spec for c in "*?[") and not os.path.isdir(spec):
        files = [p for p in glob.glob(spec) if os.path.isfile(p)]
        if not files:
            raise RecordingError(f"{spec}: the pattern matches no file")
        if len(files) == 1 and not _is_rank_file(files[0]):
            return None
        return _sorted_by_rank(spec, files)
    if os.path.isdir(spec):
        files = [
            p for p in glob.glob(os.path.join(glob.escape(spec), "*.rank*.*")) if _is_rank_file(p)
        ]
        if not files:
            raise RecordingError(
                f"{spec}: a directory without rank recordings (NAME.rank<N>.h5); "
                "name a recording file instead"
            )
        bases = sorted({b for p in files if (b := base_path(p)) is not None})
        if len(bases) > 1:
            names = ", ".join(os.path.basename(b) for b in bases if b)
            raise RecordingError(f"{spec}: holds several rank sets ({names}); name one of them")
        return _sorted_by_rank(spec, files)
    if os.path.exists(spec):
        return None  # a plain recording (a single rank file opened on its own is one too)
    root, ext = os.path.splitext(spec)
    pattern = f"{glob.escape(root)}.rank*{glob.escape(ext or '.h5')}"
    files = [p for p in glob.glob(pattern) if base_path(p) == (spec if ext else spec + ".h5")]
    if not files:
        return None  # let the single-file reader say "no such file"
    return _sorted_by_rank(spec, files)


def _sorted_by_rank(spec: str, files: list[str]) -> list[str]:
    ranks: dict[int, str] = {}
    for p in files:
        r = rank_of_name(p)
        if r is None:
            raise RecordingError(f"{p}: not a rank recording (expected NAME.rank<N>.h5)")
        if r in ranks:
            raise RecordingError(f"{spec}: rank {r} appears twice ({ranks[r]}, {p})")
        ranks[r] = p
    return [ranks[r] for r in sorted(ranks)]


@dataclass
class RankSet:
    """The open recordings of one DDP run, by rank. Close it (or use it as a context manager)."""

    spec: str
    recordings: dict[int, Recording]
    world_size: int | None
    missing: list[int] = field(default_factory=list)

    @property
    def paths(self) -> dict[int, str]:
        return {r: rec.path for r, rec in self.recordings.items()}

    def close(self) -> None:
        for rec in self.recordings.values():
            rec.close()

    def __enter__(self) -> RankSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_rank_set(spec: str | list[str], *, name: str | None = None) -> RankSet:
    """Open every rank file ``spec`` names (see :func:`resolve_rank_files`, or a list of paths).

    The rank comes from each file's ``meta.distributed`` (the file name only when that is null);
    files of different world sizes are refused, and ranks absent from the set are listed in
    ``missing`` (a rank whose file was lost still leaves the others readable).
    """
    if isinstance(spec, str):
        files = resolve_rank_files(spec)
        if files is None:
            files = [spec]
        name = spec
    else:
        files, name = list(spec), name or ", ".join(spec)
    recs: dict[int, Recording] = {}
    try:
        sizes = set()
        for p in files:
            rec = open_recording(p)
            d = rec.meta.get("distributed") or {}
            r = d.get("rank", rank_of_name(p))
            if r is None:
                rec.close()
                raise RecordingError(f"{p}: not recorded under DDP and not named NAME.rank<N>.h5")
            if r in recs:
                rec.close()
                raise RecordingError(f"{name}: rank {r} appears twice ({recs[r].path}, {p})")
            recs[int(r)] = rec
            if d.get("world_size") is not None:
                sizes.add(int(d["world_size"]))
        if len(sizes) > 1:
            raise RecordingError(
                f"{name}: files of different runs (world sizes {sorted(sizes)}); "
                "name the files of one run"
            )
    except BaseException:
        for rec in recs.values():
            rec.close()
        raise
    world = sizes.pop() if sizes else None
    missing = [r for r in range(world) if r not in recs] if world else []
    return RankSet(name, dict(sorted(recs.items())), world, missing)


def rank_health(paths: str | list[str]) -> dict[int, dict[str, np.ndarray]]:
    """Per-rank health (``Recording.health()``) of a rank set: ``{rank: {column: array}}``.

    For the TUI's side-by-side view; ``paths`` is anything :func:`open_rank_set` accepts.
    """
    with open_rank_set(paths) as rs:
        return {r: rec.health() for r, rec in rs.recordings.items()}


@dataclass(frozen=True)
class RankFailure:
    """Where a DDP run first went bad: ``step``, the culprit ``ranks`` and what each showed.

    ``kind`` is ``nonfinite`` or ``exception``. ``local`` is False when no rank's own values
    explain the failure (only post-all-reduce gradients or parameters went bad: an overflow in the
    reduction itself, or ranks recorded without the DDP gradient probe); ``ranks`` then lists
    every rank that showed it.
    """

    step: int
    ranks: tuple[int, ...]
    kind: str
    local: bool
    evidence: dict[int, list[str]]  # rank -> the columns/exception that were bad at ``step``

    @property
    def rank(self) -> int:
        """The rank to replay: the lowest culprit."""
        return self.ranks[0]

    def to_json(self, *, evidence: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "ranks": list(self.ranks),
            "kind": self.kind,
            "local": self.local,
        }
        if evidence:
            out["evidence"] = {str(r): v for r, v in self.evidence.items()}
        return out


def is_collective_error(exc: dict[str, Any] | None) -> bool:
    """Whether a recorded exception (``{type, module, message}``) is a collective that failed
    because a peer did (timed out, or its process vanished), not the rank's own failure."""
    if not exc:
        return False
    if exc.get("type") in _COLLECTIVE_ERRORS or str(exc.get("module", "")).startswith(
        "torch.distributed"
    ):
        return True
    msg = str(exc.get("message", "")).lower()
    return any(p in msg for p in _PEER_GONE)


def _is_collective_exception(rec: Recording, step: int) -> bool:
    try:
        exc = rec.read_step(step).get("exception") or {}  # (a dict of strings: check_record)
    except KeyError:  # its record left the ring: judge it by its health alone
        return False
    return is_collective_error(exc)


def own_failures(rec: Recording, h: dict[str, np.ndarray] | None = None) -> dict[int, list[str]]:
    """Steps at which this rank's *own* values went bad (``loss``, ``local_grad``, ``exception``).

    A ``torch.distributed`` error (a collective that timed out because a peer failed) is not the
    rank's own failure.
    """
    h = rec.health() if h is None else h
    out: dict[int, list[str]] = {}
    for col, reason in (("loss_nonfinite", "loss"), ("local_grad_nonfinite", "local_grad")):
        for s in h["step"][h[col] == 1]:
            out.setdefault(int(s), []).append(reason)
    for s in h["step"][h["raised"] == 1]:
        if not _is_collective_exception(rec, int(s)):
            out.setdefault(int(s), []).append("exception")
    return out


@dataclass(frozen=True)
class RankEvidence:
    """Where one rank's file first shows a failure: its *own* (``loss``, ``local_grad``,
    ``exception``) and what it saw after the all-reduce (``grad_nonfinite``,
    ``param_nonfinite``, ``raised``). Small, so a scan's worker processes hand it back."""

    own_step: int | None
    own: tuple[str, ...]
    seen_step: int | None
    seen: tuple[str, ...]


def rank_evidence(rec: Recording, h: dict[str, np.ndarray] | None = None) -> RankEvidence:
    """What ``rec`` (one rank's file) contributes to :func:`first_bad_rank`."""
    h = rec.health() if h is None else h
    own = own_failures(rec, h)
    own_step = min(own) if own else None
    seen: dict[int, list[str]] = {}
    skipped = h["scaler_skipped"] == 1
    for col in ("grad_nonfinite", "param_nonfinite", "raised"):
        mask = h[col] == 1
        if col == "grad_nonfinite":
            mask &= ~skipped
        if mask.any():
            seen.setdefault(int(h["step"][mask].min()), []).append(col)
    seen_step = min(seen) if seen else None
    return RankEvidence(
        own_step,
        tuple(own[own_step]) if own_step is not None else (),
        seen_step,
        tuple(seen[seen_step]) if seen_step is not None else (),
    )


def first_bad_rank(
    rank_set: RankSet | dict[int, Recording] | dict[int, RankEvidence],
) -> RankFailure | None:
    """The first step at which some rank's own loss, gradients or step went bad, and which ranks.

    ``None`` when no rank shows a failure. Among the ranks bad at that step all are named; an
    exception counts before a non-finite value only in ``kind``, never by hiding a rank.
    ``rank_set`` may also be each rank's :func:`rank_evidence` (what a scan collects).
    """
    recs = rank_set.recordings if isinstance(rank_set, RankSet) else rank_set
    ev = {r: x if isinstance(x, RankEvidence) else rank_evidence(x) for r, x in recs.items()}
    owns = [e.own_step for e in ev.values() if e.own_step is not None]
    if owns:
        step = min(owns)
        evidence = {r: list(e.own) for r, e in ev.items() if e.own_step == step}
        kind = "exception" if any("exception" in v for v in evidence.values()) else "nonfinite"
        return RankFailure(step, tuple(sorted(evidence)), kind, True, evidence)
    # No rank's own values went bad: fall back to what every rank sees after the all-reduce.
    seens = [e.seen_step for e in ev.values() if e.seen_step is not None]
    if not seens:
        return None
    step = min(seens)
    evidence = {r: list(e.seen) for r, e in ev.items() if e.seen_step == step}
    kind = "exception" if all(v == ["raised"] for v in evidence.values()) else "nonfinite"
    return RankFailure(step, tuple(sorted(evidence)), kind, False, evidence)


def describe_failure(f: RankFailure | None) -> str:
    """One line for people: where the run went bad and on which rank(s)."""
    if f is None:
        return "no rank recorded a NaN/Inf or an exception"
    who = ", ".join(f"rank {r} ({'+'.join(f.evidence[r])})" for r in f.ranks)
    if f.local:
        return f"first bad at step {f.step} on {who}"
    return (
        f"step {f.step} went bad on {who} after the all-reduce, but no rank's own loss or "
        "gradients did (an overflow in the reduction, or ranks recorded without the DDP probe)"
    )
