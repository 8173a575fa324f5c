"""Lockstep (replay/multirank/lockstep.py): the followers make the leader's engine calls, and so
run the same steps in the same order (every DDP all-reduce finds its peers). No process group:
the broadcast is replaced by a queue."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from replay.engine.observe import ObservedCalls
from replay.errors import ReplayError
from replay.multirank import lockstep
from replay.ranks.first_bad import is_collective_error


class FakeEngine(ObservedCalls):
    """The engine's call structure: ``state_before`` replays the steps in between itself; its
    observers see the calls as the engine's do (``replay/engine/observe.py``)."""

    def __init__(self) -> None:
        self._init_observers()
        self.ran: list[tuple[int, bool]] = []  # (step, on its recorded batch)
        self.pos: int | None = None
        self.model = self.optimizer = None

    def state_before(self, t: int, keep: bool = False, fresh: bool = False) -> None:
        with self._calling("state_before", (t, keep, fresh)):
            start = 0 if self.pos is None or self.pos > t else self.pos
            for i in range(start, t):
                self.run_step(i)
            self.pos = t

    def run_step(self, t: int, batch: Any = None) -> Any:
        with self._calling("run_step", (t, batch is None)):
            self.ran.append((t, batch is None))
            self.pos = t + 1 if batch is None else None

    def replay_through(self, s: int) -> None:
        with self._calling("replay_through", (s,)):
            self.state_before(s)

    def invalidate(self) -> None:
        with self._calling("invalidate", ()):
            self.pos = None

    def batch(self, t: int) -> str:
        return f"own batch {t}"

    def step_callable(self, t: int) -> Any:
        def run(model: Any, opt: Any, batch: Any) -> None:
            with self._calling("call", (t,)):
                self.ran.append((t, batch == f"own batch {t}"))

        return run


def test_followers_run_the_leaders_steps_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    wire: deque[Any] = deque()

    def send(cmd: Any, src: int, group: Any) -> Any:
        if cmd is not None:
            wire.append(cmd)
            return cmd
        return wire.popleft()

    monkeypatch.setattr(lockstep, "_send", send)
    lead, follower = FakeEngine(), FakeEngine()
    leader = lockstep.Leader(lead, 1, None)
    leader.install()
    lead.state_before(3, keep=True)  # one call, whose three nested steps are not sent
    lead.run_step(3)
    lead.state_before(3, keep=True)
    lead.run_step(3, batch="a slice the leader made")
    lead.step_callable(4)(None, None, "leader's batch")
    lead.invalidate()
    lead.replay_through(5)
    leader.finish()
    assert len(wire) == 8  # seven calls made from outside the engine, and "done"
    lockstep.follow(follower, 1, None)
    assert not wire
    assert [t for t, _ in follower.ran] == [t for t, _ in lead.ran]
    # the follower always runs its own batch; the leader's slice is not "own" there either
    assert follower.ran[7] == (3, False) and lead.ran[7] == (3, False)


def test_the_leaders_failure_reaches_every_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lockstep, "_send", lambda cmd, src, group: ("done", "ReplayError: boom"))
    with pytest.raises(ReplayError, match=r"rank 0 \(leading the replay\) failed: ReplayError"):
        lockstep.follow(FakeEngine(), 0, None)


def test_a_peers_failure_is_not_the_ranks_own() -> None:
    closed = (
        "Got the following error when running the callback: RuntimeError: [pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:50906"
    )
    assert is_collective_error({"type": "RuntimeError", "module": "builtins", "message": closed})
    assert is_collective_error({"type": "DistBackendError", "module": "x", "message": ""})
    own = {"type": "RuntimeError", "module": "builtins", "message": "mat1 and mat2 shapes"}
    assert not is_collective_error(own)
    assert not is_collective_error(None)
