"""The step log: steps the training thread publishes straight into memory the writer process reads.

A step is safe when ``Recorder.step`` returns. The training thread writes a step's record (its
encoded payload, then its health row) into this log, a memfd shared with the writer process,
and *publishes* it by storing the end of the record in the log's first word. The writer process
reads whatever is published, commits it to the HDF5 file and releases the bytes. Nothing the
training thread wrote is in its own process only: a ``kill -9`` of training right after ``step``
returned loses nothing; a record being written when training died was never published and is
discarded whole. There is no thread to wake and no pipe write per step.

Layout (every number little-endian, records 8-byte aligned, positions growing monotonically and
taken modulo ``size``)::

    control (64 bytes): published end (u64), released end (u64; the writer process's), pad
    record: length (u64; 0 = "the rest of the ring is unused, go on at its start"),
            step (i64), snapshot slot (i64; -1 for a step), sequence (u64),
            manifest length (u64), payload length (u64), health columns (u64),
            health row (f64 x columns; none for a snapshot), payload, padding to 8

Only the training thread writes records and ``published``; only the writer process writes
``released``. Each side stores its word after the bytes it covers (x86-64 keeps stores in order;
the word is one aligned 8-byte store).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .memfd import create_shared

__all__ = ["StepLog", "LogRecord", "LOG_BYTES"]

LOG_BYTES = 64 << 20
_CTRL = 64
_HEAD = struct.Struct("<QqqQQQQ")  # length, step, slot, seq, mlen, payload length, columns
_heads: dict[int, struct.Struct] = {}  # the header and a health row of so many columns


def _align(n: int) -> int:
    return (n + 7) & ~7


@dataclass
class LogRecord:
    step: int
    slot: int  # the snapshot slot, or -1: a step
    seq: int
    mlen: int
    health: np.ndarray  # float64 row, a view of the log
    payload: np.ndarray  # uint8, a view of the log
    end: int  # position just past this record


class StepLog:
    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        # Every page mapped up front: a step's copy into a fresh page of a memfd costs a page
        # fault per 4 KiB, which made the copy dozens of times slower than the copy itself.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self._mm = mmap.mmap(fd, _CTRL + size, flags=flags)
        buf = np.frombuffer(self._mm, dtype=np.uint8)
        ctrl = buf[:16].view(np.uint64)
        self._published = ctrl[0:1]
        self._released = ctrl[1:2]
        self.data = buf[_CTRL:]
        self.size = size
        self.head = int(self._published[0])  # the parent's next write position
        self.seq = 0
        # start, step, slot, mlen, n, ncols of the record begun and not yet published
        self._open: tuple[int, int, int, int, int, int] | None = None

    @classmethod
    def create(cls, size: int = LOG_BYTES) -> StepLog | None:
        """The training process's side, or ``None`` where memfd is missing (Linux only) or its
        memory cannot be had: the log's pages are allocated here, once, so that a write into
        it can never fail later (a shared page that cannot be allocated is a SIGBUS)."""
        size = -(-size // 4096) * 4096
        return create_shared("replay-steps", _CTRL + size, lambda fd: cls(fd, size), allocate=True)

    @classmethod
    def attach(cls, fd: int) -> StepLog:
        """The writer process's side, over the descriptor it inherited."""
        return cls(fd, os.fstat(fd).st_size - _CTRL)

    # -- training thread ------------------------------------------------------------------------

    def free(self) -> int:
        """Bytes the writer process has released that the training thread may write over."""
        return self.size - (self.head - int(self._released[0]))

    def begin(
        self, step: int, parts: list[np.ndarray], mlen: int, ncols: int, slot: int = -1
    ) -> bool:
        """Copy a step's (or, with ``slot``, a snapshot's) payload into the log, not yet
        published; ``False`` when it does not fit now (the writer process behind, or a payload
        larger than half the log). ``parts``: its pieces as 1-D uint8 arrays (``pack_parts``)."""
        n = sum([p.size for p in parts])
        total = _align(_HEAD.size + 8 * ncols + n)
        if total > self.size // 2:
            return False
        start = self.head
        room = self.size - start % self.size
        if room < total:  # a record never wraps: mark the rest unused, go on at the start
            start += room
        if start + total - int(self._released[0]) > self.size:
            return False
        if start != self.head:
            self.data[self.head % self.size : self.head % self.size + 8].view(np.uint64)[0] = 0
        pos = start % self.size + _HEAD.size + 8 * ncols
        for p in parts:
            self.data[pos : pos + p.size] = p
            pos += p.size
        self._open = (start, step, slot, mlen, n, ncols)
        self.head = start
        return True

    def begun(self) -> tuple[np.ndarray, int]:
        """The begun record's payload as copied into the log (a copy of it) and its manifest
        length."""
        assert self._open is not None
        start, _, _, mlen, n, ncols = self._open
        at = start % self.size + _HEAD.size + 8 * ncols
        return self.data[at : at + n].copy(), mlen

    def abandon(self) -> None:
        """Drop the record begun and not published (the step raised: it goes another way)."""
        self._open = None

    def publish(self, health: Sequence[float]) -> None:
        """Write the begun record's header and health row, then make it visible."""
        assert self._open is not None
        start, step, slot, mlen, n, ncols = self._open
        assert len(health) == ncols
        total = _align(_HEAD.size + 8 * ncols + n)
        self.seq += 1
        head = _heads.get(ncols) or _heads.setdefault(
            ncols, struct.Struct(f"{_HEAD.format}{ncols}d")
        )
        head.pack_into(
            self._mm,
            _CTRL + start % self.size,
            total,
            step,
            slot,
            self.seq,
            mlen,
            n,
            ncols,
            *health,
        )
        self.head = start + total
        self._open = None
        self._published[0] = self.head  # last: the record is whole before it is visible

    # -- writer process -------------------------------------------------------------------------

    def published(self) -> int:
        return int(self._published[0])

    def released(self) -> int:
        """Where a writer process that takes over this log from a dead one starts reading: every
        record before it is in the file."""
        return int(self._released[0])

    def read(self, pos: int, end: int) -> Iterator[LogRecord]:
        """The records published between ``pos`` and ``end`` (views into the log)."""
        while pos < end:
            at = pos % self.size
            length = int(self.data[at : at + 8].view(np.uint64)[0])
            if length == 0:  # the rest of the ring was skipped
                pos += self.size - at
                continue
            total, step, slot, seq, mlen, n, ncols = _HEAD.unpack_from(self._mm, _CTRL + at)
            if total != length or at + total > self.size:
                raise ValueError(f"step log: a record at {pos} claims {total} bytes")
            row = self.data[at + _HEAD.size : at + _HEAD.size + 8 * ncols].view(np.float64)
            body = at + _HEAD.size + 8 * ncols
            pos += total
            yield LogRecord(step, slot, seq, mlen, row, self.data[body : body + n], pos)

    def release(self, end: int) -> None:
        """Every record up to position ``end`` is in the file: the parent may write over it."""
        if end > int(self._released[0]):
            self._released[0] = end

    def pending_steps(self) -> list[int]:
        """The steps published and not yet released: what a writer process that dies now
        leaves in the log (a successor commits them, ``writer_process.py``, ``reopen``)."""
        return [r.step for r in self.read(self.released(), self.published()) if r.slot < 0]

    def close(self) -> None:
        """Close the descriptor (once: a second call must not close a number reused since)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
