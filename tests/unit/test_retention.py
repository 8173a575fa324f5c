"""The tiered snapshot rule (store/retention.py), checked step by step against its promise:
at every moment, each of the last ``reach`` steps has a kept snapshot at or before it whose
step, and every step after it, is still in the step ring; never more snapshots than slots."""

import pytest

from replay.store.retention import SnapshotSlots, describe_tiers, plan


def _check(p, every, steps):
    slots = SnapshotSlots(p)
    ring = p.step_slots
    for now in range(p.start, p.start + steps):
        if (now - p.start) % every == 0:
            slot = slots.place(now)
            assert 0 <= slot < p.snapshot_slots
            assert len(set(slots.kept.values())) == len(slots.kept)  # one snapshot per slot
        oldest_step = max(p.start, now - ring + 1)  # the step ring holds oldest_step..now
        snaps = [s for s in slots.kept if s >= oldest_step]
        # every step of the reach has a snapshot at or before it: the oldest one does
        assert snaps and min(snaps) <= max(p.start, now - p.reach + 1), now


@pytest.mark.parametrize(
    "kw",
    [
        dict(snapshot_every=50, keep_snapshots=3, reach=10_000),
        dict(snapshot_every=50, keep_snapshots=3, reach=0),
        dict(snapshot_every=50, keep_snapshots=3, reach=300, start=7),
        dict(snapshot_every=4, keep_snapshots=2, reach=500),
        dict(snapshot_every=50, keep_snapshots=3, reach=10_000, step_bytes=150_000, budget=1 << 30),
    ],
)
def test_every_step_of_the_reach_stays_replayable(kw):
    p = plan(**kw)
    _check(p, kw["snapshot_every"], p.step_slots * 2 + 3 * p.tiers[-1][0])


def test_default_tiers_reach_ten_thousand_steps_with_fifteen_snapshots():
    p = plan(snapshot_every=50, keep_snapshots=3, reach=10_000)
    assert p.tiers == ((50, 150), (500, 5000), (5000, 0))
    # 15 snapshots at most, and a spare slot for the self-check's own
    assert (p.step_slots, p.snapshot_slots, p.reach) == (15_000, 16, 10_000)
    assert describe_tiers(p.tiers) == (
        "every 50 steps for the last 150, every 500 for the last 5,000, every 5,000 beyond"
    )


def test_a_byte_budget_keeps_fewer_steps_and_says_how_many():
    p = plan(snapshot_every=50, keep_snapshots=3, reach=10_000, step_bytes=1 << 20, budget=1 << 30)
    assert p.step_slots == 1000 and p.reach < 1000
    tiny = plan(snapshot_every=50, keep_snapshots=3, reach=10_000, step_bytes=1 << 30, budget=1)
    assert tiny.step_slots == 150 and tiny.snapshot_slots == 3 + 1  # never below the dense tier


def test_an_extra_snapshot_off_the_grid_never_takes_a_slot_beyond_the_ring():
    """The self-check takes one snapshot half-way through its steps, off the snapshot grid."""
    p = plan(snapshot_every=4, keep_snapshots=2, reach=0)
    slots = SnapshotSlots(p)
    placed = [slots.place(t) for t in (0, 2, 4, 8, 12, 16)]
    assert max(placed) < p.snapshot_slots == 3
    assert sorted(slots.kept) == [12, 16]  # step 2's is kept while its steps are (8 steps)
    slots = SnapshotSlots(p)
    for t in (0, 2, 4, 8):
        slots.place(t)
    assert sorted(slots.kept) == [2, 4, 8]
