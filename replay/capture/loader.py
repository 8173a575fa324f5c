"""Batches by reference: a DataLoader over a map-style dataset names each batch by the sample
indices its sampler drew, and replay draws the batch again from the dataset.

Recording (``Recorder(loader=...)``): :class:`IndexTap` sits in place of the loader's batch
sampler (or sampler, without automatic batching) and keeps, in order, the indices of every
batch the loader will yield; ``rec.step`` takes the oldest and records ``{"indices", "batched",
"sha256"}`` (the digest of the collated batch as the step received it) instead of its bytes.
The loader's iterator asks the sampler for indices ahead of the batches it yields (prefetch,
workers), in the same order: first in, first out. Replay (which re-runs the program and so has
its loader) calls :func:`draw` with the dataset and the collate function the program made, and
refuses a batch whose digest differs (:class:`~replay.errors.DataChangedError`): the data changed since the recording.

Nothing here runs on a loader it does not know: :func:`tap` says why a loader cannot be
recorded by reference (an iterable-style dataset, a sampler of non-integer keys), and the
recorder keeps batches by value then.
"""

from __future__ import annotations

import collections
import hashlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from ..errors import DataChangedError
from ..store.tree import encode
from .tensors import to_leaves

__all__ = ["IndexTap", "tap", "untap", "digest", "draw", "check_drawn", "kept_rng"]


def digest(batch: Any) -> str:
    """SHA-256 of a batch as the format encodes it (manifest: structure, dtypes, shapes; then
    every buffer's bytes): equal digests, equal batches, bit for bit."""
    manifest, buffers = encode(to_leaves(batch))
    h = hashlib.sha256(repr(manifest).encode())
    for b in buffers:
        h.update(
            np.ascontiguousarray(b).reshape(-1).view(np.uint8).data
            if isinstance(b, np.ndarray)
            else b
        )
    return h.hexdigest()


class IndexTap:
    """Stands in for a loader's index sampler; behaves as it (iteration, ``len``, attributes)
    and keeps what each of its iterations yielded, oldest first."""

    def __init__(self, inner: Any, batched: bool) -> None:
        self.inner, self.batched = inner, batched
        self.drawn: collections.deque[tuple[int, Any]] = collections.deque()
        self.generation = 0

    def __iter__(self) -> Iterator[Any]:
        self.generation += 1
        mine = self.generation
        # A new pass over the loader: what an abandoned one had drawn ahead is never yielded.
        while self.drawn and self.drawn[0][0] < mine:
            self.drawn.popleft()
        for idx in self.inner:
            self.drawn.append((mine, idx))
            yield idx

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def take(self) -> Any:
        """The indices of the oldest batch not yet taken (``None`` when none is known)."""
        return self.drawn.popleft()[1] if self.drawn else None


def tap(loader: Any) -> IndexTap | str:
    """Put an :class:`IndexTap` in ``loader``; a string says why it cannot be (batches by
    value then)."""
    if not isinstance(loader, DataLoader):
        return f"{type(loader).__name__} is not a torch DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return "its dataset is iterable-style: no index names a batch"
    batched = loader.batch_sampler is not None
    name = "batch_sampler" if batched else "sampler"
    inner = getattr(loader, name)
    if isinstance(inner, IndexTap):
        return inner
    t = IndexTap(inner, batched)
    # DataLoader refuses to have its samplers set after __init__ (its __setattr__); the tap
    # yields exactly what the sampler yields, so the loader's behaviour is unchanged.
    object.__setattr__(loader, name, t)
    return t


def untap(loader: Any, t: IndexTap) -> None:
    """Put the loader's own sampler back."""
    name = "batch_sampler" if t.batched else "sampler"
    if getattr(loader, name, None) is t:
        object.__setattr__(loader, name, t.inner)


def indices_array(idx: Any) -> np.ndarray | None:
    """The indices as int64 (``None`` when they are not plain integers)."""
    try:
        a = np.asarray(idx)
    except (TypeError, ValueError):
        return None
    if a.dtype.kind not in "iu" or a.ndim > 1:
        return None
    return a.astype(np.int64)


def draw(dataset: Any, collate_fn: Any, ref: dict[str, Any]) -> Any:
    """The batch ``ref`` names, drawn from ``dataset`` as torch's map-style fetcher does."""
    idx = np.asarray(ref["indices"]).tolist()
    if not ref.get("batched", True):
        return collate_fn(dataset[idx])
    getitems = getattr(dataset, "__getitems__", None)
    data = getitems(idx) if getitems else [dataset[i] for i in idx]
    return collate_fn(data)


def check_drawn(batch: Any, ref: dict[str, Any], step: int) -> None:
    """Refuse a batch drawn again whose digest is not the recorded one."""
    got = digest(batch)
    if got != ref.get("sha256"):
        idx = np.asarray(ref["indices"]).reshape(-1).tolist()
        shown = ", ".join(map(str, idx[:6])) + (", ..." if len(idx) > 6 else "")
        raise DataChangedError(
            f"step {step}: the data changed since the recording: the batch drawn again from "
            f"the dataset (samples {shown}) does not match the recorded one (sha256 "
            f"{str(ref.get('sha256'))[:12]}, drawn {got[:12]}); it is not replayed"
        )


class kept_rng:  # noqa: N801 - used as a context manager, like torch.random.fork_rng
    """Draws made inside leave python's, numpy's and torch's CPU generators as they were: a
    dataset that draws random numbers must not change the run's (or the replay's) own."""

    def __enter__(self) -> None:
        self._states = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def __exit__(self, *exc: object) -> None:
        py, npy, cpu = self._states
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
