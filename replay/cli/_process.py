"""The heap of a ``replay`` process that is ours alone (the console command, not a test's).

torch and torch._dynamo leave millions of long-lived objects; each full garbage collection walks
all of them. Measured on the bisect benchmark: 0.6 s of collections during the replay and ~1 s
for the last one at exit, out of a 5.7 s bisect. ``gc.freeze()`` moves what exists to a
generation the collector skips (nothing is leaked: it is all alive until exit anyway).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import sys
from collections.abc import Iterator

__all__ = ["own_process", "big_imports", "user_stdout_to_stderr"]

_owned = False


def own_process() -> None:
    """Called by the console entry point: the heap may be frozen, and is frozen at exit."""
    global _owned
    _owned = True
    atexit.register(gc.freeze)  # registered first, so it runs after every other handler


class big_imports:  # noqa: N801 - used as a context manager, like contextlib's
    """Around importing torch and building the user's objects: no collections while millions of
    long-lived objects appear (the 5 full ones there cost ~0.5 s), then freeze them all.

    ``with big_imports() as phase: ... phase.end()`` ends the phase early (a workflow calls it
    once its engine is up, before replaying); ending twice is harmless.
    """

    def __init__(self) -> None:
        self._on = False

    def __enter__(self) -> big_imports:
        if _owned and gc.isenabled():
            gc.disable()
            self._on = True
        return self

    def end(self) -> None:
        if self._on:
            self._on = False
            gc.freeze()
            gc.enable()

    def __exit__(self, *exc: object) -> None:
        self.end()


@contextlib.contextmanager
def user_stdout_to_stderr(when: bool) -> Iterator[None]:
    """While replay runs user code for a command that prints JSON: whatever that code prints
    (a parameter count at import, a loss per step) goes to stderr, so stdout holds the JSON
    alone."""
    with contextlib.redirect_stdout(sys.stderr) if when else contextlib.nullcontext():
        yield
