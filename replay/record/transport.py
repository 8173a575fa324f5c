"""How a recorded step reaches the file: the shared step log, or the writer thread.

A step whose tensors all live in host memory (a CPU run) is encoded into the step log that the
writer process reads (``step_log_writer.py``) before ``Recorder.step`` returns: safe from then
on. Anything else (a GPU step, a record larger than the log, a log whose writer process died)
is copied and handed to the writer thread (``writer_thread.py``) once its copies from the device
are done (``inflight.py``); a CPU record that went that way is waited for, so it is as safe as
one in the log.

:class:`Transport` owns the writer process's client, the step log, the writer thread and the
pool of batch buffers. It never warns itself: :meth:`Transport.check` says what the recorder
tells the user (a wait, or why recording stopped), once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..capture.pool import HostPool
from ..capture.tensors import CopyStats, copy_tree
from ..store.step_log import LOG_BYTES
from ..store.writer_process import WriterClient
from .config import RecorderConfig
from .inflight import PendingStep
from .step_log_writer import LAG_SECONDS, LAG_STEPS, StepLogWriter
from .writer_thread import BackgroundWriter, SnapshotJob, StepJob

__all__ = ["Transport", "Checked", "POLL_EVERY"]

#: How often (seconds) a step looks at whether the writer process still lives.
POLL_EVERY = 0.002


@dataclass(slots=True)
class Checked:
    """What :meth:`Transport.check` found: a wait to report (``wait``), and why recording
    stopped (``stopped``, a whole sentence's middle: ``"... stopped (<stopped>); <after>"``)."""

    wait: str | None = None
    stopped: str | None = None
    after: str = ""


class Transport:
    """The step log, the writer thread and the writer process, for one recording.

    ``make_store``: runs on the writer thread at its first commit and returns the client with
    the file created (the recorder knows the run's metadata; this class only moves records).
    """

    def __init__(
        self,
        model_bytes: int,
        config: RecorderConfig,
        watched: tuple[str, ...],
        make_store: Callable[[WriterClient], WriterClient],
        path: str,
    ) -> None:
        self.config = config
        self.path = path
        self._watched = watched
        self._make_store = make_store
        self.pool = HostPool()  # the batch copies' buffers, given back by the writer thread
        # the snapshots' arena: one state's worth of buffers, reused (pinned on a GPU)
        self.arena = HostPool(1 << 62, state=True)
        # Started early: its imports overlap the first steps. The step log holds a few
        # snapshots (weights, moments, gradients: about 4x the model) besides the steps.
        self.client = WriterClient(min(max(LOG_BYTES, 12 * model_bytes), 1 << 30))
        log = self.client.step_log
        self.log = (
            StepLogWriter(log, alive=self._process_alive, watched=watched)
            if log is not None
            else None
        )
        self.writer: BackgroundWriter | None = None
        self._cuda_built = torch.cuda.is_available()  # ~16 us a call inside a training loop
        self._exit_seen = False
        self._poll_at = 0.0  # (monotonic) when check next looks at the writer process
        self._said_wait = False  # training waited for a writer that fell behind: said once
        self._said_stop = False
        self.spilled = False  # the step being recorded went past the step log
        self._spills = 0  # records too large for the log, passed on before step returned

    # -- per step, on the training thread -----------------------------------------------------

    def _host_run(self) -> bool:
        return self.log is not None and not (
            self._cuda_built and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # torch stubs
        )

    def capture(
        self,
        p: PendingStep,
        batch: Any,
        values: Any,
        batch_ref: dict[str, Any] | None = None,
        object_hparams: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        """Step ``p``'s record (``p.job``): into the step log when the step lives in host
        memory (safe once the step returns, ``p.direct``), else copied for the writer thread.
        ``batch_ref``: the batch by reference (``batch`` is then ``None``). ``object_hparams``:
        the other named optimizers' groups (``capture/hparams.py``)."""
        copied = p.copied
        log = self.log if self._host_run() else None
        record = (p.t, p.rng, p.hparams, p.modes, batch, values, batch_ref, p.trainable)
        logged = log.begin(*record, object_hparams, p.step_fn) if log is not None else None
        loggable = logged is not None  # (None: a tensor on a device)
        p.direct = direct = bool(logged)
        # A CPU step the log could not take (larger than the log, or its writer process gone)
        # goes by the writer thread, and the step waits until it is passed on (finish).
        self.spilled = loggable and not direct
        batch = None if direct else copy_tree(batch, stats=copied, pool=self.pool)
        p.job = job = StepJob(p.t, p.rng, batch, p.hparams, p.modes, p.health, batch_ref=batch_ref)
        job.values = copy_tree(values, stats=copied) if values and not direct else None
        job.trainable, job.object_hparams = p.trainable, object_hparams
        job.step_fn = copy_tree(p.step_fn) if p.step_fn and not direct else None
        if self._cuda_built and copied.cuda:
            # after the batch's copies from the device: the step goes to the writer thread
            # once this event (and its health's, ``inflight.py``) says they are done
            job.event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch stubs
            job.event.record()

    def finish(self, p: PendingStep) -> None:
        """The step returned: its health row goes beside its record, which is then published
        (or the job goes to the writer thread, waited for when it spilled from the log)."""
        if p.direct:
            self.log.publish(p.health)  # type: ignore[union-attr]  # (direct: the log took it)
        else:
            self.submit(p.job, p.copied)
            if self.spilled:
                self.wait_handed()

    def raised(self, p: PendingStep) -> None:
        """The step raised: its record, with the exception, goes by the writer thread (with
        the batch read back from the log when it began there) and is flushed."""
        p.job.exception = p.exception
        if p.direct:
            p.job.record = self.log.abandon(p.exception)  # type: ignore[union-attr, arg-type]
        self.submit(p.job, p.copied)
        self.flush()

    def submit(self, job: StepJob, copied: CopyStats) -> None:
        """Hand a settled step to the writer thread (``record/inflight.py``): its health is
        host floats and its copies from the device are done, so that thread never waits for
        the device."""
        job.nbytes, job.buffers = copied.nbytes, copied.pooled
        self.writer_or_start().submit(job)

    def snapshot(self, t: int, slot: int, live: dict[str, Any]) -> None:
        """The objects' state before step ``t`` into snapshot ``slot``: through the log when it
        fits (host memory), else copied for the writer thread (a CPU one is waited for)."""
        writer = self.writer_or_start()  # (it creates the file; the log's records wait)
        log = self.log if self._host_run() else None
        logged = log.snapshot(t, slot, live) if log is not None else None
        if logged:
            return
        copied = CopyStats()
        state = {"step": t, **copy_tree(live, stats=copied, pool=self.arena)}
        event = None
        if copied.cuda:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch stubs
            event.record()
        job = SnapshotJob(t, slot, state, event, copied.nbytes, copied.pooled, self.arena)
        writer.submit(job)
        if logged is not None:
            self.wait_handed()  # a CPU snapshot the log could not take: passed on before the step

    def wait_handed(self) -> None:
        """A record the step log could not take went to the writer thread: wait until it is in
        the file, so that the step is safe once ``step`` returns, as a step in the log is (and
        stays so when the writer process dies: see ``BackgroundWriter._died``)."""
        if self.writer is not None:
            self.writer.wait_committed()
            if self.writer.error is None:
                self._spills += 1

    # -- the writer -----------------------------------------------------------------------------

    def writer_or_start(self) -> BackgroundWriter:
        if self.writer is None:
            log = self.client.step_log
            self.writer = BackgroundWriter(
                lambda: self._make_store(self.client),
                max_pending_bytes=self.config.max_pending_bytes,
                max_pending_steps=self.config.max_pending_steps,
                max_pending_seconds=self.config.max_pending_seconds,
                pool=self.pool,
                watched=self._watched,
                take_over=self._take_over if log is not None else None,
                pending_in_log=log.pending_steps if log is not None else None,
            )
        return self.writer

    def _take_over(self) -> WriterClient:
        """Runs on the writer thread when the writer process died: a successor on the same
        file and the same step log (the log lives in this process too)."""
        return WriterClient(step_log=self.client.step_log).reopen(self.path)

    def _process_alive(self) -> bool:
        return self.client.proc.poll() is None

    def flush(self, timeout: float | None = 60.0) -> None:
        if self.writer is not None:
            self.writer.flush(timeout)

    def close(self, ended: dict[str, Any] | None = None) -> None:
        """Commit what was handed over and close the file; the step log last (it stays open
        for a successor writer process until then). ``ended``: ``record/ending.py``."""
        try:
            if self.writer is not None:
                self.writer.close(ended=ended)
            else:  # no step reached the writer thread (none was taken, or the first one
                # failed to be captured): its process still ends, and with it its pipes; that
                # end is this close's, no failure to tell the user of
                self._exit_seen = True
                self.client.close()
        finally:
            if self.client.step_log is not None:
                self.client.step_log.close()

    def close_again(self) -> None:
        """A close that a signal interrupted: finish its wait for the writer."""
        if self.writer is not None:
            self.writer.close()

    # -- what the recorder tells the user ------------------------------------------------------

    def check(self, next_step: int) -> Checked | None:
        """Before every step: a writer process that exited, a wait training had to make, a
        write that failed; ``None`` when there is nothing to say (each is said once)."""
        w, log = self.writer, self.log
        if log is not None and not self._exit_seen:
            # Whether the writer process lives, at most every POLL_EVERY seconds (a waitpid: 2
            # us warm, 5-10 right after a step's backward). Steps in the log are read by nobody
            # once it died; the writer thread's next exchange with it gets its last word and a
            # successor commits the log. Looked at every 64 steps, a run killed within 63 steps
            # of its writer lost every step the log held, though each had returned: now it is
            # at most POLL_EVERY's worth of steps, which a successor's start-up (0.3 s) dwarfs.
            now = time.monotonic()
            if now >= self._poll_at:
                self._poll_at = now + POLL_EVERY
                if not self._process_alive():
                    exited = self._writer_exited(w)
                    if exited is not None:
                        return exited
        wait = None if self._said_wait else self._wait_said(w, log)
        failed = w is not None and w.error is not None and not self._said_stop
        if wait is None and not failed:
            return None
        out = Checked()
        if wait is not None:
            out.wait, self._said_wait = wait, True
        if failed and w is not None and w.error is not None:
            self._said_stop = True
            out.stopped = w.error
            # A path the store refuses (a device, a FIFO, a link) or cannot make held nothing.
            out.after = (
                "training goes on unrecorded"
                if w.error.startswith("UnsafePath") or w.wrote_nothing
                else "training goes on, and the steps flushed before the failure stay readable"
            )
            if w.taken_over is not None:
                out.after = f"{w.taken_over}; training goes on unrecorded from step {next_step}"
        return out

    def _writer_exited(self, w: BackgroundWriter | None) -> Checked | None:
        self._exit_seen = True
        if w is not None:
            # (without a time limit: a successor may be committing the whole log meanwhile,
            # and a record published into the log after it closed would be lost); what it
            # saved is said below, from the writer thread's error
            w.wait_committed()
            return None
        self._said_stop = True
        return Checked(
            stopped="the writer process failed: OSError: it exited",
            after="training goes on, and the steps flushed before stay readable",
        )

    def _wait_said(self, w: BackgroundWriter | None, log: StepLogWriter | None) -> str | None:
        if log is not None and log.waited:
            return (
                "replay: training waited for the recorder's writer process, which fell "
                f"{log.log.size >> 20} MiB of steps behind (the CPU or the disk does not "
                "keep up); recording goes on, and every step is safe once it returns"
            )
        if log is not None and log.lagged:
            return (
                "replay: training waited for the recorder's writer process, whose file lagged "
                f"more than {LAG_SECONDS:g} s or {LAG_STEPS} steps behind training (the CPU or "
                "the disk does not keep up); recording goes on, every step is safe once it "
                "returns, and a kill of the whole process group loses at most that lag"
            )
        if self._spills and log is not None:
            return (
                "replay: a step's record did not fit the recorder's step log "
                f"({log.log.size >> 20} MiB, shared with its writer process): training "
                "waited until the writer had taken it before the step returned (each such step "
                "waits for its own write); recording goes on, and every step is safe once it "
                "returns"
            )
        if w is not None and w.throttled:
            return (
                "replay: training waited for the recorder's writer, which fell more than "
                f"{w.max_pending_steps} steps and {w.max_pending_seconds:g} s behind (or "
                f"{w.max_pending_bytes >> 20} MiB; the CPU or the disk does not keep up); "
                "recording goes on, and a kill -9 loses at most that backlog"
            )
        return None
