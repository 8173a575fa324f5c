"""A rank set's recordings opened together, by rank (numpy + h5py, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import RecordingError
from ..store.reader import Recording, open_recording
from .names import rank_of_name, resolve_rank_files

__all__ = ["RankFiles", "is_rank_recording", "open_rank_set", "rank_health"]


def is_rank_recording(meta: dict[str, Any]) -> bool:
    """Whether a recording's ``meta`` says it is one rank of several."""
    d = meta.get("distributed") or {}
    return int(d.get("world_size") or 1) > 1


@dataclass
class RankFiles:
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

    def __enter__(self) -> RankFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_rank_set(spec: str | list[str], *, name: str | None = None) -> RankFiles:
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
    return RankFiles(name, dict(sorted(recs.items())), world, missing)


def rank_health(paths: str | list[str]) -> dict[int, dict[str, np.ndarray]]:
    """Per-rank health (``Recording.health()``) of a rank set: ``{rank: {column: array}}``.

    For the TUI's side-by-side view; ``paths`` is anything :func:`open_rank_set` accepts.
    """
    with open_rank_set(paths) as rs:
        return {r: rec.health() for r, rec in rs.recordings.items()}
