"""``replay tui``: a Textual terminal UI over a recording and its forensics.

Reads through ``replay.store`` only: never imports torch, never runs user code, never unpickles.

Example::

    from replay_tui import make_app
    make_app("run.h5").run()
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_app"]


def make_app(path: Any, **kwargs: Any) -> Any:
    """Build the app for the recording at ``path`` (see :func:`replay_tui.app.make_app`)."""
    from .app import make_app as _make_app

    return _make_app(path, **kwargs)
