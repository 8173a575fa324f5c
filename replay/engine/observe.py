"""Who sees an engine's calls: the observers a multi-rank replay attaches (``multirank/lockstep.py``)
instead of patching the engine's methods.

An engine (and anything that stands in for one) mixes in :class:`ObservedCalls`, wraps each of
its calls that may run steps in ``_calling(name, args)`` and reports every step it ran with
``_ran``. Only the outermost call is told: ``state_before`` replaying the steps in between is one
call, which a follower rank makes once and so runs the same steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .outcome import StepOutcome

__all__ = ["EngineObserver", "ObservedCalls"]


class EngineObserver(Protocol):
    """``called(name, args)``: an engine call that may run steps, made from outside the engine,
    before it runs: ``("state_before", (t, keep, fresh))``, ``("run_step", (t,
    on_recorded_batch))``, ``("replay_through", (s,))``, ``("invalidate", ())``, and ``("call",
    (t,))`` when a tool runs the step function ``step_callable`` handed it.
    ``ran(t, on_recorded_batch, outcome)``: every step run, nested ones too, after it ran; an
    exception raised here ends the call."""

    def called(self, name: str, args: tuple[Any, ...]) -> None: ...

    def ran(self, t: int, on_recorded_batch: bool, outcome: StepOutcome) -> None: ...


class ObservedCalls:
    """The observers of an engine and the depth of its calls under way."""

    observers: list[EngineObserver]
    _depth: int

    def _init_observers(self) -> None:
        self.observers = []
        self._depth = 0

    @contextlib.contextmanager
    def _calling(self, name: str, args: tuple[Any, ...]) -> Iterator[None]:
        """Tell the observers of a call from outside the engine."""
        if self._depth == 0:
            for o in self.observers:
                o.called(name, args)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def _ran(self, t: int, on_recorded_batch: bool, outcome: StepOutcome) -> None:
        for o in self.observers:
            o.ran(t, on_recorded_batch, outcome)
