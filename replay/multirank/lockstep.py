"""Every rank's engine runs the same calls in the same order, so DDP's collectives match.

A multi-rank replay has one process per rank, each driving its own :class:`~replay.engine.Engine`
on its own rank file. One of them, the *leader*, runs the workflow (the bisector, ``verify``,
the tracer, the divergence experiments) on its engine as a single process would. Every call of
the leader's engine that may run a step (``state_before``, ``run_step``, ``replay_through``,
``invalidate``, and the step function the tracer runs itself) is first broadcast to the other
ranks, the *followers*, which make the same call on their own engines (the leader is one of
the engine's observers, ``replay/engine/observe.py``: nothing of the engine is patched). The
engine's choices (which snapshot or in-memory checkpoint to start from, which steps to replay in between) depend
only on the sequence of calls, never on the values replayed, so both sides then run the same
steps in the same order and every DDP all-reduce finds its peers.

What differs: a step the leader runs on a batch of its own making (the tracer's sample search
slices the culprit batch) is run by a follower on its own recorded batch; such runs are not
compared with the recording on either side.

Every rank logs each step it ran on its recorded batch; :func:`rank_summary` compares those
rows bitwise with that rank's recorded health: the replay is verified on every rank, not only
on the leader.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from ..bisect.compare import HINT_RAISED, compare_rows, with_exception_type
from ..errors import ReplayError
from ..reports.divergence import Divergence
from ..reports.ranks import RankReplay

if TYPE_CHECKING:
    from ..engine import Engine
    from ..engine.outcome import StepOutcome

__all__ = ["Leader", "StepLog", "follow", "rank_summary", "run_own_step"]


@dataclass
class StepLog:
    """The steps an engine ran: ``(step, on its recorded batch, health row)``. An
    :class:`~replay.engine.engine.EngineObserver`: ``attach`` adds it to the engine's."""

    runs: list[tuple[int, bool, dict[str, Any]]] = field(default_factory=list)
    rank: int = 0
    raised: set[int] = field(default_factory=set)  # the steps the recording shows raising

    def attach(self, engine: Engine, rank: int) -> None:
        """Log every ``run_step`` of ``engine`` (the nested ones of ``state_before`` too).

        A step that raises on its recorded batch where the recording did not ends the replay
        at once (:class:`ReplayError`): its peers wait in an all-reduce it never joins, and
        would only learn of it when the process group times out.
        """
        self.rank = rank
        self.raised = {int(r["step"]) for r in engine.recorded_rows() if r.get("raised") == 1.0}
        engine.observers.append(self)

    def called(self, name: str, args: tuple[Any, ...]) -> None:
        pass

    def ran(self, t: int, on_recorded_batch: bool, outcome: StepOutcome) -> None:
        self.runs.append((t, on_recorded_batch, outcome.row()))
        e = outcome.exception
        if e is not None and on_recorded_batch and t not in self.raised:
            raise ReplayError(
                f"the replay of step {t} raised {e['type']}: {str(e['message'])[:200]}, "
                f"which rank {self.rank}'s recording does not show; its peers cannot go on "
                f"without it: {HINT_RAISED}"
            )


def _send(cmd: Any, src: int, group: Any) -> Any:
    box = [cmd]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


class Leader:
    """Broadcasts the leader engine's step-running calls to the followers (see the module doc).

    ``install()`` makes it one of the engine's observers; the engine tells it only the calls
    made from outside it (``state_before`` replaying the steps in between is one call, on every
    rank). ``finish(error)`` ends the followers' loop: call it exactly once, also when the
    workflow failed (``error``: one line, which each follower reports).
    """

    def __init__(self, engine: Engine, rank: int, group: Any) -> None:
        self.engine, self.rank, self.group = engine, rank, group

    def install(self) -> None:
        self.engine.observers.append(self)

    def called(self, name: str, args: tuple[Any, ...]) -> None:
        # A step run on a batch the leader made (a slice of the culprit's): ``args`` says
        # so, and each follower runs its own recorded batch.
        _send((name, *args), self.rank, self.group)

    def ran(self, t: int, on_recorded_batch: bool, outcome: StepOutcome) -> None:
        pass

    def finish(self, error: str | None = None) -> None:
        _send(("done", error), self.rank, self.group)


def follow(
    engine: Engine,
    leader: int,
    group: Any,
    on_call: Callable[[int], None] | None = None,
) -> None:
    """Make the leader's calls on this rank's ``engine`` until it says it is done.

    ``on_call(t)``: runs this rank's step ``t`` when the leader's tracer runs its own (default:
    the step function on the recorded batch, its exception swallowed as the tracer does).
    Raises :class:`ReplayError` when the leader failed.
    """
    run_call = on_call or (lambda t: run_own_step(engine, t))
    while True:
        cmd = _send(None, leader, group)
        op = cmd[0]
        if op == "done":
            if cmd[1] is not None:
                raise ReplayError(f"rank {leader} (leading the replay) failed: {cmd[1]}")
            return
        if op == "state_before":
            engine.state_before(cmd[1], keep=cmd[2], fresh=cmd[3])
        elif op == "run_step":
            engine.run_step(cmd[1], None if cmd[2] else engine.batch(cmd[1]))
        elif op == "replay_through":
            engine.replay_through(cmd[1])
        elif op == "invalidate":
            engine.invalidate()
        elif op == "call":
            run_call(cmd[1])
        else:
            raise ReplayError(f"internal error: unknown lockstep command {op!r}")


def run_own_step(engine: Engine, t: int) -> None:
    """Run step ``t``'s step function on this rank's recorded batch, as the leader's tracer
    runs its own (its exception is the tracer's to describe, not a replay failure)."""
    fn = engine.step_callable(t)
    with contextlib.suppress(Exception):  # (see the docstring)
        fn(engine.model, engine.optimizer, engine.batch(t))


def rank_summary(engine: Engine, log: StepLog, rank: int) -> RankReplay:
    """This rank's replay checked bitwise against its own recording.

    ``deterministic``: every step run on its recorded batch matched the recorded health row
    (loss and parameter fingerprint; a raised step by its exception type). ``divergence``: the
    first that did not.
    """
    by_step = {int(r["step"]): r for r in engine.recorded_rows()}
    first: Divergence | None = None
    compared: set[int] = set()  # (a step a snapshot restarts is run twice: carried on, afresh)
    steps: set[int] = set()
    for t, own, row in log.runs:
        if not own:
            continue
        steps.add(t)
        recorded = with_exception_type(by_step.get(t), engine.recorded_exception)
        if recorded is None:
            continue
        compared.add(t)
        first = first or compare_rows(recorded, row)
    return RankReplay(
        rank=rank,
        recording=engine.rec.path,
        replayed_steps=sorted(steps),
        runs=sum(1 for _, own, _ in log.runs if own),
        compared=len(compared),
        deterministic=first is None,
        divergence=first,
    )
