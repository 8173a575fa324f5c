"""The what-if form: one change typed in, ``replay whatif`` run on it (from the overview, ``w``).

The form only reads and checks what was typed; the overview runs ``replay whatif RUN --json``
in a child process (the TUI imports no torch and runs no user code) and plots the result.
"""

from __future__ import annotations

import shlex

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from replay.reports.whatif import CHANGES

__all__ = ["WhatIfForm", "parse_change"]


def parse_change(text: str) -> list[str]:
    """``"scale lr=0.1"`` or ``"--scale lr=0.1"`` as ``["--scale", "lr=0.1"]``; a ``ValueError``
    says what is wrong. One change: its flag and its value."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"cannot read that: {e}") from None
    if not words:
        raise ValueError("type a change, e.g. scale lr=0.1")
    kind = words[0].removeprefix("--")
    flag = f"--{kind}"
    if kind not in CHANGES:
        raise ValueError(f"{words[0]!r} is not a change; one of: --{', --'.join(CHANGES)}")
    if not CHANGES[kind]:
        if len(words) != 1:
            raise ValueError(f"{flag} takes no value")
        return [flag]
    if len(words) != 2:
        raise ValueError(f"{flag} takes one value: {flag} {CHANGES[kind]}")
    return [flag, words[1]]


class WhatIfForm(ModalScreen[list[str] | None]):
    """Dismissed with the change's arguments, or ``None`` (escape)."""

    CSS_PATH = "whatif.tcss"
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, step: int | None) -> None:
        super().__init__()
        self.step = step

    def compose(self) -> ComposeResult:
        at = f" (the failure at step {self.step})" if self.step is not None else ""
        with Vertical(id="whatif-box"):
            yield Static(
                f"[b]what if[/b]{at}: replay the steps before it with one change\n"
                + "\n".join(f"  --{kind} {value}".rstrip() for kind, value in CHANGES.items())
                + "\nenter runs it (replay whatif, in a child process); escape cancels"
            )
            yield Input(placeholder="scale lr=0.1", id="whatif-input")
            yield Static("", id="whatif-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            args = parse_change(event.value)
        except ValueError as e:
            self.query_one("#whatif-error", Static).update(Text(str(e)))  # (what was typed)
            return
        self.dismiss(args)

    def action_cancel(self) -> None:
        self.dismiss(None)
