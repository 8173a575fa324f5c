"""Which snapshots a recording keeps, and how far back its steps are replayable (its reach).

Snapshots are dense near the newest step and sparse further back (docs/format.md, "Reach"):
a snapshot taken before step ``s`` is kept, when the newest step is ``now``, while its age
``now - s`` is below the step ring's size (its own step record is still there) and some tier
``(every, span)`` has ``(s - start) % every == 0`` and ``age < span``. The default tiers, with
``snapshot_every = E = 50`` and ``keep_snapshots = K = 3``: every 50 steps for the last 150,
every 500 for the last 5,000, every 5,000 as far as the step ring reaches. The step ring keeps
every step back to the oldest kept snapshot (``step_slots``), so the last ``reach`` steps are
replayable at every moment.

Pure ring arithmetic (no torch, no HDF5): the recorder places snapshots with
:class:`SnapshotSlots`, the reader and ``replay info`` state the reach from :class:`ReachPlan`.

Example::

    >>> p = plan(snapshot_every=50, keep_snapshots=3, reach=10_000)
    >>> p.tiers, p.step_slots, p.reach
    (((50, 150), (500, 5000), (5000, 0)), 15000, 10000)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["ReachPlan", "SnapshotSlots", "plan", "tiers_of", "describe_tiers"]

# How much sparser each tier is than the one before, and how many of its snapshots it keeps.
_SPARSER = 10
_TIER_COUNT = 10


def tiers_of(snapshot_every: int, keep_snapshots: int, steps: int) -> tuple[tuple[int, int], ...]:
    """The tiers ``(every, span)`` that reach back ``steps`` steps; the last one's span is 0
    (unbounded: as far as the step ring reaches). ``steps <= E * K``: the dense tier alone."""
    every, span = snapshot_every, snapshot_every * keep_snapshots
    out: list[tuple[int, int]] = []
    while span < steps:
        out.append((every, span))
        every *= _SPARSER
        span = every * _TIER_COUNT
    out.append((every, 0))
    return tuple(out)


@dataclass(frozen=True)
class ReachPlan:
    """How a recording's rings are sized and which snapshots it keeps.

    ``step_slots`` steps are kept (every step back to the oldest kept snapshot); at most
    ``snapshot_slots`` snapshots at once (what the rule keeps, and one spare for a snapshot off
    the grid: the self-check's, half-way through its steps); at every moment each of the last
    ``reach`` steps is replayable (computed over the rule, not assumed).
    """

    start: int
    tiers: tuple[tuple[int, int], ...]
    step_slots: int
    snapshot_slots: int
    reach: int

    def keeps(self, s: int, now: int) -> bool:
        """Whether the snapshot before step ``s`` is still kept when ``now`` is the newest."""
        age = now - s
        if age < 0:
            return True
        if age >= self.step_slots:
            return False  # its own step record is gone: it can start no replay
        if (s - self.start) % self.tiers[0][0]:
            return True  # off the grid: the self-check's own, kept while its steps are
        return any(
            (s - self.start) % every == 0 and (span == 0 or age < span)
            for every, span in self.tiers
        )

    def meta(self) -> dict[str, object]:
        """``meta/run.reach`` of the file (docs/format.md)."""
        return {
            "tiers": [list(t) for t in self.tiers],
            "step_slots": self.step_slots,
            "snapshot_slots": self.snapshot_slots,
            "reach": self.reach,
        }


class SnapshotSlots:
    """The recorder's side of the rule: which slot of ``/snapshots`` the next snapshot takes.

    A snapshot goes to the slot of one the rule no longer keeps (the lowest such), or to the
    lowest slot never used. Snapshots come at increasing steps on the ``snapshot_every`` grid.
    """

    def __init__(self, p: ReachPlan) -> None:
        self.plan = p
        self.kept: dict[int, int] = {}  # step -> slot
        self.free: set[int] = set()
        self.used = 0

    def place(self, t: int) -> int:
        self.free.update(slot for s, slot in self.kept.items() if not self.plan.keeps(s, t))
        self.kept = {s: slot for s, slot in self.kept.items() if self.plan.keeps(s, t)}
        if self.free:
            slot = min(self.free)
            self.free.discard(slot)
        elif 0 < self.plan.snapshot_slots <= self.used:
            # Every slot taken: only more than one snapshot off the grid can bring this about;
            # the oldest of them, or else the oldest, gives its slot up.
            every = self.plan.tiers[0][0]
            off = [s for s in self.kept if (s - self.plan.start) % every]
            slot = self.kept.pop(min(off) if off else min(self.kept))
        else:
            slot, self.used = self.used, self.used + 1
        self.kept[t] = slot
        return slot


def _simulate(
    start: int, every: int, tiers: tuple[tuple[int, int], ...], step_slots: int
) -> tuple[int, int]:
    """``(snapshot slots needed, guaranteed reach)`` of the rule, over enough steps to pass
    through its steady state (the rule repeats with the coarsest tier's period)."""
    p = ReachPlan(start, tiers, step_slots, 0, 0)
    slots = SnapshotSlots(p)
    period = tiers[-1][0]
    horizon = step_slots + 3 * period + tiers[0][1]
    reach: int | None = None
    t = start
    while t <= start + horizon:
        slots.place(t)
        nxt = t + every
        kept = sorted(slots.kept)
        # The window at ``now`` in [t, nxt) runs from the oldest kept snapshot whose step is
        # still in the ring; it is shortest at t and just after one falls out of the ring.
        if t >= start + step_slots:  # once the ring has wrapped (before, everything is kept)
            for now in [t] + [s + step_slots for s in kept if t <= s + step_slots < nxt]:
                live = [s for s in kept if now - s < step_slots and s <= now]
                width = now - live[0] + 1 if live else 0
                reach = width if reach is None else min(reach, width)
        t = nxt
    return slots.used, step_slots if reach is None else reach


@functools.lru_cache(maxsize=64)
def plan(
    *,
    snapshot_every: int,
    keep_snapshots: int,
    reach: int,
    start: int = 0,
    step_bytes: int = 0,
    budget: int = 0,
) -> ReachPlan:
    """Size the rings so that the last ``reach`` steps stay replayable.

    ``step_bytes``: what one step record takes in the file (its batch, or its reference, and
    RNG states); ``budget``: at most that many bytes of step records (0: no bound). A budget
    smaller than ``reach`` needs keeps fewer steps, never fewer than the dense tier's
    ``snapshot_every * keep_snapshots``, and the plan's ``reach`` says what remains.
    """
    dense = snapshot_every * keep_snapshots
    want = max(reach, dense)
    tiers = tiers_of(snapshot_every, keep_snapshots, want)
    # The oldest of the last ``want`` steps needs a snapshot at most one coarse period before.
    step_slots = want if len(tiers) == 1 else want + tiers[-1][0]
    if budget and step_bytes and step_slots * step_bytes > budget:
        fit = max(dense, budget // step_bytes // snapshot_every * snapshot_every)
        if fit < step_slots:
            step_slots = fit
            tiers = tiers_of(snapshot_every, keep_snapshots, step_slots)
    # One spare slot: the self-check takes one snapshot off the grid (recorder.py), kept while
    # its steps are in the ring; a run without it never writes that slot.
    if len(tiers) == 1:  # the dense ring alone, as format v2 kept it
        return ReachPlan(start, tiers, dense, keep_snapshots + 1, dense - snapshot_every + 1)
    used, got = _simulate(start, snapshot_every, tiers, step_slots)
    return ReachPlan(start, tiers, step_slots, used + 1, min(got, want))


def describe_tiers(tiers: list[list[int]] | tuple[tuple[int, int], ...]) -> str:
    """``every 50 steps for the last 150, every 500 for the last 5,000, every 5,000 beyond``."""
    parts = [
        f"every {every:,}{' steps' if i == 0 else ''} "
        + (f"for the last {span:,}" if span else "beyond")
        for i, (every, span) in enumerate(tiers)
    ]
    if len(parts) == 1:
        return parts[0].replace(" beyond", "")
    return ", ".join(parts)
