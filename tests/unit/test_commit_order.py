"""The commit protocol's order across flushes: what a kill between two flushes can leave.

Was: a group kill (``kill -9 -PGID``) left a file whose ring held steps 0..211 and whose health
rows stopped at 72. The health rows' markers and the steps' markers were written in one flush,
and within a flush the HDF5 library writes its cached chunks in an order nobody chooses."""

from __future__ import annotations

import numpy as np

from replay.store import HEALTH_COLUMNS
from replay.store.contracts import HealthFrame, StepFrame
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
