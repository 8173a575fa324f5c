"""The HDF5 writer runs in a child process, so no HDF5 failure can ever take training down.

Measured here: after a failed write (``EFBIG``), closing or merely releasing the h5py handle
segfaulted inside the HDF5 library, and parking the handle only moved the crash to interpreter
exit. In a child process such a crash ends recording, never the run.

Durability: the step log (``step_log.py``, CPU steps, written by the training thread) and the
pipe (frames from the writer thread: GPU steps, snapshots that do not fit the log) are the
boundary. What the parent published in the log, or finished writing to the pipe, is committed
even when the parent is then killed: the child sees EOF, marks the lock file "draining",
reads the rest of the log, commits, and closes the file properly. So the child is free to group frames into one commit (three flushes) at most
every ``COMMIT_INTERVAL`` seconds (or ``COMMIT_RECORDS`` records), which keeps its CPU use small
beside training. A kill of the child alone loses nothing that returned either: the parent starts
a successor over the same step log (``reopen``). Only a kill of both (``kill -9`` of the whole
process group) loses what was not committed yet, which the training thread bounds
(``step_log_writer.LAG_SECONDS``, ``LAG_STEPS``).

Protocol over the child's stdin (parent -> child): frames of ``u64 header length``, a JSON header,
then ``u64 body length`` and the body bytes. A ``commit`` frame's body may instead be in the
shared ring (``frame_ring.py``): its header then says where (``"ring": [offset, n, end]``) and the
pipe body is empty. ``commit`` frames are not answered; ``create``, ``sync`` and ``close`` are
answered with one line on stdout, ``ok`` or ``error <message>``. A failing child writes its
``error`` line and exits, which the parent sees at its next write or sync. Pickle is not used.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np

from ..child import WRITER, python_module
from .contracts import HealthFrame, Payload, RunMeta, SnapshotFrame, StepFrame
from .frame_ring import FrameRing
from .step_log import LOG_BYTES, StepLog
from .writer import RingSpec, StoreWriter

__all__ = [
    "WriterClient",
    "WriterError",
    "WriterDied",
    "COMMIT_INTERVAL",
    "WRITER_NICE",
    "lower_priority",
]

_U64 = struct.Struct("<Q")
COMMIT_INTERVAL = 0.2  # seconds between commits when frames arrive continuously
COMMIT_BYTES = 256 << 20  # ... or as soon as this much is pending
COMMIT_RECORDS = 256  # ... or as many of the step log's records (what a group kill may lose)
PIPE_BYTES = 1 << 20  # the pipe's kernel buffer (from the default 64 KiB), where allowed
WRITER_NICE = 10  # the writer thread's and the writer process's (see lower_priority)
GATHER_DELAY = 0.02  # after a wake-up, let more frames arrive before reading (fewer wake-ups)
LOG_POLL = 0.02  # how often the step log is looked at (it is read, not signalled)


class WriterError(OSError):
    """The writer process reported a failure; the message is its own, one line."""


class WriterDied(WriterError):
    """The writer process stopped answering (it crashed, or was killed)."""


def _write_frame(out: BinaryIO, header: dict[str, Any], parts: list[np.ndarray]) -> None:
    head = json.dumps(header).encode()
    total = sum(p.nbytes for p in parts)
    out.write(_U64.pack(len(head)) + head + _U64.pack(total))
    for p in parts:
        out.write(np.ascontiguousarray(p).data.cast("B"))
    out.flush()


def _add(parts: list[np.ndarray], payload: Payload) -> int:
    """Append a payload (an array or a list of parts) to a frame's parts; return its size."""
    if isinstance(payload, np.ndarray):
        parts.append(payload)
        return int(payload.nbytes)
    parts.extend(payload)
    return sum(int(p.nbytes) for p in payload)


def _grow_pipe(stream: Any) -> None:
    """Ask for a pipe of up to ``PIPE_BYTES``: the writer thread then rarely blocks, and the child
    can take several frames per wake-up (see ``_Server.serve``). Linux only; harmless elsewhere."""
    with contextlib.suppress(OSError, ImportError, ValueError, AttributeError):
        import fcntl

        limit = PIPE_BYTES
        with contextlib.suppress(OSError, ValueError), open("/proc/sys/fs/pipe-max-size") as fh:
            limit = min(limit, int(fh.read()))
        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), limit)


