"""Capturing and restoring every random number generator a training step may draw from.

Bitwise replay works when the states are captured *after* the batch was fetched,
immediately before the step, and restored before each replayed step.
"""

from __future__ import annotations

import ctypes
import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng", "rng_to_tree", "restore_rng"]


_VIEWS: dict[tuple[int, int], Any] = {}  # ctypes arrays over a generator's state, by address


def _raw(addr: int, n: int) -> bytes:
    """The ``n`` bytes at ``addr``, through a ctypes array made once per address (``.raw`` is a
    fifth of ``ctypes.string_at``'s price, a Python function around a foreign call)."""
    view = _VIEWS.get((addr, n))
    if view is None:
        view = _VIEWS[(addr, n)] = (ctypes.c_char * n).from_address(addr)
    raw: bytes = view.raw
    return raw


class _NumpyState:
    """``np.random.get_state()`` at 1 µs instead of ~80 µs when the generator was not used.

    The legacy generator's MT19937 state (624 keys and a position, 2,500 bytes) is read raw
    through its ctypes address; when those bytes are unchanged and no cached gaussian was
    pending (drawing the cached value changes ``has_gauss`` without touching the keys), the last
    full state is still exact. Most training loops never draw from numpy's global generator.
    """

    RAW_BYTES = 624 * 4 + 4

    def __init__(self) -> None:
        self._bits: Any = None  # the bit generator read (held: its memory stays its own)
        self._addr: int | None = None
        self._raw: bytes | None = None
        self._state: Any = None

    def __call__(self) -> Any:
        # ``np.random.set_bit_generator`` swaps the global generator's bits: an address taken
        # once read the old one's unchanged memory ever after (a stale state recorded)
        bits = getattr(np.random.mtrand._rand, "_bit_generator", None)
        if bits is not self._bits:
            self._bits, self._raw, self._state = bits, None, None
            try:
                self._addr = bits.ctypes.state_address if type(bits) is np.random.MT19937 else None
            except AttributeError:
                self._addr = None
        if self._addr is None:  # (another bit generator's state: a dict, as numpy gives it)
            if type(bits) is np.random.MT19937:
                return np.random.get_state()
            return np.random.get_state(legacy=False)
        raw = _raw(self._addr, self.RAW_BYTES)
        if raw == self._raw and self._state is not None and not self._state[3]:
            return self._state
        self._raw, self._state = raw, np.random.get_state()
        return self._state


_numpy_state = _NumpyState()


class _PythonState:
    """``random.getstate()`` at ~1 us instead of ~13 us (~20 us in a training loop) when the
    generator was not used since the last call.

    CPython's ``_random.Random`` object is the object header followed by ``int index`` and the
    624 MT19937 words. The layout is checked once, against ``getstate()`` and the type's size;
    anything unexpected (another interpreter, a debug or free-threaded build) falls back to
    ``getstate()`` every call. ``gauss()`` returns its cached value without drawing, so
    ``gauss_next`` is compared too.
    """

    RAW_BYTES = 4 + 624 * 4

    def __init__(self, inst: Any = None) -> None:
        # The module's hidden Random instance: the one random.getstate is bound to.
        self._inst = inst if inst is not None else random.getstate.__self__  # type: ignore[attr-defined]  # a bound method
        self._addr: int | None = None
        self._raw: bytes | None = None
        self._state: Any = None
        head = 2 * ctypes.sizeof(ctypes.c_void_p)
        try:
            import _random

            if (
                not isinstance(self._inst, _random.Random)
                or _random.Random.__basicsize__ < head + self.RAW_BYTES
            ):
                return
            addr = id(self._inst) + head
            raw = ctypes.string_at(addr, self.RAW_BYTES)
            # random.Random.getstate(): (version, internal state, gauss_next); typeshed types
            # it as _random.Random's here, after the isinstance above.
            internal: Any = self._inst.getstate()[1]
            words = np.frombuffer(raw, dtype=np.uint32, offset=4)
            index = int.from_bytes(raw[:4], "little", signed=True)
            if tuple(words.tolist()) + (index,) == internal:
                self._addr = addr
        except Exception:  # noqa: BLE001 - any surprise means: read it the documented way
            self._addr = None

    def __call__(self) -> Any:
        if self._addr is None:
            return self._inst.getstate()
        raw = _raw(self._addr, self.RAW_BYTES)
        state = self._state
        if raw == self._raw and state is not None and state[2] == self._inst.gauss_next:
            return state
        self._raw, self._state = raw, self._inst.getstate()
        return self._state


_python_state = _PythonState()


def capture_rng() -> tuple[Any, Any, torch.Tensor, list[torch.Tensor] | None]:
    """Raw states (cheap, on the training thread); ``rng_to_tree`` encodes them later."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None  # type: ignore[no-untyped-call]  # torch stubs
    return _python_state(), _numpy_state(), torch.get_rng_state(), cuda


_last_python: list[Any] = [None, None]  # (state tuple, its array): most loops never draw


def _python_words(internal: tuple[int, ...]) -> np.ndarray:
    """python's 625 state words as uint64, converted again only when they changed (~20 us)."""
    if internal != _last_python[0]:
        _last_python[:] = [internal, np.asarray(internal, dtype=np.uint64)]
    words: np.ndarray = _last_python[1]
    return words


def rng_to_tree(raw: tuple[Any, Any, torch.Tensor, list[torch.Tensor] | None]) -> dict[str, Any]:
    """The store's representation (numpy arrays, no python tuples of 625 ints)."""
    py, npy, cpu, cuda = raw
    version, internal, gauss = py
    if isinstance(npy, dict):  # np.random.set_bit_generator(PCG64(...)): not in the format
        raise ValueError(
            f"numpy's global generator runs on {npy.get('bit_generator')}: replay keeps the "
            "state of numpy's default (MT19937) only; draw from a np.random.Generator the "
            "step's batch seeds instead"
        )
    kind, keys, pos, has_gauss, cached = npy
    return {
        "python": {
            "version": version,
            "state": _python_words(internal),
            "gauss": gauss,
        },
        "numpy": {
            "kind": kind,
            "keys": keys,
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(cached),
        },
        "torch": cpu.numpy(),
        "cuda": [s.numpy() for s in cuda] if cuda is not None else None,
    }


def restore_rng(tree: dict[str, Any], *, cuda: bool = True) -> None:
    """Put every generator back in the state ``tree`` describes (as read from the store)."""
    py = tree["python"]
    random.setstate((py["version"], tuple(np.asarray(py["state"]).tolist()), py["gauss"]))
    n = tree["numpy"]
    np.random.set_state((n["kind"], n["keys"], n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(torch.from_numpy(np.asarray(tree["torch"], dtype=np.uint8).copy()))
    states = tree.get("cuda")
    if cuda and states and torch.cuda.is_available():
        n_dev = min(len(states), torch.cuda.device_count())
        torch.cuda.set_rng_state_all(
            [torch.from_numpy(np.asarray(s, dtype=np.uint8).copy()) for s in states[:n_dev]]
        )
