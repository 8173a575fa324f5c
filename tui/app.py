"""The replay TUI: screens, bindings and routing only. Views live in ``screens/``, widgets in
``widgets/``, disk access in ``model.py``.

Example::

    from replay_tui import make_app
    make_app("run.h5").run()
"""

from __future__ import annotations

import os

from textual import on, work
from textual.app import App
from textual.binding import Binding
from textual.worker import WorkerFailed

from replay.errors import exit_code_of

from .messages import ModuleChosen, OpChosen
from .model import RunModel
from .screens.base import RunScreen
from .screens.batch import BatchScreen
from .screens.gradients import GradientsScreen
from .screens.help import HelpScreen
from .screens.layers import LayersScreen
from .screens.memory import MemoryScreen
from .screens.ops import OpsScreen
from .screens.overview import OverviewScreen
from .screens.ranks import RanksScreen
from .screens.source import SourceScreen
from .widgets.op_list import OpList

__all__ = ["ReplayApp", "make_app", "VIEWS"]

# key -> (screen name, class); the order is the order of the footer and the help
VIEWS: dict[str, tuple[str, type[RunScreen]]] = {
    "1": ("overview", OverviewScreen),
    "2": ("ops", OpsScreen),
    "3": ("layers", LayersScreen),
    "4": ("gradients", GradientsScreen),
    "5": ("memory", MemoryScreen),
    "6": ("source", SourceScreen),
    "7": ("batch", BatchScreen),
    "8": ("ranks", RanksScreen),
}
POLL_SECONDS = 2.0


class ReplayApp(App[None]):
    """Browse one recording and its forensics. ``make_app(path)`` builds it."""

    TITLE = "replay"
    CSS_PATH = "app.tcss"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        *(Binding(k, f"view('{name}')", name, show=False) for k, (name, _) in VIEWS.items()),
    ]

    def __init__(self, model: RunModel, *, poll: bool = True) -> None:
        super().__init__()
        self.model = model
        self.poll = poll
        # The exception that ended the app, if one did: ``replay tui`` prints it as one line and
        # exits non-zero with the code every command gives it (replay.errors.exit_code_of: 3 for
        # a damaged recording or sidecar, 6 for a bug).
        self.failure: BaseException | None = None

    def _handle_exception(self, error: Exception) -> None:
        """Textual's hook for an exception no handler caught (a worker's too).

        Textual's own prints a Rich traceback with its locals (strings from the file among them)
        and exits with code 1; replay's commands end with one line instead, so this only records
        the failure and exits. ``run_test`` still re-raises it (Textual keeps it in
        ``_exception``), so a pilot test that hits it fails loudly.
        """
        cause: BaseException = error
        if isinstance(error, WorkerFailed):  # a @work thread's exception, wrapped
            cause = error.error
        if self.failure is None:
            self.failure = cause
        if self._exception is None:
            self._exception = cause if isinstance(cause, Exception) else error
            self._exception_event.set()
        self.exit(return_code=exit_code_of(cause))

    def on_mount(self) -> None:
        for name, cls in VIEWS.values():
            self.install_screen(cls(self.model), name)
        start = "ops" if self.model.forensics is not None else "overview"
        self.push_screen(start)
        if self.poll:
            self.set_interval(POLL_SECONDS, self._poll)

    def on_unmount(self) -> None:
        self.model.close()

    # -- routing -------------------------------------------------------------------------------

    @property
    def view(self) -> str:
        """Name of the view on screen (``"help"`` while the help is open)."""
        for name, _ in VIEWS.values():
            if self.is_screen_installed(name) and self.get_screen(name) is self.screen:
                return name
        return "help" if isinstance(self.screen, HelpScreen) else ""

    def action_view(self, name: str) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        if self.view != name:
            self.switch_screen(name)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
            return
        app_keys = [Binding(k, "", f"view: {name}") for k, (name, _) in VIEWS.items()]
        app_keys += [b for b in self.BINDINGS if isinstance(b, Binding) and b.show]
        sections = [("everywhere", app_keys)]
        for _, (name, cls) in VIEWS.items():
            keys = [b for b in cls.BINDINGS if isinstance(b, Binding)]
            if name == "ops":
                keys = [b for b in OpList.BINDINGS if isinstance(b, Binding)] + keys
            sections.append((name, keys))
        self.push_screen(HelpScreen(sections))

    @on(ModuleChosen)
    def _module_chosen(self, message: ModuleChosen) -> None:
        ops = self.get_screen("ops")
        assert isinstance(ops, OpsScreen)
        ops.filter_module(message.module)
        self.action_view("ops")

    @on(OpChosen)
    def _op_chosen(self, message: OpChosen) -> None:
        screen = self.get_screen(message.view)
        if isinstance(screen, OpsScreen):
            screen.select_op(message.op_index)
        elif isinstance(screen, SourceScreen):
            screen.show_op(message.op_index)
        self.action_view(message.view)

    # -- live recordings -----------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="poll")
    def _poll(self) -> None:
        if self.model.refresh():
            self.call_from_thread(self._refreshed)

    def _refreshed(self) -> None:
        screen = self.screen
        if isinstance(screen, RunScreen):
            screen.update_from_model()


def make_app(path: str | os.PathLike[str], *, poll: bool = True) -> ReplayApp:
    """The app for ``path`` (the CLI and the tests use this). Raises ``RecordingError`` with one
    line when ``path`` is not a readable recording, before anything is drawn. A DDP rank set
    (``run.h5`` of ``run.rank<N>.h5``, a folder, a glob) opens its culprit rank's recording."""
    return ReplayApp(RunModel.open(path), poll=poll)
