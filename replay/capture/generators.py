"""A random generator the program made itself, kept in every snapshot when given to ``objects=``.

The Recorder keeps torch's, numpy's global and python's generators at every step. One of the
program's own (``generator=gen`` for a diffusion's noise, ``np.random.default_rng(seed)``,
``random.Random(seed)``) moves at every step too, so a replay from a later snapshot drew other
numbers. Given by name (``objects={..., "noise": gen}``), :func:`generator_view` gives it the
``state_dict`` pair snapshots keep: torch's bytes (a uint8 tensor), numpy's and python's state as
JSON text (a PCG64 state holds 128-bit integers; an array is ``{"ndarray": [...], "dtype": ...}``).
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import torch

__all__ = ["generator_view"]


def _plain(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return {"ndarray": x.tolist(), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"a generator state holds {type(x).__name__}")


def _arrays(x: Any) -> Any:
    if isinstance(x, dict):
        if set(x) == {"ndarray", "dtype"}:
            return np.asarray(x["ndarray"], dtype=np.dtype(x["dtype"]))
        return {k: _arrays(v) for k, v in x.items()}
    return x


class _GeneratorState:
    """One generator's state as a ``state_dict`` (see the module docstring)."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen

    def state_dict(self) -> dict[str, Any]:
        g = self.gen
        if isinstance(g, torch.Generator):
            return {"torch": g.get_state()}
        if isinstance(g, np.random.Generator):
            state = g.bit_generator.state
        elif isinstance(g, np.random.RandomState):
            state = g.get_state(legacy=False)
        else:
            state = g.getstate()
        return {"json": json.dumps(state, default=_plain)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        g = self.gen
        if isinstance(g, torch.Generator):
            g.set_state(d["torch"])
            return
        state = _arrays(json.loads(d["json"]))
        if isinstance(g, np.random.Generator):
            g.bit_generator.state = state
        elif isinstance(g, np.random.RandomState):
            g.set_state(state)
        else:  # random.Random: (version, the internal state as a tuple, the gauss in waiting)
            version, internal, gauss = state
            g.setstate((version, tuple(internal), gauss))


def generator_view(obj: Any) -> _GeneratorState | None:
    """A ``state_dict`` view of ``obj`` when it is a random generator, else ``None``."""
    kinds = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)
    return _GeneratorState(obj) if isinstance(obj, kinds) else None
