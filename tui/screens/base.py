"""``RunScreen``: what every view shares: the model it reads (attribute down), header and footer."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header

from ..model import RunModel, SafeForensics
from ..widgets.notice import NoForensics

__all__ = ["RunScreen", "ForensicsScreen"]


class RunScreen(Screen[None]):
    """A view of one run: its header, ``compose_body`` and footer. Subclasses implement
    ``update_from_model`` (called when the view is shown and whenever a live recording grew)."""

    TITLE_SUFFIX = ""

    def __init__(self, model: RunModel) -> None:
        super().__init__()
        self.model = model
        # False: nothing shown yet (None means "shown without forensics")
        self._shown_for: SafeForensics | None | bool = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        return ()

    def on_screen_resume(self) -> None:
        self.sub_title = f"{self.model.name} · {self.TITLE_SUFFIX}"
        self.update_from_model()

    def update_from_model(self) -> None:
        """Re-read what this view shows from ``self.model``."""

    def new_forensics(self) -> bool:
        """Whether the model's sidecar appeared, went or changed since this view last asked:
        a view built from it is rebuilt then, and only then."""
        reader = self.model.forensics
        if reader is self._shown_for:
            return False
        self._shown_for = reader
        return True


class ForensicsScreen(RunScreen):
    """A view built from the forensics sidecar; without one it says how to get it.

    Subclasses set ``BODY_ID`` and implement ``build_body`` (run in a worker, rebuilt when the
    sidecar appears or changes).
    """

    BODY_ID = "body"

    def compose_body(self) -> ComposeResult:
        yield Vertical(id=self.BODY_ID)

    def update_from_model(self) -> None:
        if self.new_forensics():
            self.run_worker(self._build(self.model.forensics), group="build", exclusive=True)

    async def _build(self, reader: SafeForensics | None) -> None:
        body = self.query_one(f"#{self.BODY_ID}", Vertical)
        await body.remove_children()
        if reader is None:
            await body.mount(NoForensics(self.model.no_forensics_message))
            return
        await self.build_body(body, reader)

    async def build_body(self, body: Vertical, reader: SafeForensics) -> None:
        raise NotImplementedError
