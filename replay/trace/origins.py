"""Where non-finite values come from: the data-flow half of the verdict.

Every non-finite value is traced back to its *origins*, keyed by tensor storage:

- an op that makes non-finite output out of finite floating inputs is a *producer* and a new
  origin. Its class is ``"mask"`` when the output's only non-finite values are ``-inf`` (an
  attention mask, ``log(0)``), ``"real"`` otherwise (NaN or ``+inf``);
- an uninitialised allocation (``empty*``, ``new_empty*``, ``resize_``, ``set_``) is an origin of
  class ``"alloc"``: whatever bits it holds are never blamed;
- an op that takes non-finite input and gives non-finite output is a *propagator*: its output
  carries the union of its inputs' origins. Exception: when every non-finite input value is a
  ``-inf`` of class ``"mask"`` and the output holds NaN (``-inf - -inf``, softmax over a fully
  masked row), the op becomes a ``"real"`` producer itself: that is where a harmless mask turned
  into damage;
- non-finite values already present before the step have external origins: ``BATCH`` (the
  batch), ``PRESENT`` (parameters, gradients, optimizer state), ``UNKNOWN``.

Which origins matter is decided later (``verdict.py``) by what reaches the loss, the gradients or
the parameters. A storage whose values become finite again (fully overwritten) forgets its origins.
"""

from __future__ import annotations

import torch

__all__ = ["BATCH", "PRESENT", "UNKNOWN", "EXTERNAL_NAMES", "ALLOC_OPS", "Origins", "storage_key"]

BATCH, PRESENT, UNKNOWN = -2, -3, -4
EXTERNAL_NAMES = {BATCH: "batch", PRESENT: "present before the step", UNKNOWN: "unknown"}

ALLOC_OPS = frozenset(
    {
        "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
        "aten::new_empty_strided", "aten::resize_", "aten::resize_as_", "aten::set_",
        "aten::empty_permuted",
    }
)


def storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _covers_storage(t: torch.Tensor) -> bool:
    try:
        return t.numel() * t.element_size() >= t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return False


class Origins:
    def __init__(self) -> None:
        self.by_storage: dict[int, frozenset[int]] = {}
        self.klass: dict[int, str] = {}  # origin (op index) -> "real" | "mask" | "alloc"
        self.batch_keys: set[int] = set()
        self.present_keys: set[int] = set()

    def external(self, key: int | None) -> int:
        if key in self.batch_keys:
            return BATCH
        if key in self.present_keys:
            return PRESENT
        return UNKNOWN

    def of(self, t: torch.Tensor) -> frozenset[int]:
        """Origins of a tensor known (or checked) to hold non-finite values."""
        key = storage_key(t)
        found = self.by_storage.get(key) if key is not None else None
        return found if found is not None else frozenset({self.external(key)})

    def known_bad(self, t: torch.Tensor) -> bool:
        key = storage_key(t)
        return key is not None and key in self.by_storage

    def classify(
        self, index: int, op: str, inputs: list[tuple[torch.Tensor, str]], out_kind: str
    ) -> tuple[str, str, frozenset[int]]:
        """``(role, class, origins)`` for an op whose output is non-finite.

        ``inputs``: (tensor, kind) for floating inputs, kind as ``stats.finite_kind`` says,
        taken before the op ran for the inputs it mutates.
        """
        if op in ALLOC_OPS:
            self.klass[index] = "alloc"
            return "exempt", "alloc", frozenset({index})
        bad = [(t, k) for t, k in inputs if k != "finite"]
        if not bad:
            klass = "mask" if out_kind == "neginf" else "real"
            self.klass[index] = klass
            return "producer", klass, frozenset({index})
        origins: frozenset[int] = frozenset().union(*(self.of(t) for t, _ in bad))
        only_mask = all(k == "neginf" for _, k in bad) and all(
            self.klass.get(o) == "mask" for o in origins
        )
        if out_kind == "nan" and only_mask:
            self.klass[index] = "real"
            return "producer", "real", frozenset({index})
        return "propagator", "", origins

    def set_output(self, t: torch.Tensor, origins: frozenset[int] | None) -> None:
        """Record a non-finite output's origins, or forget a finite, storage-covering one."""
        key = storage_key(t)
        if key is None:
            return
        if origins is not None:
            self.by_storage[key] = origins
        elif key in self.by_storage and _covers_storage(t):
            del self.by_storage[key]
