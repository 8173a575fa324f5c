"""Ranks: every rank of a DDP run side by side (steps, last loss, first own failure, a loss
sparkline), the culprit rank highlighted with the reason. A single recording says it is not a
distributed run."""

from __future__ import annotations

import os

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from replay.safetext import term_safe

from ..widgets.rank_table import RankTable
from .base import RunScreen

__all__ = ["RanksScreen"]


class RanksScreen(RunScreen):
    TITLE_SUFFIX = "ranks"
    DEFAULT_CSS = "#ranks-head { padding: 0 1; margin-bottom: 1; }"
    BINDINGS = []

    def compose_body(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="ranks-head")
            yield RankTable(id="rank-table")

    def update_from_model(self) -> None:
        s = self.model.ranks
        table = self.query_one(RankTable)
        head = self.query_one("#ranks-head", Static)
        if s is None:
            table.display = False
            head.update(self._single_recording())
            return
        table.display = True
        table.set_data(s)
        t = Text()
        t.append(f"rank set {os.path.basename(s.spec.rstrip(os.sep))}", style="bold")
        t.append(f" · {len(s.rows)} rank files")
        if s.world_size:
            t.append(f", world size {s.world_size}")
        if s.missing:
            t.append(f" · missing ranks {', '.join(map(str, s.missing))}", style="bold yellow")
        t.append("\n")
        if s.culprit_ranks:
            t.append(f"culprit rank {', '.join(map(str, s.culprit_ranks))}: ", style="bold red")
            # (a rank that died says its exception's message, from the file: made safe)
            t.append(term_safe(s.summary) + "\n", style="red")
        else:
            t.append(s.summary + "\n", style="green")
        opened = next((r.rank for r in s.rows if r.path == self.model.path), "?")
        t.append(f"views 1-7 show rank {opened} ({self.model.name})", style="dim")
        traced = [r for r in s.rows if r.trace is not None]
        if traced:
            t.append("\nper-op traces (replay bisect, every rank):", style="bold")
            for r in traced:
                style = "red" if r.rank in s.culprit_ranks else ""
                t.append(f"\n  rank {r.rank}  {r.trace}", style=style)
        head.update(t)

    def _single_recording(self) -> Text:
        t = Text()
        t.append("not a distributed run: ", style="bold")
        t.append(f"{self.model.name} is one recording.\n")
        d = self.model.rec.meta.get("distributed") or {}
        if d.get("rank") is not None:
            from replay.ranks.names import base_path

            base = base_path(self.model.path)
            t.append(
                f"It is rank {d['rank']} of {d.get('world_size')} opened on its own; "
                f"`replay tui {os.path.basename(base) if base else 'BASE.h5'}` shows every rank.\n",
                style="yellow",
            )
        else:
            t.append(
                "A DDP run records run.rank0.h5, run.rank1.h5, ...: open its base path "
                "(run.h5), folder or a glob to compare the ranks here.\n",
                style="dim",
            )
        return t
