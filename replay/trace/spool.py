"""The op table of a traced step, streamed: rows are buffered and written every ``chunk_rows``
rows to one raw file per column in a private temporary directory, so that a step of millions
of small ops (an LSTMCell unrolled under LBFGS, twenty closure calls) is traced in bounded
memory. The verdict reads single rows back and patches a few statuses; the sidecar is written
from the files in chunks (``OpColumns``).

NB: the files live until ``close()`` (or until the spool is collected); a row is read back
with ``os.pread``, never by mapping the files (mapped pages would count as the tracer's memory).
"""

from __future__ import annotations

import bisect
import os
import shutil
import weakref
from array import array
from collections.abc import Iterator, Mapping
from typing import IO, Any

import numpy as np

from replay.store.forensics import OPS_COLUMNS
from replay.store.tmpdirs import private_dir

__all__ = ["OpSpool", "OpColumns", "NonFiniteTable", "CHUNK_ROWS"]

CHUNK_ROWS = 1 << 15  # rows buffered in memory before they go to the files

_SPEC = {k: (np.dtype(dt), tail) for k, (dt, tail) in OPS_COLUMNS.items()}


def _remove(path: str, files: dict[str, IO[bytes]]) -> None:
    for f in files.values():
        f.close()
    files.clear()
    shutil.rmtree(path, ignore_errors=True)


