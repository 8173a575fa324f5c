"""Memory in use during the traced step.

On CUDA the allocator knows (``torch.cuda.memory_allocated``). On the CPU there is no allocator
to ask, so this accounts for the storages of every tensor the tracer sees (inputs and outputs
of each op), counted once per storage and released by a weak reference's callback on the tensors
that keep it alive. Tensors the tracer never sees (inside fused kernels) are not counted.

The largest storages alive are listed at the peak: a snapshot is taken only when the running
total is about to fall from a new peak (a local maximum), not at every op.
"""

from __future__ import annotations

import heapq
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TypedDict

import torch

__all__ = ["MemoryTracker", "LargeStorage", "MemoryPicture"]

N_LARGEST = 8


class LargeStorage(TypedDict):
    """One of the largest storages alive at the peak, as the sidecar lists it."""

    shape: list[int]
    dtype: str
    bytes: int
    op_index: int  # the op that first showed it
    op: str


class MemoryPicture(TypedDict):
    """The sidecar's ``/memory``."""

    peak_bytes: int
    peak_op: int
    largest: list[LargeStorage]


@dataclass(slots=True)
class _Storage:
    """A storage being counted, described by the first tensor seen using it."""

    nbytes: int
    tensors: int  # tracked tensors alive that use it
    shape: list[int]
    dtype: str
    op_index: int
    op: str


class _Ref(weakref.ref[torch.Tensor]):
    """A weak reference to a counted tensor that knows its id and storage key."""

    __slots__ = ("tid", "key")

    def __new__(cls, t: torch.Tensor, callback: Callable[[_Ref], None], tid: int, key: int) -> _Ref:
        return super().__new__(cls, t, callback)

    def __init__(
        self, t: torch.Tensor, callback: Callable[[_Ref], None], tid: int, key: int
    ) -> None:
        # (weakref.ref's own __init__ only checks the arguments __new__ took)
        self.tid, self.key = tid, key


class MemoryTracker:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_op = -1
        self.largest: list[LargeStorage] = []
        self._peak_dirty = False
        self._storages: dict[int, _Storage] = {}  # by storage key (its data pointer)
        # a weak reference to each tensor alive that is counted, by id; dropped when the tensor
        # dies (a ``weakref.finalize`` each cost several times more: millions of small ops)
        self._refs: dict[int, _Ref] = {}
        self.on_free: Callable[[int], object] | None = None  # told each storage key let go
        self.seen: Collection[int] = self._refs  # ids of the tensors counted

    def see(self, t: torch.Tensor, op_index: int, op_name: str) -> None:
        """Count ``t``'s storage (once) until the last tensor using it dies."""
        tid = id(t)
        if tid in self._refs:
            return
        try:
            st = t.untyped_storage()
            key = st.data_ptr()
            nbytes = st.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse, meta, functional wrappers
            return
        entry = self._storages.get(key)
        if entry is None:
            self._storages[key] = _Storage(
                nbytes, 1, list(t.shape), str(t.dtype)[6:], op_index, op_name
            )
            self.live_bytes += nbytes
        else:
            entry.tensors += 1
        self._refs[tid] = _Ref(t, self._release, tid, key)

    def counts(self, key: int) -> bool:
        """Whether the storage with this key is being counted (a tensor using it is alive)."""
        return key in self._storages

    def _release(self, ref: _Ref) -> None:
        tid, key = ref.tid, ref.key
        if self._refs.get(tid) is ref:
            del self._refs[tid]
        entry = self._storages.get(key)
        if entry is None:
            return
        entry.tensors -= 1
        if entry.tensors <= 0:
            if self._peak_dirty:
                self._snapshot()
            del self._storages[key]
            self.live_bytes -= entry.nbytes
            if self.on_free is not None:
                self.on_free(key)

    def _snapshot(self) -> None:
        self._peak_dirty = False
        top = heapq.nlargest(N_LARGEST, self._storages.values(), key=lambda e: e.nbytes)
        self.largest = [
            {
                "shape": e.shape,
                "dtype": e.dtype,
                "bytes": int(e.nbytes),
                "op_index": int(e.op_index),
                "op": e.op,
            }
            for e in top
        ]

    def after_op(self, op_index: int) -> int:
        """Bytes in use after op ``op_index``; tracks the peak."""
        now = torch.cuda.memory_allocated() if self.cuda else self.live_bytes
        if now > self.peak_bytes:
            self.peak_bytes = now
            self.peak_op = op_index
            self._peak_dirty = True
        return now

    def picture(self) -> MemoryPicture:
        """What the sidecar's ``/memory`` holds."""
        return {"peak_bytes": self.peak_bytes, "peak_op": self.peak_op, "largest": self.largest}

    def close(self) -> None:
        """List the largest storages of a peak not listed yet, then stop accounting and drop the
        weak references and their callbacks (tensors that outlive the trace owe us nothing)."""
        if self._peak_dirty:
            self._snapshot()
        self._refs.clear()
        self._storages.clear()
