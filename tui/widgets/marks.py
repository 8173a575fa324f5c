"""``MarkStrip``: the step axis under the overview plots: marks (snapshots, skipped AMP steps,
first bad, symptom, exceptions), the step range and the cursor's step number."""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from .plot import GUTTER, column_of

__all__ = ["MarkStrip", "MARK_STYLES", "LEGEND"]

# kind -> (char, style); later kinds win a shared column
MARK_STYLES = {
    "snapshot": ("S", "green"),
    "skipped": ("k", "yellow"),
    "exception": ("X", "bold magenta"),
    "symptom": ("▲", "bold red"),
    "first_bad": ("◆", "bold red reverse"),
}
LEGEND = "  ".join(f"{c} {k.replace('_', ' ')}" for k, (c, _) in MARK_STYLES.items())


class MarkStrip(Widget):
    DEFAULT_CSS = "MarkStrip { height: 3; padding: 0 1; }"

    cursor: reactive[int] = reactive(0)

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.steps = np.zeros(0, dtype=np.int64)
        self.marks: dict[str, list[int]] = {}

    def set_data(self, steps: np.ndarray, marks: dict[str, list[int]]) -> None:
        self.steps, self.marks = steps, marks
        self.refresh()

    def watch_cursor(self) -> None:
        self.refresh()

    def render(self) -> Text:
        # the plots have a border (1 cell) that this strip replaces with padding
        cells = max(1, self.content_size.width - GUTTER)
        n = len(self.steps)
        out = Text(no_wrap=True, overflow="crop")
        line = [" "] * cells
        styles = [""] * cells
        for kind, (char, style) in MARK_STYLES.items():
            for step in self.marks.get(kind, []):
                i = int(np.searchsorted(self.steps, step))
                if i < n and self.steps[i] == step:
                    c = column_of(i, n, cells)
                    line[c], styles[c] = char, style
        out.append(f"{'marks':>{GUTTER - 1}} ", style="dim")
        for ch, st in zip(line, styles):
            out.append(ch, style=st)
        out.append("\n")
        if n:
            first, last = str(self.steps[0]), str(self.steps[-1])
            axis = first + " " * max(1, cells - len(first) - len(last)) + last
            cur = column_of(self.cursor, n, cells)
            out.append(f"{'step':>{GUTTER - 1}} ", style="dim")
            axis_text = Text(axis[:cells], style="dim")
            axis_text.stylize("reverse", cur, cur + 1)
            out.append_text(axis_text)
            out.append("\n")
            step = int(self.steps[min(self.cursor, n - 1)])
            out.append(" " * GUTTER)
            label = f"▲ step {step}"
            out.append(" " * max(0, min(cur, cells - len(label))) + label, style="bold")
        return out
