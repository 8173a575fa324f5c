"""The recorder's side of batches by reference (``Recorder(loader=...)``, capture/loader.py).

Each step's reference is the indices the loader's sampler drew for it and the digest of the
batch ``rec.step`` received. The first reference is checked at once: the batch is drawn again
from the dataset (the generators kept as they were) and must have the same digest. A loop that
changes its batches before ``rec.step`` (a scale, a device move), or a dataset that draws random
numbers, fails that check, and the run keeps its batches by value, with one warning.
"""

from __future__ import annotations

from typing import Any

from ..capture.loader import IndexTap, digest, draw, indices_array, kept_rng, tap, untap
from ..capture.tensors import host_leaves
from ..errors import warn_at_user_line

__all__ = ["BatchRefs"]


class BatchRefs:
    """References for the batches of one DataLoader; off (by value) once one cannot be made."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        t = tap(loader)  # (a string: why it cannot be tapped; the batches go by value)
        self.tap: IndexTap | None = t if isinstance(t, IndexTap) else None
        self.checked = False
        if isinstance(t, str):  # the loop asked for references (Recorder(loader=...)): say why not
            warn_at_user_line(f"replay: batches are recorded by value, not by reference: {t}")

    def reference(self, batch: Any) -> dict[str, Any] | None:
        """Step's reference, or ``None``: this batch (and every later one) goes by value."""
        if self.tap is None:
            return None
        idx = self.tap.take()
        if idx is None:
            self._off("a batch came that the loader had not drawn")
            return None
        indices = indices_array(idx)
        if indices is None:
            self._off("its sampler yields other keys than integers")
            return None
        if host_leaves(batch) is None:
            self._off("the batches reach rec.step on a GPU")
            return None
        ref = {"indices": indices, "batched": self.tap.batched, "sha256": digest(batch)}
        if not self.checked:
            self.checked = True
            with kept_rng():
                again = digest(draw(self.loader.dataset, self.loader.collate_fn, ref))
            if again != ref["sha256"]:
                self._off(
                    "the batch rec.step received is not the one the dataset gives for its "
                    "indices (the loop changed it, or the dataset draws random numbers)"
                )
                return None
        return ref

    def _off(self, why: str) -> None:
        self.close()
        warn_at_user_line(
            f"replay: batches are recorded by value from here on, not by reference: {why}"
        )

    def close(self) -> None:
        if self.tap is not None:
            untap(self.loader, self.tap)
            self.tap = None
