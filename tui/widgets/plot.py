"""``SeriesPlot``: one metric over steps, drawn in braille, with a cursor column and marks."""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from replay.words import fmt_num

from .braille import bin_edges, braille_rows, column_ranges

__all__ = ["SeriesPlot", "fmt_num", "column_of"]

GUTTER = 9  # width of the y labels


def column_of(index: int, n: int, cells: int) -> int:
    """The character column where point ``index`` of ``n`` is drawn in a ``cells``-wide plot."""
    if n <= 0 or cells <= 0:
        return 0
    edges = bin_edges(n, cells * 2)
    dot = int(np.searchsorted(edges, index, side="right")) - 1
    return max(0, min(cells - 1, dot // 2))


class SeriesPlot(Widget):
    """A metric over steps. Attributes down: ``values``, ``cursor`` (index), ``marks`` (indices
    with a style). Non-finite values are shown as a red ``×`` on the top row."""

    DEFAULT_CSS = """
    SeriesPlot { height: 1fr; min-height: 3; border: round $panel; border-title-color: $text; }
    """

    cursor: reactive[int] = reactive(0)

    def __init__(self, title: str, *, log: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.log_scale = log
        self.values = np.zeros(0)
        self.marks: dict[int, str] = {}
        self.border_title = title
        # Plots shown side by side share their range (in plotted units) to be read together.
        self.shared_range: tuple[float, float] | None = None

    def set_data(self, values: np.ndarray, marks: dict[int, str] | None = None) -> None:
        self.values = np.asarray(values, dtype=np.float64)
        self.marks = marks or {}
        self.refresh()

    def watch_cursor(self) -> None:
        if 0 <= self.cursor < len(self.values):
            self.border_subtitle = fmt_num(float(self.values[self.cursor]))
        self.refresh()

    def render(self) -> Text:
        width, height = self.content_size.width, self.content_size.height
        cells = max(1, width - GUTTER)
        n = len(self.values)
        if n == 0 or height <= 0:
            return Text("no data yet", style="dim")
        y = self.values
        if self.log_scale:
            with np.errstate(all="ignore"):
                y = np.where(y > 0, np.log10(np.where(y > 0, y, 1.0)), np.nan)
                y = np.where(np.isfinite(self.values) | np.isnan(self.values), y, np.inf)
        lo, hi, bad = column_ranges(y, cells * 2)
        finite = y[np.isfinite(y)]
        if self.shared_range is not None:
            vmin, vmax = self.shared_range
        elif finite.size:
            vmin, vmax = float(finite.min()), float(finite.max())
        else:
            vmin, vmax = 0.0, 1.0
        rows = braille_rows(lo, hi, height, vmin, vmax)
        label = (lambda v: fmt_num(10**v)) if self.log_scale else fmt_num
        cur = column_of(self.cursor, n, cells)
        out = Text(no_wrap=True, overflow="crop")
        for r, row in enumerate(rows):
            gutter = label(vmax) if r == 0 else (label(vmin) if r == height - 1 else "")
            out.append(f"{gutter:>{GUTTER - 1}} ", style="dim")
            line = Text(row, style="cyan")
            if r == 0:  # non-finite points: a red × on the top row, above their column
                for c in np.flatnonzero(bad[0::2] | bad[1::2]):
                    line = line[:c] + Text("×", style="bold red") + line[c + 1 :]
            for idx, style in self.marks.items():
                col = column_of(idx, n, cells)
                if r == height - 1 and line.plain[col] == chr(0x2800):
                    line = line[:col] + Text("┴", style=style) + line[col + 1 :]
            line.stylize("reverse", cur, cur + 1)
            out.append_text(line)
            if r < height - 1:
                out.append("\n")
        return out
