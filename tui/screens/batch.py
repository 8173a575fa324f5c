"""Batch: the tensors of a recorded step's batch (the failing one first) with per-sample
statistics computed with numpy; samples that hold NaN/Inf, or that bisect blamed, are flagged."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Static

from replay.safetext import term_safe

from ..batchstats import LeafStats, batch_leaves, culprit_parts
from ..model import RunModel
from ..widgets.plot import fmt_num
from .base import RunScreen

__all__ = ["BatchScreen"]

MAX_SAMPLE_ROWS = 4096


class BatchScreen(RunScreen):
    TITLE_SUFFIX = "batch"
    BINDINGS = [
        Binding("left_square_bracket", "step(-1)", "prev step"),
        Binding("right_square_bracket", "step(1)", "next step"),
        Binding("f", "focus_step", "failing step"),
        Binding("tab", "app.focus_next", "switch table", show=False),
    ]
    CSS_PATH = "batch.tcss"

    def __init__(self, model: RunModel) -> None:
        super().__init__(model)
        self.step: int | None = None
        self.leaves: list[LeafStats] = []
        self.leaf = 0

    def compose_body(self) -> ComposeResult:
        yield Static(id="batch-title")
        with Horizontal():
            yield DataTable(id="leaves", cursor_type="row")
            yield DataTable(id="samples", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        leaves = self.query_one("#leaves", DataTable)
        leaves.add_columns("tensor", "shape", "dtype", "NaN/Inf")
        samples = self.query_one("#samples", DataTable)
        samples.add_columns("sample", "mean", "std", "|max|", "NaN/Inf", "")

    def update_from_model(self) -> None:
        if self.step is None:
            self.step = self.model.focus_step()
            if self.step is not None:
                self._read(self.step)
            else:
                self.query_one("#batch-title", Static).update("no batch recorded yet")

    def action_focus_step(self) -> None:
        step = self.model.focus_step()
        if step is not None:
            self._read(step)

    def action_step(self, delta: int) -> None:
        steps = self.model.batch_steps()
        if not steps:
            return
        cur = self.step if self.step is not None else steps[-1]
        i = int(np.searchsorted(steps, cur)) + (delta if cur in steps else min(delta, 0))
        self._read(steps[max(0, min(len(steps) - 1, i))])

    @work(thread=True, exclusive=True, group="batch")
    def _read(self, step: int) -> None:
        try:
            record = self.model.rec.read_step(step)
        except KeyError:
            self.app.call_from_thread(self._show_missing, step)
            return
        leaves = batch_leaves(record["batch"])
        self.app.call_from_thread(self._loaded, step, leaves, record.get("exception"))

    def _show_missing(self, step: int) -> None:
        self.step = step
        kept = self.model.batch_steps()
        span = f"{kept[0]}..{kept[-1]}" if kept else "none"
        self.query_one("#batch-title", Static).update(
            f"step {step}: its batch is no longer in the recording (batches kept: {span})"
        )

    def _loaded(self, step: int, leaves: list[LeafStats], exception: Any) -> None:
        self.step, self.leaves = step, leaves
        layout, samples = self._culprits()
        culprits = set(samples) if layout in ("rows", "items", "zipped") else set()
        flagged = sorted(
            culprits | {i for lf in leaves for i in np.flatnonzero(lf.nonfinite).tolist()}
        )
        title = Text(f"step {step}", style="bold")
        title.append(f" · {len(leaves)} tensors")
        if culprits:
            title.append(f" · culprit samples (bisect): {sorted(culprits)}", style="bold red")
        elsewhere = (
            self.model.culprit_samples_elsewhere() if step == self.model.focus_step() else None
        )
        if elsewhere:
            title.append(f" · culprit samples (bisect) {elsewhere}", style="bold red")
        if flagged:
            title.append(f" · samples with NaN/Inf or blamed: {flagged[:20]}", style="red")
        if exception:
            title.append(
                "\nthe step raised "
                + term_safe(f"{exception.get('type')}: {exception.get('message')}"),
                style="magenta",
            )
        else:
            title.append("\n[ ] other steps · f failing step · tab switches table", style="dim")
        self.query_one("#batch-title", Static).update(title)
        table = self.query_one("#leaves", DataTable)
        table.clear()
        for lf in leaves:
            bad = int(lf.nonfinite.sum())
            whole = culprit_parts(lf, layout, samples)[0]  # (a culprit sample's own tensor)
            table.add_row(  # Text cells: a str would be parsed as markup
                Text(lf.path + ("  culprit" if whole else ""), style="bold red" if whole else ""),
                str(lf.shape),
                Text(lf.dtype),
                Text(str(bad), style="bold red" if bad else "dim"),
            )
        self.leaf = 0
        self._fill_samples()
        table.focus()

    @on(DataTable.RowHighlighted, "#leaves")
    def _leaf_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.cursor_row != self.leaf and 0 <= event.cursor_row < len(self.leaves):
            self.leaf = event.cursor_row
            self._fill_samples()

    def _culprits(self) -> tuple[str, list[Any]]:
        """The samples bisect blamed and their layout, when this is the step it traced."""
        traced = self.step == self.model.focus_step()
        return self.model.culprit_samples() if traced else ("rows", [])

    def _fill_samples(self) -> None:
        table = self.query_one("#samples", DataTable)
        table.clear()
        if not self.leaves:
            return
        lf = self.leaves[self.leaf]
        culprits = culprit_parts(lf, *self._culprits())[1]
        for i in range(min(lf.n, MAX_SAMPLE_ROWS)):
            bad = int(lf.nonfinite[i])
            flag = [word for word, on in (("NaN/Inf", bad), ("culprit", i in culprits)) if on]
            style = "bold red" if flag else ""
            table.add_row(
                Text(str(i), style=style),
                fmt_num(lf.mean[i]),
                fmt_num(lf.std[i]),
                fmt_num(lf.absmax[i]),
                Text(str(bad), style="red" if bad else "dim"),
                Text(" ".join(flag), style=style),
            )
