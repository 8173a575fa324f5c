"""``RankTable``: the ranks of a DDP run side by side, one row each, with a braille loss sparkline.

The sparklines share one step axis and one loss scale, so that a rank that stopped early or whose
loss drifted away from the others stands out at a glance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.text import Text
from textual.widget import Widget

from replay.ranks.summary import RankSetSummary

from .braille import braille_rows, column_ranges
from .plot import fmt_num

__all__ = ["RankTable", "sparkline"]

SPARK_ROWS = 2  # braille rows per rank: 8 dots of height
# marker, rank, steps, last loss, first own failure: the sparkline takes what is left
_HEAD = f"  {'rank':>4}  {'steps':>6}  {'last loss':>10}  {'first own NaN/Inf / exception':<30}  "
MIN_SPARK = 8


def sparkline(
    all_steps: np.ndarray, steps: np.ndarray, loss: np.ndarray, cells: int, vmin: float, vmax: float
) -> tuple[list[str], np.ndarray]:
    """Braille rows of ``loss`` over the shared step axis ``all_steps`` (steps a rank did not
    record stay blank), and per character cell whether a non-finite loss falls in it."""
    pos = np.searchsorted(all_steps, steps)
    y = np.full(len(all_steps), np.nan)
    y[pos] = loss
    lo, hi, _ = column_ranges(y, cells * 2)  # ignores NaN: gaps and non-finite are not drawn
    marks = np.zeros(len(all_steps))
    marks[pos[~np.isfinite(loss)]] = np.nan  # only recorded non-finite values are marked
    _, _, bad = column_ranges(marks, cells * 2)
    return braille_rows(lo, hi, SPARK_ROWS, vmin, vmax), bad[0::2] | bad[1::2]


def _own_bad(row: Any) -> str:
    if row.own_bad is None:
        died = row.ended  # (raised outside any step: its loader, a validation loop)
        return f"died {died.when}" if died is not None else "-"
    step, reasons = row.own_bad
    return f"step {step} ({'+'.join(reasons)})"


class RankTable(Widget):
    """Attribute down: ``set_data(summary)``. The culprit rank's row is drawn in bold red."""

    DEFAULT_CSS = "RankTable { height: auto; }"

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.summary: RankSetSummary | None = None

    def set_data(self, summary: RankSetSummary) -> None:
        self.summary = summary
        self.styles.height = 2 + len(summary.rows) * (SPARK_ROWS + 1)
        self.refresh(layout=True)

    def render(self) -> Text:
        s = self.summary
        if s is None or not s.rows:
            return Text("no ranks", style="dim")
        cells = max(MIN_SPARK, self.content_size.width - len(_HEAD))
        all_steps = np.unique(np.concatenate([r.steps for r in s.rows]))
        finite = np.concatenate([r.loss[np.isfinite(r.loss)] for r in s.rows])
        vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        out = Text(no_wrap=True, overflow="crop")
        out.append(_HEAD, style="bold")
        scale = f"loss {fmt_num(vmin)}..{fmt_num(vmax)}, shared"
        out.append(scale[:cells] + "\n", style="bold")
        for row in s.rows:
            culprit = row.rank in s.culprit_ranks
            style = "bold red" if culprit else ""
            last = float(row.loss[-1]) if len(row.loss) else None  # NaN/Inf shown
            prefix = (
                f"{'▶' if culprit else ' '} {row.rank:>4}  {row.steps_total:>6}  "
                f"{fmt_num(last) if last is not None else '-':>10}  {_own_bad(row):<30}  "
            )
            if len(all_steps):
                rows, bad = sparkline(all_steps, row.steps, row.loss, cells, vmin, vmax)
            else:
                rows, bad = [" " * cells] * SPARK_ROWS, np.zeros(cells, dtype=bool)
            for i, spark in enumerate(rows):
                out.append(prefix if i == 0 else " " * len(prefix), style=style)
                line = Text(spark, style="red" if culprit else "cyan")
                if i == 0:  # non-finite losses: a red × on the top row, as in the overview
                    for c in np.flatnonzero(bad):
                        line = line[:c] + Text("×", style="bold red") + line[c + 1 :]
                out.append_text(line)
                out.append("\n")
            out.append("\n")
        if len(all_steps):
            first, last_step = f"step {all_steps[0]}", f"step {all_steps[-1]}"
            pad = max(1, cells - len(first) - len(last_step))
            out.append(" " * len(_HEAD) + first + " " * pad + last_step, style="dim")
        return out