class WriterClient:
    """Parent side: ``commit``/``sync``/``close`` like :class:`StoreWriter`, in a child process."""

    def __init__(self, log_bytes: int = LOG_BYTES, *, step_log: StepLog | None = None) -> None:
        """Start the child now; it imports numpy and h5py while training gets going.
        ``log_bytes``: the step log's size (see step_log.py). ``step_log``: a dead writer
        process's log, taken over (see ``reopen``). The log's descriptor stays open in this
        process, for such a successor; whoever made the log closes it when recording ends."""
        self.ring = FrameRing.create()
        # The training thread's own way in: see step_log.py. None where memfd is missing (or
        # REPLAY_STEP_LOG=off); the recorder then hands every step to its writer thread.
        self.step_log = step_log
        if step_log is None and os.environ.get("REPLAY_STEP_LOG") != "off":
            self.step_log = StepLog.create(log_bytes)
        argv = python_module(WRITER)
        if self.ring is not None:
            argv += ["--ring", str(self.ring.fd)]
        if self.step_log is not None:
            argv += ["--log", str(self.step_log.fd)]
        shared = [m for m in (self.ring, self.step_log) if m is not None]
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=tuple(m.fd for m in shared),
            )
        finally:
            if self.ring is not None:
                self.ring.close()  # the mapping stays; the child has its own descriptor
        _grow_pipe(self.proc.stdin)

    def create(
        self,
        path: str,
        *,
        run_id: str,
        meta: RunMeta | dict[str, Any],
        sources: dict[str, str],
        steps: RingSpec,
        snapshots: RingSpec,
        health_slots: int,
        watched: tuple[str, ...] = (),
    ) -> WriterClient:
        """Create the file. ``meta`` is the run's :class:`RunMeta` (a dict: already its JSON)."""
        header = {
            "op": "create",
            "path": path,
            "run_id": run_id,
            "meta": meta.to_json() if isinstance(meta, RunMeta) else meta,
            "sources": sources,
            "steps": [steps.slots, steps.chunk, steps.capacity],
            "snapshots": [snapshots.slots, snapshots.chunk, snapshots.capacity],
            "health_slots": health_slots,
            "watched": list(watched),
        }
        self._send(header, [])
        self._answer()
        return self

    def reopen(self, path: str) -> WriterClient:
        """Take over the file of a writer process that died, and its step log's records that
        are not in the file yet (they are committed at the next sync or close)."""
        self._send({"op": "reopen", "path": path}, [])
        self._answer()
        return self

    def _send(self, header: dict[str, Any], parts: list[np.ndarray]) -> None:
        try:
            _write_frame(self.proc.stdin, header, parts)  # type: ignore[arg-type]
        except (BrokenPipeError, OSError, ValueError):
            self._answer()  # the child said why before it left, or it crashed
            raise WriterDied("the writer process stopped reading") from None

    def _answer(self) -> None:
        try:
            answer = self.proc.stdout.readline().decode().strip()  # type: ignore[union-attr]
        except (OSError, ValueError) as e:
            raise WriterDied(f"the writer process died ({e})") from None
        if answer == "ok":
            return
        if not answer:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise WriterDied(f"the writer process died (exit code {code})")
        raise WriterError(answer.removeprefix("error ").strip())

    def commit(
        self,
        *,
        steps: Sequence[StepFrame] = (),
        snapshots: Sequence[SnapshotFrame] = (),
        health: Sequence[HealthFrame] = (),
        last_step: int | None = None,
    ) -> None:
        """Send one commit frame. A payload is a uint8 array or the list of its parts
        (``pack_parts``), sent one after the other without being joined first. On the wire a
        frame is a list in the header (``[step, mlen, n]``, ``[slot, step, mlen, n]``, ``step``)
        and its bytes in the body; ``_Server.commit_pending`` turns them back into frames."""
        parts: list[np.ndarray] = []  # the body: the steps', the snapshots', the health rows
        header: dict[str, Any] = {
            "op": "commit",
            "last_step": last_step,
            "steps": [[int(s.step), int(s.mlen), _add(parts, s.payload)] for s in steps],
            "snapshots": [
                [int(s.slot), int(s.step), int(s.mlen), _add(parts, s.payload)] for s in snapshots
            ],
            "health": [int(h.step) for h in health],
        }
        parts += [np.asarray(h.row, dtype=np.float64) for h in health]
        if self.ring is not None:
            placed = self.ring.put(parts, sum(int(p.nbytes) for p in parts))
            if placed is not None:  # else the body goes through the pipe
                header["ring"] = [placed[0], placed[1] - placed[0], placed[1]]
                parts = []
        self._send(header, parts)

    def sync(self) -> None:
        """Return once everything sent so far is committed to the file."""
        self._send({"op": "sync"}, [])
        self._answer()

    def close(self, *, clean: bool = True, ended: dict[str, Any] | None = None) -> None:
        try:
            self._send({"op": "close", "clean": clean, "ended": ended}, [])
            self._answer()
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class _FrameReader:
    """Unbuffered frame reader over a file descriptor, so ``select`` tells the truth.

    Bodies are read straight from the pipe into an arena that is reused from one commit to the
    next (``release``): a fresh buffer per frame meant fresh pages, a page fault per 4 KiB,
    which was 30% of this process's CPU on the benchmark MLP. A body that does not fit gets its
    own buffer, and the arena grows to what the last commit window needed (up to ``COMMIT_BYTES``).
    """

    def __init__(self, fd: int) -> None:
        self.raw = os.fdopen(fd, "rb", buffering=0, closefd=False)
        self._arena = np.empty(0, dtype=np.uint8)
        self._used = 0  # arena bytes holding bodies not yet released
        self._wanted = 0  # bytes the frames since the last release took, in the arena or not

    def _body(self, n: int) -> np.ndarray:
        self._wanted += n
        if self._used + n <= self._arena.size:
            body = self._arena[self._used : self._used + n]
            self._used += n
            return body
        return np.empty(n, dtype=np.uint8)

    def release(self) -> None:
        """Every body read so far is done with: the arena is written over from the start."""
        if self._wanted > self._arena.size:
            self._arena = np.empty(min(self._wanted, COMMIT_BYTES), dtype=np.uint8)
        self._used = self._wanted = 0

    def _read_into(self, buf: memoryview) -> bool:
        pos = 0
        while pos < len(buf):
            n = self.raw.readinto(buf[pos:])
            if not n:
                return False
            pos += n
        return True

    def ready(self, timeout: float | None) -> bool:
        """Whether input (a frame or EOF) arrives within ``timeout`` seconds (None: waits)."""
        wait = None if timeout is None else max(timeout, 0.0)
        return bool(select.select([self.raw], [], [], wait)[0])

    def read(self) -> tuple[dict[str, Any], memoryview] | None:
        head = bytearray(8)
        if not self._read_into(memoryview(head)):
            return None
        header = bytearray(_U64.unpack(head)[0] + 8)
        if not self._read_into(memoryview(header)):
            return None
        body = self._body(_U64.unpack_from(header, len(header) - 8)[0])
        if not self._read_into(body.data):
            return None  # a frame cut short by the parent's death is not committed
        return json.loads(bytes(header[:-8])), body.data


