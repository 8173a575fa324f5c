"""A rank's file name and the files of a rank set: path arithmetic and a directory listing only.

Naming (docs/format.md): ``Recorder("run.h5")`` on rank *r* of a multi-process run writes
``run.rank<r>.h5``. A rank set is named by that base path (``run.h5``, when no plain ``run.h5``
exists), by a directory holding one such set, or by a glob (``'runs/run.rank*.h5'``).

The standard library only: the recorder names its file with :func:`rank_path` in the training
process, which never imports the reader (tests/unit/test_import_layers.py).
"""

from __future__ import annotations

import glob
import os
import re

from ..errors import RecordingError

__all__ = ["base_path", "is_rank_file", "rank_of_name", "rank_path", "resolve_rank_files"]

_RANK_RE = re.compile(r"^(?P<root>.*)\.rank(?P<rank>\d+)(?P<ext>\.[^./]*)?$")


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


def is_rank_file(path: str) -> bool:
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
        if len(files) == 1 and not is_rank_file(files[0]):
            return None
        return _sorted_by_rank(spec, files)
    if os.path.isdir(spec):
        files = [
            p for p in glob.glob(os.path.join(glob.escape(spec), "*.rank*.*")) if is_rank_file(p)
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
