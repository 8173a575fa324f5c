"""Plots as SVG, written from Python: a metric over steps with marks, and a heat map.

Nothing to install and nothing to fetch: the page carries its plots inline. A plot of 10,000
steps keeps at most ``MAX_POINTS`` points (each bucket's lowest and highest value, in step
order, so that a spike survives) and a heat map at most ``MAX_COLUMNS`` columns (each bucket's
largest value). Non-finite values are never drawn as numbers: a NaN/Inf step gets a red tick at
the top. Every label goes through :func:`replay.report.escape.esc`.

Example::

    svg = line_plot(steps, loss, title="loss", marks=[Mark(30, "first bad step 30", "bad")],
                    window=(0, 30))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..words import fmt_num
from .escape import esc

__all__ = ["Mark", "line_plot", "heat_map", "reduce_points", "color_of", "MAX_POINTS"]

MAX_POINTS = 1200  # per line: 600 buckets of (lowest, highest)
MAX_COLUMNS = 300  # per heat map
MAX_NONFINITE_TICKS = 400
_W, _H = 720, 170  # the plot's box; the drawing area leaves margins for the labels
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 12, 22, 22


@dataclass(frozen=True)
class Mark:
    """A vertical line at ``step`` with its ``label``; ``kind`` is its CSS class
    (``bad``: the first bad step, ``symptom``, ``snapshot``)."""

    step: int
    label: str
    kind: str


def reduce_points(y: np.ndarray, most: int = MAX_POINTS) -> np.ndarray:
    """The indices of the finite points to draw: all when there are at most ``most``, else per
    bucket of consecutive points its lowest and its highest, in order."""
    finite = np.flatnonzero(np.isfinite(y))
    if finite.size <= most:
        return finite
    buckets = np.array_split(finite, most // 2)
    keep: list[int] = []
    for b in buckets:
        lo, hi = int(b[np.argmin(y[b])]), int(b[np.argmax(y[b])])
        keep += sorted({lo, hi})
    return np.asarray(keep, dtype=np.int64)


def _scale(lo: float, hi: float, a: float, b: float) -> tuple[float, float]:
    """``(k, c)`` with ``k * lo + c = a`` and ``k * hi + c = b`` (a flat range: the middle)."""
    if hi <= lo:
        return 0.0, (a + b) / 2
    k = (b - a) / (hi - lo)
    return k, a - k * lo


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def line_plot(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    title: str,
    log: bool = False,
    marks: Sequence[Mark] = (),
    window: tuple[int, int] | None = None,
    bad: np.ndarray | None = None,
    plot_id: str = "",
) -> str:
    """One metric over steps as an ``<svg>`` element (``viewBox`` scaled to the page's width).

    ``log``: a log10 axis over the positive values. ``window``: the replayable steps, shaded.
    ``marks``: vertical lines with their labels (the first bad step's is drawn last, on top).
    ``bad``: the steps whose value went NaN/Inf (a red tick each at the top); by default the
    non-finite values (the health ring's NaN can also mean "not measured": the caller knows)."""
    x = np.asarray(steps, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    with np.errstate(all="ignore"):
        shown = np.where(y > 0, np.log10(y), np.nan) if log else y.copy()
    parts = [
        f'<svg class="plot" id="{esc(plot_id)}" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<text class="title" x="{_LEFT}" y="14">{esc(title)}{" (log)" if log else ""}</text>',
    ]
    x0, x1 = _LEFT, _W - _RIGHT
    y0, y1 = _H - _BOTTOM, _TOP
    parts.append(f'<rect class="frame" x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}"/>')
    if x.size == 0:
        parts.append(f'<text class="empty" x="{x0 + 8}" y="{(y0 + y1) // 2}">no steps</text>')
        return "".join(parts) + "</svg>"
    lo_x, hi_x = float(x.min()), float(x.max())
    kx, cx = _scale(lo_x, hi_x, x0, x1)
    if window is not None:
        a, b = max(window[0], lo_x), min(window[1], hi_x)
        if a <= b:
            left, right = kx * a + cx, max(kx * b + cx, kx * a + cx + 2)
            parts.append(
                f'<rect class="window" x="{_fmt(left)}" y="{y1}" width="{_fmt(right - left)}" '
                f'height="{y0 - y1}"><title>replayable: steps {window[0]}..{window[1]}</title>'
                "</rect>"
            )
    finite = shown[np.isfinite(shown)]
    if finite.size:
        lo_y, hi_y = float(finite.min()), float(finite.max())
        ky, cy = _scale(lo_y, hi_y, y0 - 4, y1 + 4)
        idx = reduce_points(shown)
        # a gap where a value is missing or non-finite: one polyline per run without one
        gaps = np.cumsum(~np.isfinite(shown))
        for run in np.split(idx, np.flatnonzero(np.diff(gaps[idx]) != 0) + 1):
            xy = [(_fmt(kx * x[i] + cx), _fmt(ky * shown[i] + cy)) for i in run]
            if len(xy) == 1:
                parts.append(f'<circle class="line" cx="{xy[0][0]}" cy="{xy[0][1]}" r="1.5"/>')
            else:
                pts = " ".join(f"{a},{b}" for a, b in xy)
                parts.append(f'<polyline class="line" points="{pts}"/>')
        for ty, v in ((y1 + 10, hi_y), (y0, lo_y)):  # the top and bottom of the y axis
            label = esc(fmt_num(10**v if log else v))
            parts.append(f'<text class="axis" x="{x0 - 4}" y="{ty}">{label}</text>')
    else:
        zeros = log and bool(np.any(y == 0))  # (no change between snapshots: ratio 0)
        say = "every value is 0: nothing to draw on a log scale" if zeros else "no finite values"
        parts.append(f'<text class="empty" x="{x0 + 8}" y="{(y0 + y1) // 2}">{say}</text>')
    bad_steps = x[~np.isfinite(y) if bad is None else np.asarray(bad, dtype=bool)]
    if bad_steps.size:
        px = np.unique(np.round(kx * bad_steps + cx, 1))[:MAX_NONFINITE_TICKS]
        ticks = "".join(f'<line x1="{p:.1f}" x2="{p:.1f}" y1="{y1}" y2="{y1 + 6}"/>' for p in px)
        parts.append(
            f'<g class="nonfinite"><title>NaN/Inf from step {int(bad_steps.min())} '
            f"({bad_steps.size} steps)</title>{ticks}</g>"
        )
    parts.append(f'<text class="axis step" x="{x0}" y="{_H - 6}">step {int(lo_x)}</text>')
    parts.append(f'<text class="axis step end" x="{x1}" y="{_H - 6}">{int(hi_x)}</text>')
    for i, m in enumerate(sorted(marks, key=lambda m: m.kind == "bad")):
        if not lo_x <= m.step <= hi_x:
            continue
        mx = kx * m.step + cx
        anchor = "end" if mx > (x0 + x1) / 2 else "start"
        dx = -3 if anchor == "end" else 3
        ty = y1 + 12 + 11 * (i % 3) if m.kind != "bad" else y1 + 12
        parts.append(
            f'<g class="mark {esc(m.kind)}" data-step="{m.step}">'
            f'<line x1="{_fmt(mx)}" x2="{_fmt(mx)}" y1="{y1}" y2="{y0}"/>'
            f'<text x="{_fmt(mx + dx)}" y="{ty}" text-anchor="{anchor}">{esc(m.label)}</text></g>'
        )
    return "".join(parts) + "</svg>"


# A perceptually ordered ramp (viridis, 9 stops, rrggbb): dark for small values, yellow for large.
_VIRIDIS = bytes.fromhex("440154 472c7a 3b518b 2c718e 21908d 27ad81 5cc863 aadc32 fde725")
_RAMP = tuple(tuple(_VIRIDIS[i : i + 3]) for i in range(0, len(_VIRIDIS), 3))


def color_of(t: float) -> str:
    """The ramp's colour at ``t`` in [0, 1] as ``#rrggbb`` (clipped)."""
    t = min(1.0, max(0.0, t)) * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    f = t - i
    rgb = (round(a + (b - a) * f) for a, b in zip(_RAMP[i], _RAMP[i + 1]))
    return "#" + "".join(f"{c:02x}" for c in rgb)


def heat_map(
    labels: Sequence[str],
    steps: np.ndarray,
    values: np.ndarray,
    *,
    title: str,
    bad: np.ndarray | None = None,
    marks: Sequence[Mark] = (),
) -> str:
    """Rows ``labels`` (layers) over columns ``steps``: ``values[row, column]`` coloured on a
    log10 scale shared by the whole map; NaN/Inf cells (and those ``bad`` flags) red, cells with
    no value (NaN, not flagged) left blank.
    More than ``MAX_COLUMNS`` steps are bucketed (each bucket shows its largest value)."""
    v = np.asarray(values, dtype=np.float64)
    s = np.asarray(steps, dtype=np.int64)
    if v.ndim != 2 or v.shape != (len(labels), len(s)) or not len(labels) or not len(s):
        return ""
    flagged = ~np.isfinite(v) & ~np.isnan(v) if bad is None else np.asarray(bad, dtype=bool)
    if len(s) > MAX_COLUMNS:
        cols = np.array_split(np.arange(len(s)), MAX_COLUMNS)
        v = np.stack([_bucket(v[:, c]) for c in cols], axis=1)
        flagged = np.stack([flagged[:, c].any(axis=1) for c in cols], axis=1)
        s = np.array([s[c[0]] for c in cols])
    cell_h = 14
    label_w = 8 + 7 * min(36, max(len(str(lab)) for lab in labels))
    width = max(_W, label_w + 2 * len(s))
    cell_w = (width - label_w - _RIGHT) / len(s)
    height = _TOP + cell_h * len(labels) + _BOTTOM
    with np.errstate(all="ignore"):
        logs = np.where(np.isfinite(v) & (v > 0), np.log10(v), np.nan)
    ok = logs[np.isfinite(logs)]
    lo, hi = (float(ok.min()), float(ok.max())) if ok.size else (0.0, 1.0)
    ramp = f"log10: {fmt_num(10**lo)} dark .. {fmt_num(10**hi)} yellow" if ok.size else ""
    zero = "0 black" if np.any(v == 0) else ""
    key = ", ".join(k for k in (ramp, zero) if k) or "no finite values"
    parts = [
        f'<svg class="heat" viewBox="0 0 {_fmt(width)} {height}" role="img" '
        f'aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<text class="title" x="{label_w}" y="14">{esc(title)} ({esc(key)})</text>',
    ]
    for r, lab in enumerate(labels):
        y = _TOP + r * cell_h
        short = str(lab) if len(str(lab)) <= 36 else "…" + str(lab)[-35:]
        parts.append(
            f'<text class="axis row" x="{label_w - 4}" y="{y + cell_h - 3}">{esc(short)}'
            f"<title>{esc(lab)}</title></text>"
        )
        for c in range(len(s)):
            raw = v[r, c]
            if math.isnan(raw) and not flagged[r, c]:
                continue  # nothing measured
            if flagged[r, c] or not math.isfinite(raw):
                fill = ' class="bad"'
            elif raw <= 0:
                fill = ' fill="#000000"'
            else:
                t = (logs[r, c] - lo) / (hi - lo) if hi > lo else 0.5
                fill = f' fill="{color_of(t)}"'
            parts.append(
                f'<rect{fill} x="{_fmt(label_w + c * cell_w)}" y="{y}" '
                f'width="{_fmt(max(cell_w, 0.5))}" height="{cell_h - 1}">'
                f"<title>{esc(lab)} step {int(s[c])}: {esc(fmt_num(raw))}</title></rect>"
            )
    x0, x1 = label_w, width - _RIGHT
    parts.append(f'<text class="axis step" x="{x0}" y="{height - 6}">step {int(s[0])}</text>')
    parts.append(f'<text class="axis step end" x="{x1}" y="{height - 6}">{int(s[-1])}</text>')
    if len(s) > 1:
        kx, cx = _scale(float(s[0]), float(s[-1]), x0 + cell_w / 2, x1 - cell_w / 2)
        for m in marks:
            if s[0] <= m.step <= s[-1]:
                mx = kx * m.step + cx
                parts.append(
                    f'<g class="mark {esc(m.kind)}" data-step="{m.step}"><line x1="{_fmt(mx)}" '
                    f'x2="{_fmt(mx)}" y1="{_TOP}" y2="{height - _BOTTOM}"/></g>'
                )
    return "".join(parts) + "</svg>"


def _bucket(block: np.ndarray) -> np.ndarray:
    """Per row: an infinity if any (it stays visible), else the largest finite value, else NaN."""
    with np.errstate(all="ignore"):
        inf = np.where(np.isinf(block), block, np.nan)
        first_inf = np.nanmax(np.abs(inf), axis=1, initial=-np.inf)
        fin = np.where(np.isfinite(block), block, -np.inf).max(axis=1)
    return np.where(
        np.isinf(first_inf) & (first_inf > 0), first_inf, np.where(np.isfinite(fin), fin, np.nan)
    )
