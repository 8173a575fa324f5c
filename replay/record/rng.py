"""Capturing and restoring every random number generator a training step may draw from.

FINDINGS.md: bitwise replay works when the states are captured *after* the batch was fetched,
immediately before the step, and restored before each replayed step.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng", "rng_to_tree", "restore_rng"]


def capture_rng() -> tuple[Any, Any, torch.Tensor, list[torch.Tensor] | None]:
    """Raw states (cheap, on the training thread); ``rng_to_tree`` encodes them later."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def rng_to_tree(raw: tuple[Any, Any, torch.Tensor, list[torch.Tensor] | None]) -> dict[str, Any]:
    """The store's representation (numpy arrays, no python tuples of 625 ints)."""
    py, npy, cpu, cuda = raw
    version, internal, gauss = py
    kind, keys, pos, has_gauss, cached = npy
    return {
        "python": {
            "version": version,
            "state": np.asarray(internal, dtype=np.uint64),
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
    random.setstate((py["version"], tuple(int(x) for x in py["state"]), py["gauss"]))
    n = tree["numpy"]
    np.random.set_state((n["kind"], n["keys"], n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(torch.from_numpy(np.asarray(tree["torch"], dtype=np.uint8).copy()))
    states = tree.get("cuda")
    if cuda and states and torch.cuda.is_available():
        n_dev = min(len(states), torch.cuda.device_count())
        torch.cuda.set_rng_state_all(
            [torch.from_numpy(np.asarray(s, dtype=np.uint8).copy()) for s in states[:n_dev]]
        )
