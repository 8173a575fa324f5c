"""Help: every key of every view, generated from the bindings so that it cannot go stale."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.keys import format_key
from textual.screen import ModalScreen
from textual.widgets import Static

__all__ = ["HelpScreen", "key_table"]


def key_table(sections: list[tuple[str, list[Binding]]]) -> Text:
    t = Text()
    for title, bindings in sections:
        t.append(f"{title}\n", style="bold underline")
        for b in bindings:
            # the keys as the footer shows them (``left`` as ``←``, ``slash`` as ``/``)
            keys = ",".join(format_key(k) for k in b.key.split(","))
            t.append(f"  {keys:<18}", style="bold cyan")
            t.append(f"{b.description or b.action}\n")
        t.append("\n")
    return t


class HelpScreen(ModalScreen[None]):
    """A modal listing the app's keys and those of every view."""

    CSS_PATH = "help.tcss"
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "close")]

    def __init__(self, sections: list[tuple[str, list[Binding]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(Text("replay tui: keys\n", style="bold"), id="help-title")
            yield Static(key_table(self.sections), id="help-keys")
            yield Static(Text("esc / q / ? closes this help", style="dim"))