class _Server:
    def __init__(
        self,
        inp: _FrameReader,
        out: BinaryIO,
        ring: FrameRing | None = None,
        log: StepLog | None = None,
    ) -> None:
        self.inp, self.out = inp, out
        self.ring = ring
        self.log = log
        self.log_pos = 0  # the step log is read up to here
        self.log_items: list[Any] = []  # its records read and not yet committed
        self.log_bytes = 0
        self.ring_end = 0  # end of the last ring body among the pending frames
        self.ring_pending = 0
        self.store: StoreWriter | None = None
        self.pending: list[tuple[dict[str, Any], memoryview]] = []
        self.pending_bytes = 0
        self.last_commit = time.monotonic()

    def reply(self, text: str) -> None:
        self.out.write(text.encode() + b"\n")
        self.out.flush()

    def take_log(self) -> int:
        """Read what the training thread has published since the last call (once the file
        exists: until then records wait in the log). Returns how many records came."""
        if self.log is None or self.store is None:
            return 0
        end = self.log.published()
        items = list(self.log.read(self.log_pos, end))
        self.log_pos = end
        self.log_items.extend(items)
        self.log_bytes += sum(int(r.payload.nbytes) for r in items)
        return len(items)

    def unread_log(self) -> int:
        """Records published and not yet read (what a drain still has to commit)."""
        if self.log is None:
            return 0
        return sum(1 for r in self.log.read(self.log_pos, self.log.published()) if r.slot < 0)

    def commit_pending(self) -> None:
        if (not self.pending and not self.log_items) or self.store is None:
            self.pending.clear()
            self._release()
            return
        steps: list[StepFrame] = []
        snaps: list[SnapshotFrame] = []
        health: list[HealthFrame] = []
        last = None
        ncols = len(self.store.health_columns)
        for header, body in self.pending:
            data = np.frombuffer(body, dtype=np.uint8)
            pos = 0
            for step, mlen, n in header["steps"]:
                steps.append(StepFrame(step, data[pos : pos + n], mlen))
                pos += n
            for slot, step, mlen, n in header["snapshots"]:
                snaps.append(SnapshotFrame(slot, step, data[pos : pos + n], mlen))
                pos += n
            for step in header["health"]:
                health.append(HealthFrame(step, data[pos : pos + 8 * ncols].view(np.float64)))
                pos += 8 * ncols
            if header["last_step"] is not None:
                last = header["last_step"] if last is None else max(last, header["last_step"])
        for rec in self.log_items:
            if rec.slot >= 0:
                snaps.append(SnapshotFrame(rec.slot, rec.step, rec.payload, rec.mlen))
                continue
            steps.append(StepFrame(rec.step, rec.payload, rec.mlen))
            health.append(HealthFrame(rec.step, rec.health))
            last = rec.step if last is None else max(last, rec.step)
        # The step log and the pipe are two queues: a step that raised went by the pipe and can
        # arrive before the log's earlier steps. A ring slot written twice in one group keeps its
        # later item, so put them in step order (stable: for one step, the later one still wins).
        steps.sort(key=lambda s: s.step)
        health.sort(key=lambda h: h.step)
        snaps.sort(key=lambda s: s.step)
        self.store.commit(steps=steps, snapshots=snaps, health=health, last_step=last)
        self.pending.clear()
        self._release()  # the bodies' bytes are in the file now
        self.pending_bytes = 0
        self.last_commit = time.monotonic()

    def _release(self) -> None:
        self.inp.release()
        if self.ring is not None and self.ring_end:
            self.ring.release(self.ring_end)
        self.ring_pending = 0
        if self.log is not None and self.log_items:
            self.log.release(self.log_items[-1].end)
        self.log_items.clear()
        self.log_bytes = 0

    def due(self) -> bool:
        """Whether what is pending should be committed now."""
        if not self.pending and not self.log_items:
            return False
        return (
            time.monotonic() - self.last_commit >= COMMIT_INTERVAL
            or self.pending_bytes + self.log_bytes >= COMMIT_BYTES
            or (self.log is not None and self.log_bytes >= self.log.size // 4)
            or len(self.log_items) >= COMMIT_RECORDS
            or (self.ring is not None and self.ring_pending >= self.ring.size // 2)
        )

    def drain(self) -> None:
        """Training is gone without closing: say so beside the file (``replay info`` shows it,
        ``bisect`` waits), commit everything it published, close the file."""
        if self.store is not None:
            taken = sum(1 for r in self.log_items if r.slot < 0)
            in_pipe = sum(len(h["steps"]) for h, _ in self.pending)
            self.store.mark_draining(self.unread_log() + taken + in_pipe)
        self.take_log()
        self.commit_pending()
        if self.store is not None:
            self.store.close(clean=False)
            self.store = None

    def handle(self, header: dict[str, Any], body: memoryview) -> bool:
        op: str = header["op"]
        if op == "commit":
            self.take_log()  # what the log published before this frame was sent goes first
            if "ring" in header:
                offset, n, end = header["ring"]
                body = self.ring.body(offset, n)  # type: ignore[union-attr]
                self.ring_end = end
                self.ring_pending += n
            self.pending.append((header, body))
            self.pending_bytes += len(body)
            return True
        if op == "create":
            self.store = StoreWriter(
                header["path"],
                run_id=header["run_id"],
                meta=header["meta"],
                sources=header["sources"],
                steps=RingSpec(*header["steps"]),
                snapshots=RingSpec(*header["snapshots"]),
                health_slots=header["health_slots"],
                watched=tuple(header.get("watched") or ()),
            )
        elif op == "reopen":
            # The writer before this one died: go on with its file, and read the step log from
            # the first record it had not released (records it committed and had not released
            # yet are committed again: the same bytes in the same slots).
            self.store = StoreWriter.reopen(header["path"])
            if self.log is not None:
                self.log_pos = self.log.released()
        elif op in ("sync", "close"):
            self.take_log()
            self.commit_pending()
        if op == "close" and self.store is not None:
            self.store.close(clean=bool(header.get("clean", True)), ended=header.get("ended"))
            self.store = None
        self.reply("ok")
        return op != "close"  # False: the last frame

    def serve(self) -> int:
        while True:
            if self.log is not None and self.store is not None:
                wait: float | None = LOG_POLL  # the step log has no wake-up: look at it
            elif self.pending:
                wait = self.last_commit + COMMIT_INTERVAL - time.monotonic()
            else:
                wait = None  # block until input
            if not self.inp.ready(wait):
                self.take_log()
                if self.log is None or self.due():
                    self.commit_pending()  # input went quiet, or the interval is up
                continue
            # Input is there: let more frames arrive, then take all of them, so that a run of
            # small steps costs one wake-up every GATHER_DELAY, not one each. Frames waiting in
            # the pipe outlive the parent: a kill -9 of training loses none of them.
            time.sleep(GATHER_DELAY)
            while True:
                frame = self.inp.read()
                if frame is None:  # parent gone: commit what it published, close properly
                    self.drain()
                    return 0
                if not self.handle(*frame):
                    return 0
                self.take_log()
                if self.due():
                    self.commit_pending()
                if not self.inp.ready(0):
                    break


def lower_priority() -> None:
    """Leave training the cores first, but not so far behind that the writer cannot keep up.

    For the calling thread (Linux threads have their own nice value; in the child that is its
    main thread, which every later thread inherits from). At nice 19 the writers fell behind
    for good on 2 cores that training kept busy; at nice 10 they kept up without slowing the
    runs (benchmarks/RESULTS.md, "backlog", shows which). ``REPLAY_WRITER_NICE`` overrides
    ``WRITER_NICE``.
    """
    with contextlib.suppress(OSError, ValueError, AttributeError):
        nice = int(os.environ.get("REPLAY_WRITER_NICE", str(WRITER_NICE)))
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def failure_words(e: BaseException) -> str:
    """A write failure in one short line: a full disk (or a size limit) said as such, where
    HDF5's message runs to 300 characters of times, descriptors and offsets before the reason."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        what = "the file reached its size limit" if e.errno == errno.EFBIG else "the disk is full"
        return f"{what}: {os.strerror(e.errno)}, {type(e).__name__} errno {e.errno}"
    said = " ".join(f"{type(e).__name__}: {e}".split())
    return said if len(said) <= 300 else said[:297] + "..."


def main() -> int:
    # Ctrl-C and a scheduler's SIGTERM reach the whole process group; the parent decides when
    # recording ends (it closes our input), so the child outlives it long enough to commit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lower_priority()
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    ring = FrameRing.attach(int(args["--ring"])) if "--ring" in args else None
    log = StepLog.attach(int(args["--log"])) if "--log" in args else None
    server = _Server(_FrameReader(sys.stdin.fileno()), sys.stdout.buffer, ring, log)
    try:
        return server.serve()
    except Exception as e:  # noqa: BLE001 - reported to the parent, which stops recording
        server.reply("error " + failure_words(e))
        # HDF5 may be in a state where closing crashes: leave without touching it (a failed
        # write, a full disk, left its lock file beside the recording).
        if server.store is not None:
            with contextlib.suppress(OSError):
                server.store.drop_lock()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
