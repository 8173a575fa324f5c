"""Memory: memory in use over the ops of the traced step, the peak marked, and the largest
tensors alive there."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..messages import OpChosen
from ..model import RunModel, SafeForensics
from ..widgets.op_detail import fmt_bytes
from ..widgets.plot import SeriesPlot
from .base import ForensicsScreen

__all__ = ["MemoryScreen"]


class MemoryScreen(ForensicsScreen):
    BODY_ID = "mem-body"
    TITLE_SUFFIX = "memory"
    BINDINGS = [
        Binding("left,h", "move(-1)", "op ←"),
        Binding("right,l", "move(1)", "op →"),
        Binding("P", "peak", "peak"),
        Binding("o", "open_op", "open op"),
    ]
    CSS_PATH = "memory.tcss"

    def __init__(self, model: RunModel) -> None:
        super().__init__(model)
        self.mem: np.ndarray | None = None
        self.info: dict[str, Any] = {}
        self.cursor = 0

    async def build_body(self, body: Vertical, reader: SafeForensics) -> None:
        self.info = reader.memory()
        table: DataTable[Any] = DataTable(id="mem-table", cursor_type="row")
        table.add_columns("bytes", "shape", "dtype", "made by op", "op")
        for t in self.info["largest"][:2000]:
            table.add_row(  # Text cells: a str would be parsed as markup
                fmt_bytes(t["bytes"]),
                Text(str(tuple(t["shape"]))),
                Text(str(t["dtype"])),
                str(t["op_index"]),
                Text(str(t["op"])),
            )
        await body.mount(
            SeriesPlot("memory in use over the step's ops", id="mem-plot"),
            Static(id="mem-info"),
            table,
        )
        self.cursor = int(self.info["peak_op"])
        self._read_curve(reader)

    @work(thread=True, exclusive=True, group="mem")
    def _read_curve(self, reader: SafeForensics) -> None:
        mem = reader.ops_columns(0, reader.n_ops, ("mem_bytes",))["mem_bytes"]
        self.app.call_from_thread(self._curve_loaded, mem.astype(np.float64))

    def _curve_loaded(self, mem: np.ndarray) -> None:
        self.mem = mem
        plot = self.query_one("#mem-plot", SeriesPlot)
        plot.set_data(mem, {int(self.info["peak_op"]): "bold red"})
        self._apply_cursor()

    def _apply_cursor(self) -> None:
        if self.mem is None or not len(self.mem):
            return
        self.cursor = max(0, min(len(self.mem) - 1, self.cursor))
        self.query_one("#mem-plot", SeriesPlot).cursor = self.cursor
        peak = self.info["peak_op"]
        self.query_one("#mem-info", Static).update(
            f"peak {fmt_bytes(self.info['peak_bytes'])} after op {peak} (marked ┴) · "
            f"cursor op {self.cursor}: {fmt_bytes(self.mem[self.cursor])}\n"
            f"largest tensors alive at the peak (o opens the op under the cursor):"
        )

    def action_move(self, delta: int) -> None:
        if self.mem is None:
            return
        cells = max(1, self.query_one("#mem-plot", SeriesPlot).content_size.width - 9)
        stride = max(1, len(self.mem) // cells)
        self.cursor += delta * stride
        self._apply_cursor()

    def action_peak(self) -> None:
        if self.info:
            self.cursor = int(self.info["peak_op"])
            self._apply_cursor()

    def action_open_op(self) -> None:
        table = next(iter(self.query("#mem-table").results(DataTable)), None)
        if table is not None and table.has_focus and self.info and self.info["largest"]:
            row = table.cursor_row
            self.post_message(OpChosen(int(self.info["largest"][row]["op_index"]), "ops"))
        elif self.mem is not None:
            self.post_message(OpChosen(self.cursor, "ops"))

    @on(DataTable.RowSelected, "#mem-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        if self.info:
            op = self.info["largest"][event.cursor_row]["op_index"]
            self.post_message(OpChosen(int(op), "ops"))
