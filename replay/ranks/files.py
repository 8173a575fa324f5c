"""A rank set's recordings opened together, by rank (numpy + h5py, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..store.reader import Recording, open_recording
from .names import resolve_rank_files

if TYPE_CHECKING:
    from .scan import RankScan

__all__ = ["RankFiles", "is_rank_recording", "open_rank_set"]


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


def open_rank_set(spec: RankScan | str | list[str]) -> RankFiles:
    """Open every readable rank file of a scan, or of the rank files ``spec`` names (see
    :func:`resolve_rank_files`, or a list of paths), scanned here (one file's name alone reads as
    a set of one rank). The scan's checks are the only ones (a rank twice, files of different
    world sizes, a rank beyond the world size); ranks without a file are listed in ``missing``
    (a rank whose file was lost still leaves the others readable), a damaged one is refused.
    """
    from .scan import RankScan, scan_rank_set

    if not isinstance(spec, RankScan):
        files = (resolve_rank_files(spec) or [spec]) if isinstance(spec, str) else spec
        spec = scan_rank_set(files, strict=False, name=spec if isinstance(spec, str) else None)
        if spec.damaged:
            spec.check()
    recs: dict[int, Recording] = {}
    try:
        for r, f in spec.ranks.items():
            recs[r] = open_recording(f.path)
    except BaseException:
        for rec in recs.values():
            rec.close()
        raise
    return RankFiles(spec.spec, recs, spec.world_size, list(spec.missing))
