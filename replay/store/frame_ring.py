"""Frame bodies in shared memory between the recorder and its writer process, not in the pipe.

On 2 saturated cores every CPU microsecond of recording comes out of training. Through the pipe
a step's bytes were copied twice by the kernel, into freshly allocated pipe pages and out again:
about 100 us of the writer thread's CPU a step for the benchmark MLP's 140 KB, and the largest
part of the writer process's. Here the writer thread copies a body into a ring of pages that stay
mapped for the whole run, the pipe carries only the header with the body's place, and the writer
process hands HDF5 a view of the ring.

The ring is a memfd (Linux), passed to the child as an inherited descriptor and never named in a
filesystem, so nothing is left behind by a ``kill -9``. Positions grow monotonically. The parent
(one writer thread) owns ``head``; the child publishes ``tail``, the end of the last body it has
committed, in the first 8 bytes, and the parent never writes past ``tail + size``. A body that
does not fit (the child lagging, or a body larger than the ring) goes through the pipe as before.
Durability is the pipe's: the body is in the ring before its header is in the pipe, so a frame
the parent finished sending survives the parent.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

from .memfd import create_shared

__all__ = ["FrameRing", "RING_BYTES"]

RING_BYTES = 32 << 20  # a commit window of the benchmark MLP takes ~8 MiB
_CTRL = 64  # the first bytes: tail (u64), then padding to a cache line


class FrameRing:
    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self._mm = mmap.mmap(fd, _CTRL + size)
        buf = np.frombuffer(self._mm, dtype=np.uint8)
        self._tail = buf[:8].view(np.uint64)
        self.data = buf[_CTRL:]
        self.size = size
        self.head = 0

    @classmethod
    def create(cls, size: int = RING_BYTES) -> FrameRing | None:
        """The parent's side, or ``None`` where memfd is missing (then the pipe carries all)."""
        return create_shared("replay-frames", _CTRL + size, lambda fd: cls(fd, size))

    @classmethod
    def attach(cls, fd: int) -> FrameRing:
        """The child's side, over the descriptor it inherited."""
        return cls(fd, os.fstat(fd).st_size - _CTRL)

    # -- parent --------------------------------------------------------------------------------

    def put(self, parts: list[np.ndarray], n: int) -> tuple[int, int] | None:
        """Copy ``parts`` (``n`` bytes in all) into the ring: ``(offset, end)``, or ``None``
        when they do not fit now."""
        if n <= 0 or n > self.size:
            return None
        start = self.head
        if start % self.size + n > self.size:  # a body never wraps: skip to the ring's start
            start += self.size - start % self.size
        tail = int(self._tail[0])
        if start + n - tail > self.size and tail < self.head:  # (all released: any place is free)
            return None
        pos = offset = start % self.size
        for p in parts:
            b = np.ascontiguousarray(p).reshape(-1).view(np.uint8)
            self.data[pos : pos + b.size] = b
            pos += b.size
        self.head = start + n
        return offset, start + n

    # -- child ---------------------------------------------------------------------------------

    def body(self, offset: int, n: int) -> memoryview:
        return self.data[offset : offset + n].data

    def release(self, end: int) -> None:
        """Every body up to position ``end`` is committed: the parent may write over it."""
        if end > int(self._tail[0]):
            self._tail[0] = end

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
