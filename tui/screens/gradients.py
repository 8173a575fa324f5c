"""Gradients: per-parameter gradient norm, NaN/Inf counts and update-to-weight ratio, sortable,
with the warning signs marked (vanishing, exploding, dead, update ratio far from ~1e-3)."""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from replay.thresholds import UPDATE_RATIO_BAND, VANISHING_GRAD_NORM

from ..model import RunModel, SafeForensics
from ..widgets.plot import fmt_num
from .base import ForensicsScreen

__all__ = ["GradientsScreen", "warnings_of", "SORT_KEYS"]

VANISHING, EXPLODING = VANISHING_GRAD_NORM, 1e3  # VANISHING: the one doctor judges by
RATIO_LOW, RATIO_HIGH = UPDATE_RATIO_BAND  # the band doctor judges by (replay/thresholds.py)
SORT_KEYS = ("name", "grad_norm", "nonfinite", "update_ratio", "warnings")


def warnings_of(p: dict[str, Any]) -> list[str]:
    """The warning signs of one parameter row (``ForensicsReader.params()``)."""
    out: list[str] = []
    if not p.get("requires_grad", True):
        return out
    if not p.get("has_grad"):
        return ["no grad"]
    g = p["grad_norm"]
    if (p.get("grad_nan") or 0) > 0 or (p.get("grad_inf") or 0) > 0 or not math.isfinite(g):
        out.append("NaN/Inf")
    elif g == 0:
        out.append("dead")
    elif g < VANISHING:
        out.append("vanishing")
    elif g > EXPLODING:
        out.append("exploding")
    r = p.get("update_ratio", float("nan"))
    if math.isfinite(r) and r > 0 and not RATIO_LOW <= r <= RATIO_HIGH:
        out.append("update " + ("tiny" if r < RATIO_LOW else "huge"))
    return out


def _sort_value(p: dict[str, Any], key: str) -> Any:
    if key == "name":
        return p["name"] or ""
    if key == "nonfinite":
        return (p.get("grad_nan") or 0) + (p.get("grad_inf") or 0)
    if key == "warnings":
        return len(warnings_of(p))
    v = p.get(key, float("nan"))
    return v if math.isfinite(v) else math.inf


class GradientsScreen(ForensicsScreen):
    BODY_ID = "grad-body"
    TITLE_SUFFIX = "gradients"
    BINDINGS = [
        Binding("s", "sort", "sort by"),
        Binding("r", "reverse", "reverse"),
        Binding("w", "warnings_only", "warnings only"),
    ]
    CSS_PATH = "gradients.tcss"

    def __init__(self, model: RunModel) -> None:
        super().__init__(model)
        self.params: list[dict[str, Any]] = []
        self.sort_key = "warnings"
        self.descending = True
        self.only_warnings = False

    async def build_body(self, body: Vertical, reader: SafeForensics) -> None:
        self.params = reader.params()
        table: DataTable[Any] = DataTable(id="grad-table", cursor_type="row", zebra_stripes=True)
        table.add_columns("parameter", "numel", "grad norm", "NaN", "Inf", "update/weight", "signs")
        await body.mount(table, Static(id="grad-status"))
        self._fill()
        table.focus()

    def _fill(self) -> None:
        table: DataTable[Any] = self.query_one("#grad-table", DataTable)
        table.clear()
        rows = sorted(
            self.params, key=lambda p: _sort_value(p, self.sort_key), reverse=self.descending
        )
        if self.only_warnings:
            rows = [p for p in rows if warnings_of(p)]
        for p in rows:
            signs = warnings_of(p)
            table.add_row(
                Text(p["name"] or "?", style="bold red" if "NaN/Inf" in signs else ""),
                f"{p['numel']:,}",
                Text(fmt_num(p["grad_norm"]), style="red" if signs else ""),
                Text(str(int(p["grad_nan"] or 0)), style="red" if p["grad_nan"] else "dim"),
                Text(str(int(p["grad_inf"] or 0)), style="red" if p["grad_inf"] else "dim"),
                fmt_num(p["update_ratio"]),
                Text(", ".join(signs), style="bold yellow"),
                key=p["name"],
            )
        order = "↓" if self.descending else "↑"
        n_warn = sum(1 for p in self.params if warnings_of(p))
        self.query_one("#grad-status", Static).update(
            f"{len(self.params)} parameters, {n_warn} with warning signs · sorted by "
            f"{self.sort_key} {order}" + (" · warnings only" if self.only_warnings else "")
        )

    def action_sort(self) -> None:
        if self.params:
            self.sort_key = SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)]
            self._fill()

    def action_reverse(self) -> None:
        if self.params:
            self.descending = not self.descending
            self._fill()

    def action_warnings_only(self) -> None:
        if self.params:
            self.only_warnings = not self.only_warnings
            self._fill()
