"""Statistics of many small finite outputs, computed in batches.

A step of many tiny ops (an LSTMCell unrolled under LBFGS: 4-us ops) cannot afford a dozen
numpy calls per op. The tracer copies a small finite output's values once
(``stats.copy_small``) and hands the copy (at most ``STAGE_MAX`` values) here with its row;
every ``MAX_VALUES`` values the statistics and histograms of all of them are computed at once
with segmented reductions (``np.minimum.reduceat``, ``np.add.reduceat``, one ``bincount``) and
written into the rows.

The results match ``stats.np_stats`` for finite values: min, max, mean (a float64 sum), std,
absmax, zeros, numel, and the histogram over the same strided sample of at most
``HIST_SAMPLE``-ish values per tensor. The sum of squares is taken in float64 here.

Only finite values are staged: a non-finite output is measured at once (it needs its kinds
for the verdict), so the NaN/Inf counts of a staged row are zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from replay.trace.stats import HIST_SAMPLE, N_BINS

__all__ = ["Stage", "quick_finite", "MAX_VALUES", "STAGE_MAX"]

STAGE_MAX = 1 << 12  # values: a larger output is measured at once (per-call costs are small)
MAX_VALUES = 1 << 16  # staged values per batch: its temporaries stay in the CPU caches


def quick_finite(a: np.ndarray) -> bool:
    """True when every value of ``a`` is finite (one sum: NaN and Inf carry through it). A
    sum that overflows from finite values says False; the caller then checks exactly."""
    return math.isfinite(np.add.reduce(a))


class Stage:
    """Rows waiting for their statistics. ``write(rows, stats, hists)`` stores a batch: ``stats``
    an ``(n, 10)`` float64 array in ``Stats`` column order, ``hists`` an ``(n, N_BINS)`` float32."""

    def __init__(
        self,
        write: Callable[[list[int], np.ndarray, np.ndarray], None],
        copy: Callable[[int, int], None],
    ) -> None:
        self._write = write
        self._copy = copy  # copy(row, src): row's statistics are src's (both measured)
        self.rows: list[int] = []
        self.arrays: list[np.ndarray] = []
        self.aliases: list[tuple[int, int]] = []
        self.values = 0

    def add(self, row: int, a: np.ndarray) -> None:
        """Stage the finite values ``a`` (a flat copy) of op row ``row``."""
        self.rows.append(row)
        self.arrays.append(a)
        self.values += a.size
        if self.values >= MAX_VALUES:
            self.flush()

    def alias(self, row: int, src: int) -> None:
        """Row ``row`` holds the same values as the staged row ``src`` (a transpose, a view, a
        detach of it): it gets ``src``'s statistics without being measured."""
        if self.rows and src >= self.rows[0]:  # src is still waiting
            self.aliases.append((row, src))
        else:
            self._copy(row, src)

    def flush(self) -> None:
        if self.rows:
            rows, arrays = self.rows, self.arrays
            self.rows, self.arrays, self.values = [], [], 0
            self._write(rows, *measure(arrays))
        aliases, self.aliases = self.aliases, []
        for row, src in aliases:
            self._copy(row, src)


def measure(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(stats, hists)`` of non-empty flat arrays of finite values, all at once."""
    k = len(arrays)
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=k)
    starts = np.zeros(k, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    # float32 unless a float64 tensor is among them (their own precision, as per op)
    x = np.concatenate(arrays)
    lo = np.minimum.reduceat(x, starts).astype(np.float64)
    hi = np.maximum.reduceat(x, starts).astype(np.float64)
    s = np.add.reduceat(x, starts, dtype=np.float64)
    sq = np.add.reduceat(x * x, starts, dtype=np.float64)
    zeros = np.add.reduceat((x == 0).view(np.uint8), starts, dtype=np.int64)
    n = sizes.astype(np.float64)
    mean = s / n
    stats = np.empty((k, 10), dtype=np.float64)
    stats[:, 0], stats[:, 1], stats[:, 2] = lo, hi, mean
    stats[:, 3] = np.sqrt(np.maximum(0.0, sq / n - mean * mean))
    stats[:, 4] = np.maximum(np.abs(lo), np.abs(hi))
    stats[:, 5:8] = 0.0
    stats[:, 8], stats[:, 9] = zeros, n
    return stats, _hists(arrays, x, sizes, lo, hi)


def _hists(
    arrays: list[np.ndarray], x: np.ndarray, sizes: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """16-bin histograms over ``[lo, hi]`` per segment, over an evenly strided sample of at
    most about ``HIST_SAMPLE`` values, scaled to the segment's size (as ``stats._sample_hist``)."""
    k = len(arrays)
    steps = np.maximum(1, sizes // HIST_SAMPLE)
    sampled = steps > 1
    if sampled.any():
        sample = np.concatenate([a[::st] if st > 1 else a for a, st in zip(arrays, steps.tolist())])
        counts = -(-sizes // steps)
    else:
        sample, counts = x, sizes
    width = hi - lo
    flat = width > 0
    scale = np.where(flat, N_BINS / np.where(flat, width, 1.0), 0.0)
    idx = (sample - np.repeat(lo, counts)) * np.repeat(scale, counts)
    bins = idx.astype(np.int64)
    np.minimum(bins, N_BINS - 1, out=bins)
    bins += np.repeat(np.arange(0, k * N_BINS, N_BINS, dtype=np.int64), counts)
    hists = np.bincount(bins, minlength=k * N_BINS).reshape(k, N_BINS).astype(np.float32)
    if sampled.any():
        hists[sampled] *= (sizes[sampled] / counts[sampled]).astype(np.float32)[:, None]
    # a single value or a constant tensor: every value counted in the first bin
    single = (sizes < 2) | ~flat
    if single.any():
        hists[single] = 0.0
        hists[single, 0] = sizes[single]
    return hists
