"""``RunScreen``: what every view shares: the model it reads (attribute down), header and footer."""

from __future__ import annotations

from textual.screen import Screen

from ..model import RunModel

__all__ = ["RunScreen"]


class RunScreen(Screen):
    """A view of one run. Subclasses implement ``update_from_model`` (called when the view is
    shown and whenever a live recording grew)."""

    TITLE_SUFFIX = ""

    def __init__(self, model: RunModel) -> None:
        super().__init__()
        self.model = model

    def on_screen_resume(self) -> None:
        self.sub_title = f"{self.model.name} · {self.TITLE_SUFFIX}"
        self.update_from_model()

    def update_from_model(self) -> None:
        """Re-read what this view shows from ``self.model``."""
