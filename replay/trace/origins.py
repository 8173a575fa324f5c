"""Where non-finite values come from: the data-flow half of the verdict.

Every non-finite value is traced back to its *origins*, keyed by tensor storage. The rule, for an
op whose output holds NaN or an infinity ("inputs" are its floating tensor inputs, "arguments"
its non-tensor arguments, such as ``masked_fill``'s fill value):

1. an uninitialised allocation (``empty*``, ``new_empty*``, ``resize_``, ``set_``: the op rule
   ``alloc``) is an origin of class ``"alloc"``: whatever bits it holds are never blamed;
2. an op whose inputs and arguments are all finite is a *producer*, class ``"real"``, whatever it
   made (NaN, ``+inf``, or ``-inf``: ``log(0)`` is a producer);
3. an op that makes NaN where no input and no argument held NaN, but some input held an infinity
   (``0 * -inf``, ``inf - inf``, a softmax over a row of ``-inf``):

   - if every infinity in its inputs was put there on purpose (origins of class
     ``"intentional"``, see 4), it is a *producer*, class ``"real"``: that is where a harmless
     mask turned into damage (the softmax over a fully masked row);
   - otherwise it is a *converter*, class ``"nan"``: the infinity was a failure already, and the
     blame goes to the op that made it (``aten::log``); the converter is remembered as where the
     NaN appeared (the verdict's ``nan_from_inf``). Its output carries its inputs' origins and
     its own;
   - with no infinite input at all (the infinity was an argument: ``x * inf`` with ``x == 0``)
     it is a producer of class ``"real"``;
4. an op with a non-finite *argument* that is not case 3 (``masked_fill(mask, -inf)``,
   ``full(size, -inf)``, ``scalar_tensor(-inf)``) writes that value on purpose: an origin of
   class ``"intentional"``, exempt. A constant made before the step outside any traced op (origin
   ``UNKNOWN``, e.g. a module-level ``torch.tensor(-inf)``) counts as intentional too, and so
   does a floating buffer whose only non-finite values are ``-inf`` (origin ``MASK_BUFFER``: a
   causal mask made with ``register_buffer``);
5. any other op with non-finite inputs and output is a *propagator*: its output carries the
   union of its inputs' origins.

Non-finite values already present before the step have external origins: ``BATCH`` (the batch),
``PRESENT`` (parameters, gradients, other buffers, optimizer state), ``UNKNOWN``, ``MASK_BUFFER``.
The batch and present state are not intentional: a NaN made from an infinity of the batch is
blamed on the batch.

Which origins matter is decided later (``verdict.py``) by what reaches the loss, the gradients or
the parameters. A storage whose values become finite again (fully overwritten) forgets its origins.

A storage is known by its address (``storage_key``), and an address outlives its storage: when
``zero_grad()`` frees the gradients present before the step, the allocator hands their addresses
to the new gradients of the backward, and to intermediates; which tensor gets which address
differs from run to run. Every key kept here is therefore held with a weak reference to its
storage, and a key whose storage was freed names nothing: the new tensor at that address is
neither present state nor the batch nor carries the freed one's origins (it did, and a replay
then blamed a NaN gradient on "state non-finite before the step" in some runs and not others).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from replay.trace.rules import rule

__all__ = [
    "BATCH",
    "PRESENT",
    "UNKNOWN",
    "MASK_BUFFER",
    "Origins",
    "Storages",
    "storage_key",
    "storages",
]

BATCH, PRESENT, UNKNOWN, MASK_BUFFER = -2, -3, -4, -5


def storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


class _StorageRef(Protocol):
    def expired(self) -> bool: ...


_weak_ref: Callable[[torch.UntypedStorage], _StorageRef] = StorageWeakRef  # torch's, untyped
Storages = dict[int, _StorageRef]  # storage key -> a weak reference to that storage


def storages(tensors: Iterable[torch.Tensor]) -> Storages:
    """The storages of ``tensors``, by key, each with a weak reference that tells when it is
    freed (and its key then names another storage, or none)."""
    out: Storages = {}
    for t in tensors:
        key = storage_key(t)
        if key is not None and key not in out:
            out[key] = _weak_ref(t.untyped_storage())
    return out


def _alive(keys: Storages, key: int | None) -> bool:
    ref = keys.get(key) if key is not None else None
    return ref is not None and not ref.expired()


def _covers_storage(t: torch.Tensor) -> bool:
    try:
        return t.numel() * t.element_size() >= t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return False


class Origins:
    def __init__(self) -> None:
        self.by_storage: dict[int, frozenset[int]] = {}
        self._bad_storages: Storages = {}  # the storage each key of by_storage was set for
        # origin (op index) -> "real" | "nan" | "intentional" | "alloc"
        self.klass: dict[int, str] = {}
        self.kind: dict[int, str] = {}  # "real" origin -> what it made: nan | inf | neginf
        self.from_intentional: dict[int, frozenset[int]] = {}  # producer (3) -> those origins
        self.batch_keys: Storages = {}
        self.present_keys: Storages = {}
        self.mask_keys: Storages = {}

    def external(self, key: int | None) -> int:
        if _alive(self.batch_keys, key):
            return BATCH
        if _alive(self.mask_keys, key):
            return MASK_BUFFER
        if _alive(self.present_keys, key):
            return PRESENT
        return UNKNOWN

    def _found(self, key: int | None) -> frozenset[int] | None:
        """The origins recorded for the storage at ``key``, while that storage lives."""
        found = self.by_storage.get(key) if key is not None else None
        if found is None or key is None or _alive(self._bad_storages, key):
            return found
        del self.by_storage[key], self._bad_storages[key]  # freed: the address is another's
        return None

    def of(self, t: torch.Tensor) -> frozenset[int]:
        """Origins of a tensor known (or checked) to hold non-finite values."""
        key = storage_key(t)
        found = self._found(key)
        return found if found is not None else frozenset({self.external(key)})

    def known_bad(self, t: torch.Tensor) -> bool:
        return self._found(storage_key(t)) is not None

    def intentional(self, origin: int) -> bool:
        return origin in (UNKNOWN, MASK_BUFFER) or self.klass.get(origin) == "intentional"

    def classify(
        self,
        index: int,
        op: str,
        inputs: list[tuple[torch.Tensor, str]],
        out_kind: str,
        arg_kind: str = "finite",
    ) -> tuple[str, str, frozenset[int]]:
        """``(role, class, origins)`` for an op whose output is non-finite (the rule above).

        ``inputs``: (tensor, kind) for floating inputs, kind as ``stats.finite_kind`` says,
        taken before the op ran for the inputs it mutates. ``arg_kind``: the same for the
        non-tensor arguments. ``role`` is producer, converter, propagator or exempt.
        """
        if rule(op).alloc:
            self.klass[index] = "alloc"
            return "exempt", "alloc", frozenset({index})
        bad = [(t, k) for t, k in inputs if k != "finite"]
        if not bad and arg_kind == "finite":
            return self._new(index, "real", out_kind)
        origins: frozenset[int] = frozenset().union(*(self.of(t) for t, _ in bad))
        new_nan = out_kind == "nan" and arg_kind != "nan" and all(k != "nan" for _, k in bad)
        if new_nan:
            if not bad or all(self.intentional(o) for o in origins):
                self.from_intentional[index] = origins
                return self._new(index, "real", out_kind)
            self.klass[index] = "nan"
            return "converter", "nan", origins | {index}
        if arg_kind != "finite":
            self.klass[index] = "intentional"
            return "exempt", "intentional", origins | {index}
        return "propagator", "", origins

    def _new(self, index: int, klass: str, out_kind: str) -> tuple[str, str, frozenset[int]]:
        self.klass[index] = klass
        self.kind[index] = out_kind
        return "producer", klass, frozenset({index})

    def set_output(self, t: torch.Tensor, origins: frozenset[int] | None) -> None:
        """Record a non-finite output's origins, or forget a finite, storage-covering one."""
        key = storage_key(t)
        if key is None:
            return
        if origins is not None:
            self.by_storage[key] = origins
            if not _alive(self._bad_storages, key):
                self._bad_storages[key] = _weak_ref(t.untyped_storage())
        elif key in self.by_storage and _covers_storage(t):
            del self.by_storage[key], self._bad_storages[key]
