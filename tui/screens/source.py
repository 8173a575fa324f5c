"""Source: the user's code around the culprit line, from the recorded sources (the forensics'
``/sources`` or the recording's ``meta/sources``, never the disk), with the frames of the
selected op's stack to move through."""

from __future__ import annotations

from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import OptionList, Static

from ..model import RunModel, shorten_path
from ..widgets.op_detail import split_location
from .base import RunScreen

__all__ = ["SourceScreen", "code_view", "entry_frames"]

CONTEXT = 12


def code_view(lines: dict[int, str], line: int, context: int = CONTEXT) -> Text:
    """Numbered lines ``line ± context`` that were recorded, gaps shown as ``⋮``, ``line`` marked."""
    if not lines:
        return Text("(this file's source was not recorded)", style="dim")
    shown = [n for n in sorted(lines) if abs(n - line) <= context]
    highlighter = Syntax("", "python", theme="ansi_dark")
    out = Text(no_wrap=True, overflow="crop")
    width = len(str(max(shown))) if shown else 3
    prev = None
    for n in shown:
        if prev is not None and n != prev + 1:
            out.append(" " * width + "  ⋮\n", style="dim")
        here = n == line
        out.append(f"{'▶' if here else ' '}{n:>{width}} ", style="bold red" if here else "dim")
        code = highlighter.highlight(lines[n].rstrip("\n"))
        code.rstrip()
        if here:
            code.stylize("bold reverse")
        out.append_text(code)
        out.append("\n")
        prev = n
    return out


def entry_frames(model: Any) -> list[str]:
    """Without forensics: the recorded entry points, as ``file:line:function`` locations."""
    out = []
    sources = model.recorded_sources()
    for e in model.entry.values():
        path, qual = e.get("path"), e.get("qualname", "")
        text = sources.get(path, "") if path else ""
        head = f"def {qual.rsplit('.', 1)[-1]}("
        lines = enumerate(text.splitlines(), 1)
        line = next((i for i, src in lines if src.lstrip().startswith(head)), 1)
        out.append(f"{path}:{line}:{qual}")
    return out


class SourceScreen(RunScreen):
    TITLE_SUFFIX = "source"
    BINDINGS = [
        Binding("u", "frame(-1)", "frame up (outer)"),
        Binding("d", "frame(1)", "frame down (inner)"),
        Binding("c", "culprit", "culprit"),
    ]
    CSS_PATH = "source.tcss"

    def __init__(self, model: RunModel) -> None:
        super().__init__(model)
        self.frames: list[str] = []
        self.op_index: int | None = None
        self._sources: dict[str, dict[int, str]] = {}

    def compose_body(self) -> ComposeResult:
        yield Static(id="source-title")
        with Horizontal():
            yield OptionList(id="frames")
            yield VerticalScroll(Static(id="code"), id="code-box")

    def update_from_model(self) -> None:
        if not self.new_forensics():
            return
        reader = self.model.forensics
        self._sources = self.model.sources()
        if reader is not None and reader.verdict.op_index is not None:
            self.show_op(int(reader.verdict.op_index))
            return
        why = (
            f"no forensics: run `replay bisect {self.model.name}` for the culprit's stack"
            if reader is None
            else "no culprit op"
        )
        self._set_frames(entry_frames(self.model), None, f"entry points ({why})")

    @work(thread=True, exclusive=True, group="source")
    def show_op(self, op_index: int) -> None:
        """Show the stack of op ``op_index``, innermost frame selected (read in a worker)."""
        reader = self.model.forensics
        if reader is None:
            return
        row = reader.op_row(op_index)
        frames = list(row["stack"]) or ([row["source"]] if row["source"] else [])
        title = f"op {op_index} {row['op']} ({row['phase']}) · stack, innermost last"
        self.app.call_from_thread(self._set_frames, frames, op_index, title)

    def _set_frames(self, frames: list[str], op_index: int | None, title: str) -> None:
        self.frames, self.op_index = frames, op_index
        self.query_one("#source-title", Static).update(Text(title))  # a str would be markup
        ol = self.query_one("#frames", OptionList)
        ol.clear_options()
        for f in frames:
            loc = split_location(f)
            label = f"{loc[2]}  {shorten_path(loc[0], self.model.base)}:{loc[1]}" if loc else f
            ol.add_option(Text(label))  # file strings: never parsed as markup
        if frames:
            ol.highlighted = len(frames) - 1
            self._show_frame(len(frames) - 1)
        else:
            self.query_one("#code", Static).update(Text("no source location recorded", style="dim"))
        ol.focus()

    @on(OptionList.OptionHighlighted, "#frames")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._show_frame(event.option_index)

    def _show_frame(self, i: int) -> None:
        if not 0 <= i < len(self.frames):
            return
        loc = split_location(self.frames[i])
        if loc is None:
            return
        path, line, _ = loc
        self.query_one("#code", Static).update(code_view(self._sources.get(path, {}), line))

    @property
    def frame(self) -> int | None:
        return self.query_one("#frames", OptionList).highlighted

    def action_frame(self, delta: int) -> None:
        ol = self.query_one("#frames", OptionList)
        if self.frames:
            cur = ol.highlighted if ol.highlighted is not None else len(self.frames) - 1
            ol.highlighted = max(0, min(len(self.frames) - 1, cur + delta))

    def action_culprit(self) -> None:
        reader = self.model.forensics
        if reader is not None and reader.verdict.op_index is not None:
            self.show_op(int(reader.verdict.op_index))
