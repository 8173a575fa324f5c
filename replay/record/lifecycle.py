"""How a recording ends: ``close`` at the end of the ``with`` block, at interpreter exit, and
on SIGTERM, after which the process still dies of SIGTERM as it would have without a Recorder.
An exception no step raised that ends the program is handed to ``close`` on its way to the
previous ``sys.excepthook`` (the file keeps it: ``record/ending.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Lifecycle"]

#: Times the SIGTERM handler takes up a close that another signal handler raised into (one
#: SIGCHLD per dead DataLoader worker can each raise once).
_CLOSE_TRIES = 16


class Lifecycle:
    """``close``: the recorder's idempotent close; ``close_again``: finishes a close that a
    signal interrupted (the writer's wait); ``closed``: whether ``close`` began."""

    def __init__(
        self,
        close: Callable[[BaseException | None], None],
        close_again: Callable[[], None],
        closed: Callable[[], bool],
    ) -> None:
        self._close = close
        self._close_again = close_again
        self._closed = closed
        self._pid = os.getpid()  # the process recording (a fork's children inherit this object)
        self._prev_sigterm: Any = None
        self._prev_hook: Any = None  # sys.excepthook before start's
        self.started = False  # (start ran: a Recorder made without `with` starts at its step)

    def start(self, handle_signals: bool) -> None:
        """On entering the ``with`` block: SIGTERM closes the file (when nobody else handles
        SIGTERM, on the main thread), and so does interpreter exit."""
        self.started = True
        if handle_signals and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                self._prev_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        atexit.register(self._close, None)
        self._prev_hook, sys.excepthook = sys.excepthook, self._uncaught

    def _uncaught(self, tp: type[BaseException], e: BaseException, tb: Any) -> None:
        try:
            with contextlib.suppress(Exception):  # the program's traceback is printed next
                if os.getpid() == self._pid and not self._closed():
                    self._close(e)
        finally:
            (self._prev_hook or sys.__excepthook__)(tp, e, tb)

    def end(self) -> None:
        """After the close: the previous SIGTERM handler and exception hook back (the hook only
        where nobody replaced it since), no exit hook."""
        if sys.excepthook == self._uncaught:
            sys.excepthook = self._prev_hook
        if self._prev_sigterm is not None:
            with contextlib.suppress(ValueError):  # (not the main thread)
                signal.signal(signal.SIGTERM, self._prev_sigterm)
        atexit.unregister(self._close)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """Close the file, then die of SIGTERM as the process would have without a Recorder.

        A SIGTERM sent to the process group also kills a DataLoader's workers, and torch's
        SIGCHLD handler then raises into this one while it waits for the writer: the wait is
        taken up again (the file is finished) and the death still follows, never an exit 1
        with a traceback through the recorder. A forked child (a DataLoader worker) inherits
        this handler but not the recording: it only dies.
        """
        try:
            if os.getpid() == self._pid:
                for _ in range(_CLOSE_TRIES):
                    try:
                        if not self._closed():
                            self._close(None)
                        else:
                            self._close_again()
                        break
                    except Exception:  # noqa: BLE001 - another handler raised into the wait
                        continue
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
