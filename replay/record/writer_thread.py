"""The background writer: encodes and commits what the training thread hands over.

The training thread only copies (``copy_tree``) and enqueues a step once its health is host floats
and its copies from the device are done (``inflight.py``): this thread never waits for the device
on a step. Encoding and HDF5 I/O happen here (a snapshot still waits for its copies here).
h5py releases the GIL while writing, so this overlaps with torch compute.

Failure policy (first, do no harm): any error here stops recording, keeps what was flushed, and
is reported once by the recorder as a warning; training is never interrupted.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..capture.health import health_row
from ..capture.pool import HostPool
from ..capture.rng import rng_to_tree
from ..capture.tensors import to_leaves
from ..store.contracts import HealthFrame, SnapshotFrame, StepException, StepFrame, StepRecord
from ..store.writer import pack_parts
from ..store.writer_process import (
    WriterClient,
    WriterDied,
    WriterError,
    failure_words,
    lower_priority,
)

__all__ = ["BackgroundWriter", "StepJob", "SnapshotJob"]


@dataclass
class StepJob:
    step: int
    rng: Any
    batch: Any
    hparams: list[dict[str, Any]]
    modes: list[bool]
    health: dict[str, Any]  # python floats once settled (record/inflight.py), by health column
    exception: StepException | None = None
    # the batch's copies from the device: settled (None) before the job reaches this thread
    event: Any = None
    nbytes: int = 0
    buffers: list[Any] | None = None  # the batch's pooled copies, given back once sent
    values: dict[str, Any] | None = None  # rec.step(batch, **values), handed back on replay
    batch_ref: dict[str, Any] | None = None  # the batch by reference (batch is None then)
    trainable: np.ndarray | None = None  # requires_grad of every parameter, where it changed
    object_hparams: dict[str, list[dict[str, Any]]] | None = None  # the other optimizers' groups
    step_fn: dict[str, Any] | None = None  # another step function than the step before's
    # The whole record, already leaves: a step that began in the step log and then raised
    # (its batch as it was before the step, read back from the log).
    record: StepRecord | None = None


@dataclass
class SnapshotJob:
    step: int
    slot: int
    state: dict[str, Any]
    event: Any = None
    nbytes: int = 0
    buffers: list[Any] | None = None  # the state's copies in the arena, given back once sent
    arena: HostPool | None = None


@dataclass
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


_STOP = object()


def _span(steps: list[int]) -> str:
    """``step 7`` or ``steps 3..9``."""
    lo, hi = min(steps), max(steps)
    return f"step {lo}" if lo == hi else f"steps {lo}..{hi}"


def _words(e: Exception) -> str:
    """A writer's failure as the warning quotes it: the writer process's line, or its words."""
    return str(e) if isinstance(e, WriterError) else failure_words(e)


def _count(n: int) -> str:
    return "1 step" if n == 1 else f"{n} steps"


class BackgroundWriter:
    """One daemon thread owning one :class:`WriterClient` (created lazily on the thread).

    Group commit: the training thread appends jobs to a deque and wakes the writer every
    ``WAKE_EVERY`` steps (at once for a snapshot, a flush or close); the writer also wakes on
    its own every ``WAKE_AFTER`` seconds. Each wake of this low-priority thread is a GIL hand-off
    with the training thread, so waking it every step cost more than the commits themselves. A
    ``kill -9`` of the training process loses what was not yet handed over: at most
    ``WAKE_EVERY`` steps or ``WAKE_AFTER`` seconds more than the writer's own backlog, which
    ``_behind`` bounds (``submit`` waits for the writer beyond it); a step that raises or goes
    non-finite is flushed before the recorder returns.
    """

    WAKE_EVERY = 8
    WAKE_AFTER = 0.05

    def __init__(
        self,
        make_store: Callable[[], WriterClient],
        *,
        max_pending_bytes: int,
        max_pending_steps: int = 1 << 62,
        max_pending_seconds: float = 0.0,
        pool: HostPool | None = None,
        watched: tuple[str, ...] = (),
        take_over: Callable[[], WriterClient] | None = None,
        pending_in_log: Callable[[], list[int]] | None = None,
    ) -> None:
        self._make_store = make_store
        self._watched = watched  # objects with their own health columns (capture/watch.py)
        # A writer process that dies (killed, crashed) leaves steps that returned in the shared
        # step log: ``take_over`` starts a successor on the same file and log, which commits
        # them and closes the file. ``pending_in_log`` names those steps, for the warning.
        self._take_over = take_over
        self._pending_in_log = pending_in_log
        self._created = False  # the file exists: a successor can reopen it
        self.wrote_nothing = True  # no file was made (a folder it cannot write in)
        self._ended: dict[str, Any] | None = None  # (close's)
        self.taken_over: str | None = None  # what the successor saved, or could not save
        self._unsynced: list[int] = []  # [first, last, count] of steps sent since the last sync
        self._pool = pool
        self._store: WriterClient | None = None
        self._jobs: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._unsignalled = 0
        # Bytes handed over and bytes committed, each written by one thread only: no lock on
        # the training thread's path (a Condition there cost ~10 us a step).
        self._submitted = 0
        self._committed = 0
        self._submitted_steps = 0  # jobs, snapshots included
        self._committed_steps = 0
        self.max_pending_seen = 0  # the most jobs ever handed over and not yet passed on
        self._times: collections.deque[float] = collections.deque()  # when each pending came
        self._drained = threading.Condition()
        self.max_pending_bytes = max_pending_bytes
        self.max_pending_steps = max(1, max_pending_steps)
        self.max_pending_seconds = max_pending_seconds
        self.error: str | None = None
        self.throttled = 0
        self._thread = threading.Thread(target=self._run, name="replay-writer", daemon=True)
        self._thread.start()

    # -- training-thread side -------------------------------------------------------------------

    def submit(self, job: StepJob | SnapshotJob) -> None:
        if self.error is not None:
            return
        if self._behind():
            # Backpressure only when the writer falls behind: bounded memory beats an OOM, and
            # a bounded backlog bounds what a kill -9 of the training process loses.
            self._wake.set()
            with self._drained:
                while self._behind():
                    if self.error is not None or not self._thread.is_alive():
                        return
                    self.throttled += 1
                    self._drained.wait(timeout=1.0)
        self._submitted += job.nbytes
        self._submitted_steps += 1
        self._times.append(time.monotonic())
        pending = self._submitted_steps - self._committed_steps
        if pending > self.max_pending_seen:
            self.max_pending_seen = pending
        self._jobs.append(job)
        self._unsignalled += 1
        if self._unsignalled >= self.WAKE_EVERY or isinstance(job, SnapshotJob):
            self._signal()

    def _behind(self) -> bool:
        """Too much handed over and not yet passed on: more than ``max_pending_bytes``, or at
        least ``max_pending_steps`` steps of which the oldest came ``max_pending_seconds`` ago.
        (The steps alone would hold up a run of sub-millisecond steps after a few ms; the age
        alone would hold up a GPU run whose writer waits for the device's copies.)"""
        if self._submitted - self._committed > self.max_pending_bytes:
            return True
        if self._submitted_steps - self._committed_steps < self.max_pending_steps:
            return False
        try:
            return time.monotonic() - self._times[0] >= self.max_pending_seconds
        except IndexError:
            return False

    def _signal(self) -> None:
        self._unsignalled = 0
        self._wake.set()

    def wait_committed(self) -> None:
        """Block until everything submitted so far is in the file, however long the writer
        process takes, as long as this thread lives (a writer process that dies on the way is
        taken over, see ``_died``). A step the step log cannot hold waits here before
        ``Recorder.step`` returns: then it is as safe as a step in the log."""
        if not self._thread.is_alive():
            return
        marker = _Flush()
        self._jobs.append(marker)
        self._signal()
        while not marker.done.wait(1.0):
            if not self._thread.is_alive():
                return

    def flush(self, timeout: float | None = 60.0) -> bool:
        """Block until everything submitted so far is committed (or recording failed)."""
        if not self._thread.is_alive():
            return self.error is None
        marker = _Flush()
        self._jobs.append(marker)
        self._signal()
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = 60.0, ended: dict[str, Any] | None = None) -> None:
        """``ended``: how the program ended, when it raised outside any step (the file's
        ``/ended``)."""
        self._ended = ended or self._ended
        if self._thread.is_alive():
            self._jobs.append(_STOP)
            self._signal()
            self._thread.join(timeout)

    # -- writer-thread side -------------------------------------------------------------------

    def _take(self) -> list[Any]:
        while not self._jobs:
            self._wake.wait(self.WAKE_AFTER)
            self._wake.clear()  # a set() racing with this clear() follows an append: seen below
        items = []
        try:
            while True:
                items.append(self._jobs.popleft())
        except IndexError:
            return items

    def _fail(self, e: Exception) -> None:
        """Recording stops (training never does): a writer's error in its own words."""
        self.error = _words(e)
        self._abandon()

    def _run(self) -> None:
        lower_priority()  # this thread only: training threads first
        try:
            # At once: the steps and snapshots the training thread puts in the step log wait
            # there until the writer process has the file.
            self._store = self._make_store()
            self._created, self.wrote_nothing = True, False
        except Exception as e:  # noqa: BLE001 - any failure must stop recording, not training
            self._fail(e)
        stop = False
        while not stop:
            items = self._take()
            jobs = [j for j in items if isinstance(j, (StepJob, SnapshotJob))]
            stop = any(j is _STOP for j in items)
            flushing = any(isinstance(j, _Flush) for j in items)
            if (jobs or flushing) and self.error is None:
                try:
                    if jobs:
                        self._commit(jobs)
                    if flushing and self._store is not None:
                        self._store.sync()
                        self._unsynced = []
                except WriterDied as e:
                    self._died(str(e), jobs)
                except Exception as e:  # noqa: BLE001 - any failure must stop recording, not training
                    self._fail(e)
            self._committed += sum(j.nbytes for j in jobs)
            self._committed_steps += len(jobs)
            for _ in jobs:
                self._times.popleft()
            if not self._behind() or self.error:
                with self._drained:
                    self._drained.notify_all()
            for j in items:
                if isinstance(j, _Flush):
                    j.done.set()
        if self._store is not None:
            try:
                self._store.close(clean=self.error is None, ended=self._ended)
            except WriterDied as e:
                self._died(str(e), [])
            except Exception as e:  # noqa: BLE001
                self.error = self.error or _words(e)  # (found at close: a full disk, say)
        with self._drained:
            self._drained.notify_all()

    def _died(self, error: str, jobs: list[StepJob | SnapshotJob]) -> None:
        """The writer process died without a word (``kill -9``, a crash): recording stops, but
        first a successor takes over its file and step log and commits every step that
        returned (the log's, and ``jobs``, which the dead one may not have had), then closes
        the file. ``taken_over`` says what was saved, or exactly what was lost."""
        self._abandon()
        waiting = self._pending_in_log() if self._pending_in_log is not None else []
        unsynced, self._unsynced = self._unsynced, []
        said = []
        if waiting:
            said.append(f"{_count(len(waiting))} in the shared step log ({_span(waiting)})")
        if jsteps := [j.step for j in jobs if isinstance(j, StepJob)]:
            said.append(f"{_count(len(jsteps))} handed to it ({_span(jsteps)})")
        what = " and ".join(said) or "no step that was still waiting"
        if self._take_over is None or not self._created:
            self.taken_over = f"lost: {what}" if said else None
        else:
            try:
                self._store = self._take_over()
                if jobs:
                    self._commit(jobs)
                self._store.close(clean=False)
                self.taken_over = f"a new writer process committed {what} and closed the file"
            except Exception as e:  # noqa: BLE001 - any failure must stop recording, not training
                self.taken_over = (
                    f"a new writer process could not commit {what} "
                    f"({type(e).__name__}: {e}): they are lost"
                )
                self._abandon()
            self._store = None
        if unsynced:
            first, last, count = unsynced
            self.taken_over = (self.taken_over or "") + (
                f"; {_count(count)} passed to the dead one since its last sync "
                f"({_span([first, last])}) may be missing"
            )
        self.error = error

    def _abandon(self) -> None:
        # The store lives in a child process (see store/writer_process.py); after a failure
        # there is nothing left to save in it, so it is only told to go.
        if self._store is not None:
            with contextlib.suppress(Exception):  # the first error is the one reported
                self._store.close(clean=False)
            self._store = None

    def _commit(self, jobs: list[StepJob | SnapshotJob]) -> None:
        steps: list[StepFrame] = []
        snaps: list[SnapshotFrame] = []
        health: list[HealthFrame] = []
        last = None
        for job in jobs:
            if job.event is not None:
                job.event.synchronize()
            if isinstance(job, SnapshotJob):
                payload, mlen = pack_parts(to_leaves(job.state))
                snaps.append(SnapshotFrame(job.slot, job.step, payload, mlen))
                continue
            record: StepRecord = job.record or {
                "step": job.step,
                "rng": rng_to_tree(job.rng),
                "hparams": to_leaves(job.hparams),
                "modes": np.asarray(job.modes, dtype=bool),
                "batch": to_leaves(job.batch),
                "exception": job.exception,
                "values": to_leaves(job.values) if job.values else None,
            }
            if job.batch_ref is not None and job.record is None:
                record["batch_ref"] = job.batch_ref
            if job.trainable is not None and job.record is None:
                record["trainable"] = job.trainable
            if job.object_hparams is not None and job.record is None:
                record["object_hparams"] = to_leaves(job.object_hparams)
            if job.step_fn is not None and job.record is None:
                record["step_fn"] = to_leaves(job.step_fn)
            payload, mlen = pack_parts(record)
            steps.append(StepFrame(job.step, payload, mlen))
            health.append(HealthFrame(job.step, health_row(job.health, self._watched)))
            last = job.step if last is None else max(last, job.step)
        assert self._store is not None  # (made first thing in _run, or by a take-over)
        self._store.commit(steps=steps, snapshots=snaps, health=health, last_step=last)
        if steps:  # sent, not known to be in the file until the next sync
            u = self._unsynced
            lo, hi = min(s.step for s in steps), max(s.step for s in steps)
            self._unsynced = [u[0], hi, u[2] + len(steps)] if u else [lo, hi, len(steps)]
        # The bytes are sent (to the ring or the pipe): a step's copies back to the pool, a
        # snapshot's to the arena, for the next one; after a failure above they are simply
        # not reused.
        for job in jobs:
            pool = job.arena if isinstance(job, SnapshotJob) else self._pool
            if pool is not None and job.buffers:
                pool.give(job.buffers)
                job.buffers = None