class OpSpool:
    """Append-only columns with random access: ``spool["status"][i] = 3`` patches a row."""

    def __init__(self, chunk_rows: int | None = None) -> None:
        self.chunk_rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
        self.buf: dict[str, list[Any]] = {k: [] for k in _SPEC}
        self.flushed = 0  # rows already in the files
        self._dir: str | None = None
        self._files: dict[str, IO[bytes]] = {}
        self._patch: dict[str, dict[int, Any]] = {k: {} for k in _SPEC}
        # (sorted rows, value) laid over a column, later ones over earlier ones; then _patch
        self._overlays: dict[str, list[tuple[np.ndarray, Any]]] = {k: [] for k in _SPEC}
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def __len__(self) -> int:
        return self.flushed + len(self.buf["phase"])

    def __getitem__(self, col: str) -> _Column:
        return _Column(self, col)

    def full(self) -> bool:
        return len(self.buf["phase"]) >= self.chunk_rows

    def flush(self) -> None:
        n = len(self.buf["phase"])
        if n == 0:
            return
        if self._dir is None:
            self._dir = private_dir("trace")
            self._finalizer = weakref.finalize(self, _remove, self._dir, self._files)
            for k in _SPEC:
                self._files[k] = open(os.path.join(self._dir, k), "w+b")  # noqa: SIM115 - closed in close()
        for k, (dt, tail) in _SPEC.items():
            arr = np.asarray(self.buf[k], dtype=dt).reshape((n, *tail))
            self._files[k].write(arr.tobytes())
            self._files[k].flush()
            self.buf[k] = []
        self.flushed += n

    def set_rows(self, col: str, rows: np.ndarray, value: Any) -> None:
        """``value`` in column ``col`` at every one of ``rows`` (sorted), in one stroke: the
        verdict sets the status of millions of ops that carried a NaN on this way. Single-row
        ``set`` calls made before are overridden."""
        rows = np.asarray(rows, dtype=np.int64)
        for i in list(self._patch[col]):
            if rows.size and rows[min(int(np.searchsorted(rows, i)), rows.size - 1)] == i:
                del self._patch[col][i]
        self._overlays[col].append((rows, value))

    def get(self, col: str, i: int) -> Any:
        if i < 0 or i >= len(self):
            raise IndexError(f"op {i} out of range (the table has {len(self)} ops)")
        if i in self._patch[col]:
            return self._patch[col][i]
        for rows, value in reversed(self._overlays[col]):
            p = int(np.searchsorted(rows, i))
            if p < rows.size and rows[p] == i:
                return value
        if i >= self.flushed:
            return self.buf[col][i - self.flushed]
        row = self.read(col, i, i + 1)[0]
        return row.item() if row.ndim == 0 else row  # a Python number, as in the buffer

    def set(self, col: str, i: int, value: Any) -> None:
        if i >= self.flushed and not self._overlays[col]:
            self.buf[col][i - self.flushed] = value
        else:
            self._patch[col][i] = value  # a row in the files, or one over the overlays

    def read(self, col: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of one column, patches applied."""
        dt, tail = _SPEC[col]
        start, stop = max(0, start), min(len(self), stop)
        parts = []
        if start < self.flushed:
            end = min(stop, self.flushed)
            size = int(dt.itemsize * int(np.prod(tail, dtype=np.int64)))
            raw = os.pread(self._files[col].fileno(), (end - start) * size, start * size)
            parts.append(np.frombuffer(raw, dtype=dt).reshape((end - start, *tail)))
        if stop > self.flushed:
            lo = max(start, self.flushed) - self.flushed
            hi = stop - self.flushed
            parts.append(np.asarray(self.buf[col][lo:hi], dtype=dt).reshape((hi - lo, *tail)))
        out = np.concatenate(parts) if len(parts) > 1 else (parts[0] if parts else
                                                              np.zeros((0, *tail), dt))  # fmt: skip
        patches = {i: v for i, v in self._patch[col].items() if start <= i < stop}
        if self._overlays[col] or patches:
            out = out.copy()
        for rows, value in self._overlays[col]:
            sel = rows[(rows >= start) & (rows < stop)]
            out[sel - start] = value
        for i, v in patches.items():
            out[i - start] = v
        return out

    def close(self) -> None:
        """Remove the files (also done when the spool is collected)."""
        if self._finalizer is not None:
            self._finalizer()
        self._dir = None


class _Column:
    """One column of a spool: ``col[i]``, ``col[i] = v``, ``len(col)``."""

    def __init__(self, spool: OpSpool, col: str) -> None:
        self.spool, self.col = spool, col

    def __getitem__(self, i: int) -> Any:
        return self.spool.get(self.col, i)

    def __setitem__(self, i: int, value: Any) -> None:
        self.spool.set(self.col, i, value)

    def __len__(self) -> int:
        return len(self.spool)


class OpColumns(Mapping[str, np.ndarray]):
    """The op table as ``{column: array}`` (each column read whole on first use), and in row
    ranges for writing (``read``) without holding it all."""

    def __init__(self, spool: OpSpool) -> None:
        self.spool = spool
        self.rows = len(spool)
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, col: str) -> np.ndarray:
        if col not in _SPEC:
            raise KeyError(col)
        if col not in self._cache:
            self._cache[col] = self.spool.read(col, 0, self.rows)
        return self._cache[col]

    def __iter__(self) -> Iterator[str]:
        return iter(_SPEC)

    def __len__(self) -> int:
        return len(_SPEC)

    def read(self, col: str, start: int, stop: int) -> np.ndarray:
        if col in self._cache:
            return self._cache[col][start:stop]
        return self.spool.read(col, start, stop)


class NonFiniteTable(Mapping[int, Any]):
    """Every op whose output was not finite, in bounded space: a row index, a role code and the
    id of its origin set per op (a few bytes each; after a step turns NaN every op is one), and
    the full record (``findings.NonFinite``) only for those described in detail.

    ``table[i]`` gives back a record for any of them (inputs empty unless detailed).
    """

    ROLES = ("producer", "converter", "propagator", "exempt")

    def __init__(self, make: Any) -> None:
        self._make = make  # (role, klass, origins) -> a record, for the compact ones
        self.index = array("q")
        self.role = array("b")
        self.set_id = array("i")
        self.sets: list[frozenset[int]] = []
        self._set_ids: dict[frozenset[int], int] = {}
        self.klass: dict[int, str] = {}  # compact rows whose class is not "" (rare)
        self.detailed: dict[int, Any] = {}

    def add(self, i: int, role: str, klass: str, origins: frozenset[int], full: Any) -> None:
        k = self._set_ids.get(origins)
        if k is None:
            k = self._set_ids[origins] = len(self.sets)
            self.sets.append(origins)
        self.index.append(i)
        self.role.append(self.ROLES.index(role))
        self.set_id.append(k)
        if full is not None:
            self.detailed[i] = full
        elif klass:
            self.klass[i] = klass

    def _pos(self, i: int) -> int:
        p = bisect.bisect_left(self.index, i)
        if p == len(self.index) or self.index[p] != i:
            raise KeyError(i)
        return p

    def __getitem__(self, i: int) -> Any:
        if i in self.detailed:
            return self.detailed[i]
        p = self._pos(i)
        return self._make(
            self.ROLES[self.role[p]], self.klass.get(i, ""), self.sets[self.set_id[p]]
        )

    def __contains__(self, i: object) -> bool:
        if not isinstance(i, int):
            return False
        p = bisect.bisect_left(self.index, i)
        return p < len(self.index) and self.index[p] == i

    def __iter__(self) -> Iterator[int]:
        return iter(self.index)  # in execution order: rows are added as the ops run

    def __len__(self) -> int:
        return len(self.index)

    def rows_where(self, set_ids: set[int]) -> np.ndarray:
        """Rows of the ops whose origin set is one of ``set_ids``."""
        ids = np.asarray(self.set_id, dtype=np.int32)  # (views of the arrays' buffers)
        return np.asarray(self.index, dtype=np.int64)[np.isin(ids, list(set_ids))]
