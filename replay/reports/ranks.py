"""The parts of a report about a DDP rank set: where it first went bad (``RankFailure``), the
set a run named (``RankSet``), how its ranks were replayed together (``MultiRankRun``) and each
rank's own check (``RankReplay``). ``to_json()`` is what ``--json`` prints under ``first_bad``,
``rank_set``, ``multi_rank`` and ``ranks``; ``from_json()`` reads it back (a rank's replay
process hands its check to the launcher as JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .divergence import Divergence
from .verdict import Ended, JSONObject

__all__ = ["MultiRankRun", "RankFailure", "RankReplay", "RankSet", "ranks_from_json"]


@dataclass(frozen=True)
class RankFailure:
    """Where a DDP run first went bad: ``step``, the culprit ``ranks`` and what each showed.

    ``kind`` is ``nonfinite``, ``exception`` or ``died``. ``local`` is False when no rank's own
    values explain the failure (only post-all-reduce gradients or parameters went bad: an
    overflow in the reduction itself, or ranks recorded without the DDP gradient probe);
    ``ranks`` then lists every rank that showed it.

    ``died``: the culprit ranks' programs raised outside any step (``ended``, the first one's
    ``/ended``) before ``step``, which they never entered; ``after`` is what the other ranks'
    files showed from then on (their collectives failing for want of the peer, most often).
    """

    step: int
    ranks: tuple[int, ...]
    kind: str
    local: bool
    evidence: dict[int, list[str]] = field(default_factory=dict)  # rank -> what was bad at step
    ended: Ended | None = None
    after: RankFailure | None = None

    @property
    def rank(self) -> int:
        """The rank to replay: the lowest culprit."""
        return self.ranks[0]

    def to_json(self, *, evidence: bool = False) -> dict[str, Any]:
        out = asdict(self) | {"ranks": list(self.ranks)}
        out["evidence"] = {str(r): v for r, v in self.evidence.items()}
        out["after"] = None if self.after is None else self.after.to_json(evidence=evidence)
        if not evidence:
            del out["evidence"]
        if self.kind != "died":  # (the JSON of the other kinds is as it was)
            del out["ended"], out["after"]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RankFailure:
        ev = {int(r): v for r, v in (d.get("evidence") or {}).items()}
        after = d.get("after")
        return cls(
            d["step"],
            tuple(d["ranks"]),
            d["kind"],
            d["local"],
            ev,
            Ended.from_json(d.get("ended")),
            None if after is None else cls.from_json(after),
        )


@dataclass(frozen=True)
class RankSet:
    """The rank set ``spec`` a command's run named: its ``ranks``, where it first went bad, the
    rank replayed (the culprit's, else the lowest) and ``summary``, that in one line."""

    spec: str
    ranks: list[int]
    first_bad: RankFailure | None
    replayed_rank: int
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "first_bad": json_of(self.first_bad)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RankSet:
        fb = d["first_bad"]
        return cls(**{**d, "first_bad": None if fb is None else RankFailure.from_json(fb)})


@dataclass(frozen=True)
class MultiRankRun:
    """Every rank replayed together: ``world_size`` processes on ``backend``, led by ``leader``."""

    world_size: int
    backend: str
    leader: int
    approximate: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MultiRankRun:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class RankReplay:
    """One rank's replay, checked bitwise against its own recording: ``deterministic``, and the
    first ``divergence`` when not. ``replayed_steps``, ``runs`` and ``compared``: the steps it
    ran on its recorded batches, the runs and the steps compared (not for ``whatif``, which
    changes steps on purpose: ``removed_by`` names the changes that removed its failure).
    ``peer_failed_steps``: replayed without the collective a peer raised before; ``trace``:
    what the rank's trace of the culprit step named; ``export``: what ``export`` wrote. The
    JSON leaves out what is ``None`` (the divergence says ``null``)."""

    rank: int
    recording: str
    replayed_steps: list[int] | None = None
    runs: int | None = None
    compared: int | None = None
    deterministic: bool
    divergence: Divergence | None = None
    removed_by: list[str] | None = None
    export: JSONObject | None = None
    peer_failed_steps: list[int] = field(default_factory=list)
    trace: JSONObject | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None or k == "divergence"}
        return {**out, "divergence": json_of(self.divergence)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RankReplay:
        return cls(**{**d, "divergence": Divergence.from_json(d.get("divergence"))})


def ranks_from_json(d: dict[str, Any]) -> dict[str, Any]:
    """The rank-set parts of a report's JSON (``rank_set``, ``multi_rank``, ``ranks``), typed,
    for the report's ``from_json``; absent keys are left out (the report keeps its defaults)."""
    readers: dict[str, Any] = {
        "rank_set": RankSet.from_json,
        "multi_rank": MultiRankRun.from_json,
        "ranks": lambda ranks: {str(r): RankReplay.from_json(x) for r, x in ranks.items()},
    }
    return {k: read(d[k]) for k, read in readers.items() if d.get(k) is not None}


def json_of(value: RankFailure | RankSet | MultiRankRun | Divergence | None) -> Any:
    return None if value is None else value.to_json()


def ranks_json(ranks: dict[str, RankReplay] | None) -> dict[str, Any] | None:
    return None if ranks is None else {r: s.to_json() for r, s in ranks.items()}
