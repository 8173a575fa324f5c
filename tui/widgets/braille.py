"""Drawing series with braille dots (2x4 per cell): no plotting dependency, works over SSH."""

from __future__ import annotations

import numpy as np

__all__ = ["column_ranges", "braille_rows", "bin_edges"]

# bit of dot (x, y) in a braille cell, x in 0..1, y in 0..3 from the top
_DOT = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))


def bin_edges(n: int, columns: int) -> np.ndarray:
    """Index ranges ``[edges[c], edges[c+1])`` of ``n`` points spread over ``columns``."""
    if n <= columns:
        # fewer points than columns: each point owns a run of columns
        return np.floor(np.arange(columns + 1) * n / columns).astype(np.int64)
    return np.linspace(0, n, columns + 1).astype(np.int64)


def column_ranges(y: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per dot column: (low, high, has_nonfinite) of the finite values of ``y`` falling in it.

    Spikes survive any zoom because every column keeps both its minimum and its maximum.
    """
    n = len(y)
    lo = np.full(columns, np.nan)
    hi = np.full(columns, np.nan)
    bad = np.zeros(columns, dtype=bool)
    if n == 0 or columns <= 0:
        return lo, hi, bad
    edges = bin_edges(n, columns)
    finite = np.isfinite(y)
    yl = np.where(finite, y, np.inf)
    yh = np.where(finite, y, -np.inf)
    for c in range(columns):
        a, b = min(edges[c], n - 1), min(max(edges[c + 1], edges[c] + 1), n)
        seg_lo, seg_hi = yl[a:b].min(), yh[a:b].max()
        if np.isfinite(seg_lo):
            lo[c], hi[c] = seg_lo, seg_hi
        bad[c] = not finite[a:b].all()
    return lo, hi, bad


def braille_rows(
    lo: np.ndarray, hi: np.ndarray, height: int, vmin: float, vmax: float
) -> list[str]:
    """Rows of braille characters drawing, per dot column, a bar from ``lo`` to ``hi`` joined to
    the neighbouring columns so that the line reads as continuous."""
    columns = len(lo)
    cells = np.zeros((height, (columns + 1) // 2), dtype=np.int64)
    dots = height * 4
    span = vmax - vmin if vmax > vmin else 1.0

    def to_dot(v: float) -> int:
        return int(round((vmax - v) / span * (dots - 1)))

    prev: tuple[int, int] | None = None
    for c in range(columns):
        if not np.isfinite(lo[c]):
            prev = None
            continue
        top, bottom = to_dot(hi[c]), to_dot(lo[c])
        if prev is not None:  # join to the previous column
            top, bottom = min(top, prev[1]), max(bottom, prev[0])
        for d in range(max(0, top), min(dots - 1, bottom) + 1):
            cells[d // 4, c // 2] |= _DOT[c % 2][d % 4]
        prev = (to_dot(hi[c]), to_dot(lo[c]))
    return ["".join(chr(0x2800 + int(v)) for v in row) for row in cells]
