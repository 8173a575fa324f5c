"""Ops: the traced step's op timeline (forward, backward, optimizer) coloured by status, with
jumps (culprit, next/previous non-finite op, next op of a module), filters and the op's detail."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, Static

from replay.words import op_role

from ..messages import OpChosen
from ..model import RunModel, SafeForensics
from ..opfilter import OpFilter
from ..widgets.op_detail import OpDetail
from ..widgets.op_list import OpList
from .base import ForensicsScreen

__all__ = ["OpsScreen"]

NONFINITE = (1, 2, 3)  # producer, propagator, raised (exempt ones are intentional)
FULL_COLUMNS = ("phase", "name", "module", "status")  # ids only: ~10 bytes per op


class OpsScreen(ForensicsScreen):
    BODY_ID = "ops-body"
    TITLE_SUFFIX = "ops"
    CSS_PATH = "ops.tcss"
    BINDINGS = [
        Binding("c", "culprit", "culprit"),
        Binding("n", "nonfinite(1)", "next NaN"),
        Binding("N", "nonfinite(-1)", "prev NaN"),
        Binding("m", "same_module(1)", "next in module"),
        Binding("M", "same_module(-1)", "prev in module", show=False),
        Binding("slash", "filter", "filter"),
        Binding("p", "cycle_phase", "phase"),
        Binding("x", "clear_filter", "clear filter"),
        Binding("s", "source", "source"),
        Binding("escape", "close_filter", "close filter", show=False),
    ]

    def __init__(self, model: RunModel) -> None:
        super().__init__(model)
        self.filter = OpFilter()
        self.full: dict[str, np.ndarray] | None = None  # whole id columns, read in a worker
        self._pending_select: int | None = None

    # -- building ------------------------------------------------------------------------------

    async def build_body(self, body: Vertical, reader: SafeForensics) -> None:
        self.full = None
        op_list = OpList(reader, id="op-list")
        status = Static(id="ops-status")
        filt = Input(
            placeholder="phase:bw module:net.fc1 op:log   (enter applies, esc closes)",
            id="ops-filter",
        )
        filt.display = False
        detail = VerticalScroll(OpDetail(id="op-detail"), id="detail-box")
        await body.mount(
            Horizontal(Vertical(op_list, status, filt, id="list-box"), detail, id="ops-split")
        )
        culprit = reader.verdict.op_index
        start = self._pending_select if self._pending_select is not None else culprit
        self.call_after_refresh(self._after_build, start)
        self._read_full(reader)

    def _after_build(self, start: int | None) -> None:
        op_list = self.query_one(OpList)
        op_list.focus()
        if start is not None and 0 <= start < op_list.n_ops:
            op_list.select_op(int(start))
        else:
            op_list.cursor = 0
        self._pending_select = None
        self._show_status()

    @work(thread=True, exclusive=True, group="ops-full")
    def _read_full(self, reader: SafeForensics) -> None:
        cols = reader.ops_columns(0, reader.n_ops, FULL_COLUMNS)
        self.app.call_from_thread(self._full_loaded, reader, cols)

    def _full_loaded(self, reader: Any, cols: dict[str, np.ndarray]) -> None:
        if reader is self.model.forensics:
            self.full = cols
            if self.filter.active:
                self._apply_filter()
            self._show_status()

    def on_resize(self) -> None:
        self.set_class(self.size.width < 110, "narrow")

    # -- the selected op -----------------------------------------------------------------------

    @property
    def op_list(self) -> OpList | None:
        found = self.query(OpList)
        return found.first() if found else None

    @property
    def selected(self) -> int | None:
        ol = self.op_list
        return ol.op_index if ol is not None else None

    def select_op(self, op_index: int) -> None:
        """Show ``op_index`` (clearing a filter that hides it)."""
        ol = self.op_list
        if ol is None:
            self._pending_select = op_index
            return
        if not ol.select_op(op_index):
            self.action_clear_filter()
            ol.select_op(op_index)
        self._show_status()

    @on(OpList.Selected)
    def _op_selected(self, message: OpList.Selected) -> None:
        self._read_detail(message.op_index)
        self._show_status()

    @work(thread=True, exclusive=True, group="ops-detail")
    def _read_detail(self, op_index: int) -> None:
        reader = self.model.forensics
        if reader is None:
            return
        row = reader.op_row(op_index)
        sources = self.model.sources()
        self.app.call_from_thread(self._detail_loaded, op_index, row, sources)

    def _detail_loaded(
        self, op_index: int, row: dict[str, Any], sources: dict[str, dict[int, str]]
    ) -> None:
        if op_index == self.selected:
            verdict = self.model.forensics.verdict if self.model.forensics else None
            self.query_one(OpDetail).show(row, sources, self.model.base, verdict)

    def _show_status(self) -> None:
        ol = self.op_list
        if ol is None or self.model.forensics is None:  # (the sidecar went away)
            return
        v = self.model.forensics.verdict
        parts = [f"op {ol.op_index} of {ol.n_ops}" if ol.op_index is not None else "no ops match"]
        if self.filter.active:
            parts.append(f"filter {self.filter.describe()} ({len(ol.rows)} ops)")
        if v.op_index is not None:
            word, _ = op_role(v, v.op_index, "producer")
            parts.append(f"{word} #{v.op_index} {v.op}")
        if conv := v.nan_from_inf:
            parts.append(f"NaN from #{conv['op_index']} {conv.get('op')}")
        self.query_one("#ops-status", Static).update(Text(" · ".join(parts)))

    # -- jumps ---------------------------------------------------------------------------------

    def action_culprit(self) -> None:
        idx = self.model.forensics.verdict.op_index if self.model.forensics else None
        if idx is None:
            self.notify("this trace has no culprit op", severity="warning")
            return
        self.select_op(int(idx))

    def _jump(self, mask: np.ndarray, direction: int, what: str) -> None:
        ol = self.op_list
        if ol is None or ol.op_index is None:
            return
        cur = ol.op_index
        candidates = np.intersect1d(ol.rows, np.flatnonzero(mask))
        ahead = candidates[candidates > cur] if direction > 0 else candidates[candidates < cur]
        if not ahead.size:
            self.notify(f"no {'later' if direction > 0 else 'earlier'} {what}")
            return
        self.select_op(int(ahead[0] if direction > 0 else ahead[-1]))

    def action_nonfinite(self, direction: int) -> None:
        if self.full is None:
            self.notify("still reading the op table…")
            return
        self._jump(np.isin(self.full["status"], NONFINITE), direction, "non-finite op")

    def action_same_module(self, direction: int) -> None:
        if self.full is None or self.selected is None:
            return
        same = self.full["module"] == self.full["module"][self.selected]
        self._jump(same, direction, "op of this module")

    # -- filters -------------------------------------------------------------------------------

    def action_filter(self) -> None:
        if self.op_list is None:
            return
        box = self.query_one("#ops-filter", Input)
        box.value = self.filter.describe()
        box.display = True
        box.focus()

    def action_close_filter(self) -> None:
        found = self.query("#ops-filter")
        if found:
            found.first().display = False
            if self.op_list is not None:
                self.op_list.focus()

    @on(Input.Submitted, "#ops-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        try:
            self.filter = OpFilter.parse(event.value)
        except ValueError as e:
            self.notify(str(e), severity="error", markup=False)
            return
        self.action_close_filter()
        self._apply_filter()

    def action_cycle_phase(self) -> None:
        order = (None, 0, 1, 2)
        nxt = order[(order.index(self.filter.phase) + 1) % len(order)]
        self.filter = replace(self.filter, phase=nxt)
        self._apply_filter()

    def action_clear_filter(self) -> None:
        self.filter = OpFilter()
        self._apply_filter()

    def filter_module(self, module: str) -> None:
        """Show only the ops of ``module`` (and its children); used by the layers view."""
        self.filter = OpFilter(module=module)
        self._apply_filter()

    def _apply_filter(self) -> None:
        ol, reader = self.op_list, self.model.forensics
        if ol is None or reader is None:
            return
        if not self.filter.active:
            ol.set_rows(np.arange(ol.n_ops, dtype=np.int64))
        elif self.full is None:
            return  # applied when the columns arrive (_full_loaded)
        else:
            strings = {"modules": reader.strings("modules"), "ops": reader.strings("ops")}
            ol.set_rows(self.filter.rows(self.full, strings))
        self._show_status()

    def action_source(self) -> None:
        if self.selected is not None:
            self.post_message(OpChosen(self.selected, "source"))
