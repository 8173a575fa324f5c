"""Messages that travel up from the views to the app, which routes them ("messages up")."""

from __future__ import annotations

from textual.message import Message

__all__ = ["ModuleChosen", "OpChosen"]


class ModuleChosen(Message):
    """The user picked a module (layers view): show its ops."""

    def __init__(self, module: str) -> None:
        super().__init__()
        self.module = module


class OpChosen(Message):
    """The user picked an op to look at in another view (``"ops"`` or ``"source"``)."""

    def __init__(self, op_index: int, view: str) -> None:
        super().__init__()
        self.op_index = op_index
        self.view = view
