"""Numbers out of recorded trees, without torch: TensorLeaf -> float numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..store.tree import TensorLeaf

__all__ = ["as_float", "as_array"]


def as_array(leaf: Any) -> np.ndarray | None:
    """A leaf's values as numpy (bfloat16 widened to float32); None for non-array leaves."""
    if isinstance(leaf, TensorLeaf):
        return leaf.values
    if isinstance(leaf, np.ndarray):
        return leaf
    return None


def as_float(leaf: Any) -> np.ndarray | None:
    """A floating leaf as float64; None when the leaf is not a floating tensor."""
    a = as_array(leaf)
    if a is None or a.dtype.kind != "f":
        return None
    return a.astype(np.float64, copy=False)
