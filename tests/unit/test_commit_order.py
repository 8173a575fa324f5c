"""The commit protocol's order across flushes: what a kill between two flushes can leave.

Was: a group kill (``kill -9 -PGID``) left a file whose ring held steps 0..211 and whose health
rows stopped at 72. The health rows' markers and the steps' markers were written in one flush,
and within a flush the HDF5 library writes its cached chunks in an order nobody chooses."""

from __future__ import annotations

import numpy as np
import pytest

from replay.store import HEALTH_COLUMNS
from replay.store.contracts import HealthFrame, SnapshotFrame, StepFrame
from replay.store.writer import RingSpec, StoreWriter


def test_a_steps_health_row_is_flushed_before_its_ring_slot_is_valid(tmp_path):
    w = StoreWriter(
        str(tmp_path / "run.h5"),
        run_id="f" * 32,
        meta={"config": {}},
        sources={},
        steps=RingSpec(8, 4096, 4096),
        snapshots=RingSpec(2, 4096, 4096),
        health_slots=1024,
    )
    flushes: list[tuple[set[int], set[int]]] = []  # (valid ring steps, valid health rows)
    real_flush = w.f.flush

    def flush() -> None:
        real_flush()
        steps = {int(s) for s in w._markers["steps"] if s >= 0}
        rows = {int(s) for s in w._hmarkers if s >= 0}
        flushes.append((steps, rows))

    w.f.flush = flush
    payload = np.arange(100, dtype=np.uint8)
    try:
        for first in (0, 5, 13, 40):  # fresh slots, then groups that rewrite older ones
            group = range(first, first + 6)
            w.commit(
                steps=[StepFrame(s, payload, 10) for s in group],
                health=[HealthFrame(s, np.full(len(HEALTH_COLUMNS), float(s))) for s in group],
                last_step=group[-1],
            )
    finally:
        w.close()
    assert len(flushes) > 4
    seen_steps: set[int] = set()
    for i, (steps_now, _) in enumerate(flushes):
        for s in steps_now - seen_steps:
            assert i > 0 and s in flushes[i - 1][1], (s, i)
        seen_steps = steps_now


def _watched(tmp_path, step_slots: int, snapshot_slots: int):
    """A writer whose every flush records ``(valid ring steps, valid snapshots)``: the file as
    a kill right after that flush would leave it."""
    w = StoreWriter(
        str(tmp_path / "run.h5"),
        run_id="f" * 32,
        meta={"config": {}},
        sources={},
        steps=RingSpec(step_slots, 4096, 4096),
        snapshots=RingSpec(snapshot_slots, 4096, 4096),
        health_slots=1024,
    )
    states: list[tuple[set[int], set[int]]] = []
    real_flush = w.f.flush

    def flush() -> None:
        real_flush()
        steps = {int(s) for s in w._markers["steps"] if s >= 0}
        snaps = {int(s) for s in w._markers["snapshots"] if s >= 0}
        states.append((steps, snaps))

    w.f.flush = flush
    return w, states


def test_a_kill_between_the_first_groups_commits_leaves_steps_with_a_snapshot(tmp_path):
    """Was: a group kill's file held steps and no snapshot (``replayable_window()`` None): the
    first group committed its steps, then the snapshot at step 0 that anchors them, and the
    kill fell between. At every flush of every group, a ring holding steps holds a snapshot
    of one of them."""
    w, states = _watched(tmp_path, 8, 3)
    payload = np.arange(100, dtype=np.uint8)
    try:
        slot = 0
        for first in (0, 6, 12, 18, 24):
            group = range(first, first + 6)
            snaps = []
            for s in group:
                if s % 4 == 0:  # snapshot_every 4, three slots in turn
                    snaps.append(SnapshotFrame(slot, s, payload, 10))
                    slot = (slot + 1) % 3
            w.commit(
                steps=[StepFrame(s, payload, 10) for s in group],
                snapshots=snaps,
                health=[HealthFrame(s, np.full(len(HEALTH_COLUMNS), float(s))) for s in group],
                last_step=group[-1],
            )
    finally:
        w.close()
    assert len(states) > 10
    for i, (steps_now, snaps_now) in enumerate(states):
        if steps_now:
            assert steps_now & snaps_now, (i, sorted(steps_now), sorted(snaps_now))


@pytest.mark.parametrize(
    "every, keep, reach", [(20, 3, 0), (5, 3, 0), (7, 4, 0), (20, 3, 1000), (10, 2, 400)]
)
def test_groups_of_a_fast_loop_keep_a_snapshot_of_a_step_in_the_ring_at_every_flush(
    tmp_path, every, keep, reach
):
    """Was: with the group kill fixed for a run's first group, ``replayable_window()`` was still
    None in about one file of 200. A fast loop's group of 251 steps keeps its last 60, which
    do not line up with the old ring's: their first half overwrote the old ring's middle, the
    steps of both of its snapshots included, while the group's own snapshots waited for it.
    Slots as the recorder places them (``SnapshotSlots``; dense and sparse rings), groups of
    1 to 1,100 steps."""
    import random

    from replay.store.retention import SnapshotSlots, plan

    p = plan(snapshot_every=every, keep_snapshots=keep, reach=reach)
    slots = SnapshotSlots(p)
    w, states = _watched(tmp_path, p.step_slots, p.snapshot_slots)
    payload = np.arange(100, dtype=np.uint8)
    rng = random.Random(7)
    t = 0
    sent: set[int] = set()
    try:
        for _ in range(40):
            group = range(t, t + rng.choice([1, 5, 19, 30, 61, 64, 150, 300, 1100]))
            t = group[-1] + 1
            # the snapshot before the next step comes with the group, as the recorder sends it
            snaps = [
                SnapshotFrame(slots.place(s), s, payload, 10)
                for s in range(group.start, group.stop + 1)
                if s % every == 0 and s not in sent
            ]
            sent.update(range(group.start, group.stop + 1))
            w.commit(
                steps=[StepFrame(s, payload, 10) for s in group],
                snapshots=snaps,
                last_step=group[-1],
            )
    finally:
        w.close()
    for i, (steps_now, snaps_now) in enumerate(states):
        if steps_now:
            assert steps_now & snaps_now, (i, sorted(steps_now), sorted(snaps_now))
