"""Per-sample statistics of a recorded batch, with numpy (the batch comes from the store reader)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replay.safetext import term_safe
from replay.store import TensorLeaf
from replay.store.tree import Key, leaf_path, leaves

__all__ = ["LeafStats", "batch_leaves", "as_float", "culprit_parts"]


def _numbers(data: np.ndarray) -> np.ndarray:
    """float64 values of a numeric array (complex: magnitudes); NaN ("no statistic") for
    strings, bytes, dates and anything else a batch may hold."""
    kind = data.dtype.kind
    if kind in "biuf":
        return np.asarray(data, dtype=np.float64)
    if kind == "c":
        return np.asarray(np.abs(data), dtype=np.float64)
    return np.full(data.shape, np.nan)


def as_float(leaf: Any) -> tuple[np.ndarray, str]:
    """A leaf as a float64 array (bfloat16 decoded: ``TensorLeaf.values``) and its dtype name."""
    if isinstance(leaf, TensorLeaf):
        return _numbers(leaf.values), leaf.dtype
    arr = np.asarray(leaf)
    return _numbers(arr), str(arr.dtype)


@dataclass
class LeafStats:
    """One tensor of the batch: shape, dtype, and per-sample rows along its first dimension."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    mean: np.ndarray
    std: np.ndarray
    absmax: np.ndarray
    nonfinite: np.ndarray  # count of NaN/Inf per sample
    keys: tuple[Key, ...] = ()  # where it sits in the batch's tree

    @property
    def n(self) -> int:
        return len(self.mean)


def _per_sample(keys: tuple[Key, ...], leaf: Any) -> LeafStats:
    x, dtype = as_float(leaf)
    path = leaf_path(keys)
    path, dtype = term_safe(path), term_safe(dtype)  # keys and dtype names come from the file
    shape = tuple(x.shape)
    if x.ndim:
        rows = x.reshape(shape[0], -1) if x.size else np.zeros((shape[0], 0))
    else:
        rows = x.reshape(1, 1)
    bad = ~np.isfinite(rows)
    clean = np.where(bad, np.nan, rows)
    with np.errstate(all="ignore"):
        has = (~bad).any(axis=1)
        mean, std, absmax = (np.full(len(rows), np.nan) for _ in range(3))
        if has.any():
            mean[has] = np.nanmean(clean[has], axis=1)
            std[has] = np.nanstd(clean[has], axis=1)
            absmax[has] = np.nanmax(np.abs(clean[has]), axis=1)
    return LeafStats(path, shape, dtype, mean, std, absmax, bad.sum(axis=1), keys)


def batch_leaves(batch: Any) -> list[LeafStats]:
    """Every tensor of ``batch`` (any nesting, named by ``leaf_path``) with per-sample statistics."""
    return [
        _per_sample(keys, leaf)
        for keys, leaf in leaves(batch)
        if isinstance(leaf, (TensorLeaf, np.ndarray))
    ]


def culprit_parts(lf: LeafStats, layout: str, samples: list[Any]) -> tuple[bool, set[int]]:
    """Whether the tensor ``lf`` belongs to a culprit sample whole, and which of its rows are
    culprit samples, for the verdict's ``samples`` laid out as ``layout`` (its
    ``sample_layout``): ``rows`` of every tensor; a list's ``items``; positions in ``zipped``
    sequences (``[part][sample]``: detection's images and targets), whose tensors' rows are
    samples too; ``micro``-batches' ``[micro-batch, row]`` pairs."""
    keys = [k for kind, k in lf.keys] if all(kind == "seq" for kind, _ in lf.keys[:2]) else []
    if layout == "items" and keys:
        return keys[0] in samples, set()
    if layout == "zipped" and len(keys) > 1:
        return keys[1] in samples, set()
    if layout == "micro":
        return False, {r for m, r in samples if keys and m == keys[0]}
    return False, set(samples)
