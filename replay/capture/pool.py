"""Host buffers for the batch copies, reused from step to step instead of allocated afresh.

A batch copy lives from the training thread's ``copy_tree`` until the writer thread has sent it
to the writer process, several steps later. Allocated afresh every step, the copies cost the
training thread minor page faults, most of them inside the training step itself: 56 a step on
the benchmark MLP where bare training had none, 1053 on the CNN where it had 157
(``RUSAGE_THREAD``; a fresh 4 KiB page costs ~2 us in this VM). With the copies reused, 12 and
179.

The training thread takes a buffer (``copy``); the writer thread gives it back once its bytes
are sent, to the shared ring or the pipe (``give``). A writer that lags keeps its buffers, so
the pool then allocates as before. Buffers are keyed by shape and dtype; what the pool holds while
idle is capped (``max_bytes``), least recently used shapes going first, so batches whose shape
changes every step cost a little bookkeeping and hold no memory.

A pool made with ``state=True`` is the snapshots' arena (``record/transport.py``): it takes the
model's own tensors too (parameters that require grad; a GPU's, into page-locked buffers copied
to with ``non_blocking=True``), and is not capped: it holds one snapshot's worth between
snapshots, so a snapshot is a copy into memory already mapped (and pinned), not an allocation
of the whole state (the page faults of 2 GiB were 1.9-5.8 s of a 1 GiB model's snapshot on the
CPU, RESULTS.md).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np
import torch

__all__ = ["HostPool", "nbytes", "poolable_array"]

_Key = tuple[Any, ...]


def _plain(t: torch.Tensor) -> bool:
    """A tensor a contiguous buffer of its shape and dtype copies exactly (wherever it is)."""
    return (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
        and t.is_contiguous()
    )


def poolable_array(a: np.ndarray) -> bool:
    return not a.dtype.hasobject


class HostPool:
    def __init__(self, max_bytes: int = 256 << 20, *, state: bool = False) -> None:
        self.max_bytes = max_bytes
        self.state = state  # the snapshots' arena (see the module docstring)
        self._free: collections.OrderedDict[_Key, list[Any]] = collections.OrderedDict()
        self._bytes = 0  # held while idle, in the free lists
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _pop(self, key: _Key, nbytes: int) -> Any:
        if nbytes > self.max_bytes:
            return None  # never pooled: no lock, no miss counted
        with self._lock:
            free = self._free.get(key)
            if not free:
                self.misses += 1
                return None
            self._bytes -= nbytes
            self.hits += 1
            return free.pop()

    def takes(self, t: torch.Tensor) -> bool:
        """Whether ``copy`` takes ``t``: a CPU tensor that a plain contiguous buffer copies
        exactly as ``clone`` would; for the arena, also one that requires grad or lives on a GPU."""
        if not _plain(t):
            return False
        on = t.device.type
        return (on == "cpu" and not t.requires_grad) or (self.state and on in ("cpu", "cuda"))

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` (``takes``) in a pooled buffer; give it back with ``give``. A GPU's
        tensor is copied into a page-locked buffer with ``non_blocking=True``: the caller
        records an event after it (``CopyStats.cuda``)."""
        on_gpu = t.is_cuda
        buf: torch.Tensor | None = self._pop(_key(t, on_gpu), nbytes(t))
        if buf is None:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=on_gpu)
            if on_gpu:
                buf._replay_pinned = True  # type: ignore[attr-defined]
        buf.copy_(t, non_blocking=on_gpu)  # (copy_tree detached it)
        return buf

    def copy_array(self, a: np.ndarray) -> np.ndarray:
        """A C-ordered copy of ``a`` (no object fields) in a pooled buffer, like ``a.copy()``."""
        buf: np.ndarray | None = self._pop(_key(a), a.nbytes)
        if buf is None:
            return a.copy()
        np.copyto(buf, a, casting="no")
        return buf

    def give(self, buffers: list[Any]) -> None:
        """Return buffers nobody reads any more (their bytes are already sent)."""
        with self._lock:
            for buf in buffers:
                key, size = _key(buf), nbytes(buf)
                if size > self.max_bytes:
                    continue
                while self._bytes + size > self.max_bytes and self._free:
                    _, dropped = self._free.popitem(last=False)
                    self._bytes -= sum(nbytes(b) for b in dropped)
                free = self._free.setdefault(key, [])
                self._free.move_to_end(key)
                free.append(buf)
                self._bytes += size

    @property
    def idle_bytes(self) -> int:
        return self._bytes


def _key(buf: Any, pinned: bool | None = None) -> _Key:
    if isinstance(buf, torch.Tensor):
        if pinned is None:
            pinned = getattr(buf, "_replay_pinned", False)
        return ("torch", buf.dtype, buf.shape, pinned)
    return ("numpy", buf.dtype, buf.shape)


def nbytes(buf: Any) -> int:
    """The bytes of a tensor's or an array's elements."""
    if isinstance(buf, torch.Tensor):
        return buf.numel() * buf.element_size()
    return int(buf.nbytes)
