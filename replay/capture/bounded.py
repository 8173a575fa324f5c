"""The limits on what a step record holds of a per-step value (``rec.step(batch, name=value)``).

A per-step value is meant to be small: a learning rate, an iteration number, a curriculum knob,
an RNN's carried hidden state. A value beyond :data:`VALUE_LIMITS` is not recorded: the step's
record holds ``{"replay_unrecorded": "<why>"}`` in its place (the step function still gets the
value itself), the recorder warns once, and a replay whose step function takes that value refuses
with the reason. Without the limits a tuple nested 2000 deep killed training with a
``RecursionError``, and ``xs=list(range(2_000_000))`` made each step take seconds (two million
JSON nodes a step).

Checking costs at most what the limits allow: the walk stops at the first excess, and a list or
dict longer than the leaf limit is refused by its length alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .pool import nbytes

__all__ = ["VALUE_LIMITS", "UNRECORDED", "value_excess", "unrecorded", "is_unrecorded"]

#: ``depth``: lists, tuples and dicts nested inside each other (a flat list is depth 1);
#: ``leaves``: their entries, all levels together; ``bytes``: the tensor and array payload (and
#: string lengths) of one value.
VALUE_LIMITS = {"depth": 32, "leaves": 10_000, "bytes": 64 << 20}

UNRECORDED = "replay_unrecorded"


def value_excess(obj: Any) -> str | None:
    """Why ``obj`` is beyond :data:`VALUE_LIMITS`, or ``None`` when a step record can hold it."""
    max_depth, max_leaves, max_bytes = (VALUE_LIMITS[k] for k in ("depth", "leaves", "bytes"))
    leaves = size = 0
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        o, depth = stack.pop()
        if isinstance(o, (torch.Tensor, np.ndarray)):
            size += nbytes(o)
        elif isinstance(o, (str, bytes)):
            size += len(o)
        elif isinstance(o, (list, tuple, dict)):
            if depth >= max_depth:
                return f"nested more than {max_depth} levels deep"
            leaves += len(o)  # (each entry once, whatever it holds: the walk stays bounded)
            if leaves > max_leaves:
                break
            items = o.values() if isinstance(o, dict) else o
            stack.extend((v, depth + 1) for v in items)
        if size > max_bytes:
            return f"more than {max_bytes >> 20} MiB"
    if leaves > max_leaves:
        return f"more than {max_leaves} elements"
    return None


def unrecorded(reason: str) -> dict[str, str]:
    """What a step record holds in place of a value beyond the limits."""
    return {UNRECORDED: reason}


def is_unrecorded(value: Any) -> str | None:
    """The reason a recorded value was left out (``None``: it was recorded)."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(UNRECORDED), str):
        reason: str = value[UNRECORDED]
        return reason
    return None
