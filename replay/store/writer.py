"""Writing a recording: preallocated ring buffers in one SWMR HDF5 file.

Every dataset is created (and written once) before SWMR mode is switched on; nothing is created
afterwards. A ring slot is committed with the protocol docs/format.md specifies, which leaves no torn
slot after ``kill -9``: *invalidate markers + flush, payloads + flush, markers + flush*. Several
queued items share one commit (group commit), so the flush cost is paid once per batch of steps.

Not thread-safe: one writer thread owns a ``StoreWriter``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from .checksum import health_crc, slot_crc
from .contracts import HealthFrame, SnapshotFrame, StepFrame
from .h5clear import clear_status_flags
from .layout import (
    ENDED_BYTES,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEALTH_COLUMNS,
    HEALTH_ENCODING,
    META_ENCODING,
    RING_ENCODING,
    STATUS_FIELDS,
    object_columns,
)
from .liveness import lock_info, lock_path
from .safefile import open_lock, refuse_non_regular, replace_whole
from .tree import SPLICE_MARK, encode, layout_key
from .validate import LIMITS

__all__ = [
    "StoreWriter",
    "RingSpec",
    "manifest_text",
    "pack_parts",
    "PackCache",
    "json_blob",
    "RecordingLocked",
    "lock_path",
]


class RecordingLocked(OSError):
    """Another live process is writing this recording: a second writer would replace its file."""


def _take_lock(path: str, meta: dict[str, Any]) -> int | None:
    """Hold an exclusive ``flock`` on ``PATH.lock`` for as long as this writer lives.

    Two Recorders on one path used to end with the second silently replacing the first's live
    file (``os.replace`` below). The lock is taken before anything is created; the kernel drops
    it when the writer process exits, ``kill -9`` included, so a dead run never blocks a new
    one. The file holds who took it, for the other writer's error message. Returns the locked
    descriptor (``None`` where ``fcntl`` is missing: no locking there).
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (the project targets Linux)
        return None
    name = lock_path(path)
    for _ in range(20):
        fd = open_lock(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RecordingLocked(
                f"{path} is being written by another recorder ({holder}); starting a second one "
                "there would replace its file, so this one does not record. Record to another "
                "path, or stop the other run first"
            ) from None
        except OSError:
            os.close(fd)
            raise
        # A writer that closed meanwhile unlinks its lock file: a lock on that old inode
        # protects nothing, so lock the file now at that name instead.
        try:
            same = os.fstat(fd).st_ino == os.stat(name).st_ino
        except FileNotFoundError:
            same = False
        if same:
            env = meta.get("env") or {}
            info = {"pid": env.get("pid"), "writer_pid": os.getpid(), "host": env.get("hostname")}
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
            return fd
        os.close(fd)
    raise RecordingLocked(f"{path}: its lock file {name} keeps changing; record to another path")


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote: ``process 123 (writer process 130) on host``."""
    info = lock_info(fd)
    pid, writer = info.get("pid"), info.get("writer_pid")
    text = f"process {pid}" if pid is not None else "another process"
    if writer is not None and writer != pid:
        text += f" (writer process {writer})"
    if info.get("host"):
        text += f" on {info['host']}"
    return text


def json_blob(value: Any) -> np.ndarray:
    """UTF-8 JSON as a uint8 array (the format's way to hold text: no vlen, no pickle)."""
    return np.frombuffer(json.dumps(value, sort_keys=False).encode(), dtype=np.uint8)


def manifest_text(manifest: Any) -> str:
    """A manifest as the file stores it: compact JSON."""
    return json.dumps(manifest, separators=(",", ":"))


def pack_parts(tree: Any, splices: Sequence[str] = ()) -> tuple[list[np.ndarray], int]:
    """Encode a tree as the pieces of one payload: the manifest JSON, then the buffers, as uint8
    views of the tree's own arrays (no copy). Their concatenation is the payload.

    Returns ``(parts, manifest_length)``. The writer thread hands the parts to the writer
    process as they are: building the contiguous payload there cost a copy of every batch and,
    with the writer lagging behind training, fresh pages (~70 us of page faults for 146 KB).
    ``splices``: the manifest texts of the tree's :class:`~replay.store.tree.Spliced` subtrees,
    in the encoder's order.
    """
    manifest, buffers = encode(tree)
    return _parts(manifest_text(manifest).split(SPLICE_MARK), splices, buffers)


def _parts(
    pieces: list[str], splices: Sequence[str], buffers: list[np.ndarray | bytes]
) -> tuple[list[np.ndarray], int]:
    if len(pieces) != len(splices) + 1:
        raise ValueError(f"{len(pieces) - 1} spliced subtree(s), {len(splices)} text(s)")
    text = pieces[0] + "".join(s + p for s, p in zip(splices, pieces[1:]))
    head = np.frombuffer(text.encode(), dtype=np.uint8)
    parts = [head] + [
        b.reshape(-1).view(np.uint8) if isinstance(b, np.ndarray) else np.frombuffer(b, np.uint8)
        for b in buffers
    ]
    return parts, head.size


class PackCache:
    """:func:`pack_parts` for a stream of trees of one layout (a step's record, step after
    step): the manifest text is encoded again only when :func:`~replay.store.tree.layout_key`
    changes. What varies every step (the step number) goes in as a spliced text. Encoding the
    manifest and its JSON was most of what recording a step cost the training thread (about 35
    of 50 us for a two-tensor batch, several times that right after a backward pass)."""

    def __init__(self) -> None:
        self._key: list[Any] | None = None
        self._pieces: list[str] = []

    def pack(self, tree: Any, splices: Sequence[str] = ()) -> tuple[list[np.ndarray], int]:
        key: list[Any] = []
        buffers: list[np.ndarray | bytes] = []
        if not layout_key(tree, key, buffers):
            return pack_parts(tree, splices)
        if key != self._key:
            manifest, buffers = encode(tree)
            self._key, self._pieces = key, manifest_text(manifest).split(SPLICE_MARK)
        return _parts(self._pieces, splices, buffers)


@dataclass(frozen=True)
class RingSpec:
    slots: int
    chunk: int  # bytes per arena chunk (one chunk row per slot)
    capacity: int  # initial bytes per slot; grows on demand


def _spans(slots: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs ``[a, b)`` of sorted slots."""
    out: list[tuple[int, int]] = []
    for s in slots:
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], s + 1)
        else:
            out.append((s, s + 1))
    return out


def _contiguous(payload: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """A payload as one array (the writer process hands over arrays: no copy there)."""
    return payload if isinstance(payload, np.ndarray) else np.concatenate(payload)


def _round_up(n: int, k: int) -> int:
    return max(k, -(-n // k) * k)


class StoreWriter:
    """Owns the open HDF5 file of one recording."""

    def __init__(
        self,
        path: str,
        *,
        run_id: str,
        meta: dict[str, Any],
        sources: dict[str, str],
        steps: RingSpec,
        snapshots: RingSpec,
        health_slots: int,
        watched: tuple[str, ...] = (),
    ) -> None:
        self.path = path
        self.health_columns = HEALTH_COLUMNS + object_columns(watched)
        # Before anything is created: another live writer of this path keeps its file.
        with self._locked(meta):
            ncols = len(self.health_columns)
            # Readers refuse larger rings (validate.LIMITS): never write a file they would refuse.
            for what, n, most in (
                ("step slots (reach)", steps.slots, LIMITS["ring_slots"]),
                ("snapshot slots (the tiers of reach)", snapshots.slots, LIMITS["ring_slots"]),
                ("health slots (keep_health)", health_slots, LIMITS["health_slots"]),
                ("health values", health_slots * ncols * 8, LIMITS["health_bytes"]),
                ("health columns", ncols, LIMITS["health_columns"]),
            ):
                if not 1 <= n <= most:
                    raise ValueError(f"{n} {what}: the format allows 1..{most}")
            # Checked under the lock, right before the name is replaced: a device or a FIFO at
            # the recording's path is refused, never replaced (as root, /dev/full was). The file
            # is made as RUN.h5.creating (a link planted there is an error; one a killed writer
            # left is stale, as we hold the lock) and appears complete, never half-created.
            with (
                replace_whole(path, "the recording path", tmp=f"{path}.creating") as raw,
                h5py.File(raw, "w", libver="latest") as f,
            ):
                f.attrs["format"] = FORMAT_NAME
                f.attrs["format_version"] = FORMAT_VERSION
                f.attrs["run_id"] = run_id
                f.attrs["created"] = time.time()
                g = f.create_group("meta")
                g.attrs["encoding-type"], g.attrs["encoding-version"] = META_ENCODING
                g.create_dataset("run", data=json_blob(meta))
                g.create_dataset("sources", data=json_blob(sources))
                self._rings = {
                    "steps": self._create_ring(f, "steps", steps),
                    "snapshots": self._create_ring(f, "snapshots", snapshots),
                }
                h = f.create_group("health")
                h.attrs["encoding-type"], h.attrs["encoding-version"] = HEALTH_ENCODING
                h.attrs["columns"] = json.dumps(list(self.health_columns))
                h.attrs["slots"] = health_slots
                # Fill values instead of data: chunks are allocated as the ring fills, so a short
                # run makes a small file; the bound is the same.
                hs = h.create_dataset(
                    "step",
                    shape=(health_slots,),
                    dtype=np.int64,
                    fillvalue=-1,
                    chunks=(min(health_slots, 8192),),
                )
                hv = h.create_dataset(
                    "values",
                    shape=(health_slots, ncols),
                    dtype=np.float64,
                    fillvalue=np.nan,
                    chunks=(min(health_slots, 1024), ncols),
                )
                hc = h.create_dataset(
                    "crc", shape=(health_slots,), dtype=np.int64, chunks=(min(health_slots, 8192),)
                )
                hs[0] = -1  # written once before SWMR starts
                hv[0, 0] = np.nan
                hc[0] = 0
                st = f.create_dataset("status", data=np.array([0, -1, 0, 0], np.int64))
                st.attrs["fields"] = json.dumps(list(STATUS_FIELDS))
                # (written at close)
                f.create_dataset("ended", data=np.zeros(ENDED_BYTES, np.uint8))
                f.flush()
            self._open(path, known=False)

    @classmethod
    def reopen(cls, path: str) -> StoreWriter:
        """Go on writing a recording whose writer died (``kill -9``), under its lock: its
        status flags cleared (``h5clear.py``), its markers, lengths and status read back. Slots
        the dead writer had invalidated and not rewritten stay invalid."""
        self = cls.__new__(cls)
        self.path = path
        with self._locked({}):
            refuse_non_regular(path)
            clear_status_flags(path)
            self._open(path, known=True)
        return self

    @contextlib.contextmanager
    def _locked(self, meta: dict[str, Any]) -> Iterator[None]:
        """Hold the path's lock (``_take_lock``) from here on; an error on the way drops it."""
        self._lock = _take_lock(self.path, meta)
        try:
            yield
        except BaseException:
            self.drop_lock()
            raise

    def _open(self, path: str, *, known: bool) -> None:
        """Open the file for SWMR writing; ``known``: it was written before (``reopen``), so
        read what this writer keeps in memory back from it."""
        self.f = h5py.File(path, "r+", libver="latest")
        self.f.swmr_mode = True
        health_slots = int(self.f["health"].attrs["slots"])
        # Handles are opened once: no temporaries are created (or released) during a commit,
        # which matters when a commit fails half-way (see BackgroundWriter._abandon).
        self._ring_ds = {
            ring: {k: self.f[ring][k] for k in ("step", "nbytes", "mlen", "crc", "arena")}
            for ring in ("steps", "snapshots")
        }
        self._ring_slots = {ring: int(self.f[ring].attrs["slots"]) for ring in self._ring_ds}
        self._markers = {r: np.full(n, -1, np.int64) for r, n in self._ring_slots.items()}
        self._lengths = {
            r: tuple(np.zeros(n, np.int64) for _ in range(3)) for r, n in self._ring_slots.items()
        }
        self._hmarkers = np.full(health_slots, -1, np.int64)
        self._status = self.f["status"]
        self._hstep = self.f["health/step"]
        self._hvals = self.f["health/values"]
        self._hcrc = self.f["health/crc"]
        self._hcrcs = np.zeros(health_slots, np.int64)
        self.health_slots = health_slots
        # The columns the file was made with (a run's watched objects add their own).
        self.health_columns = tuple(json.loads(self.f["health"].attrs["columns"]))
        self._pad: dict[int, np.ndarray] = {}
        self.status = np.array([0, -1, 0, 0], np.int64)
        if known:
            for ring, ds in self._ring_ds.items():
                self._markers[ring][:] = ds["step"][:]
                for i, k in enumerate(("nbytes", "mlen", "crc")):
                    self._lengths[ring][i][:] = ds[k][:]
            self._hmarkers[:] = self._hstep[:]
            self._hcrcs[:] = self._hcrc[:]
            self.status[:] = self._status[:]
            self.status[0] = 0
            self._status[:] = self.status  # not closed cleanly (any more)
            self.f.flush()

    @staticmethod
    def _create_ring(f: h5py.File, name: str, spec: RingSpec) -> str:
        g = f.create_group(name)
        g.attrs["encoding-type"], g.attrs["encoding-version"] = RING_ENCODING
        g.attrs["slots"] = spec.slots
        g.create_dataset("step", data=np.full(spec.slots, -1, np.int64))
        for k in ("nbytes", "mlen", "crc"):
            g.create_dataset(k, data=np.zeros(spec.slots, np.int64))
        cap = _round_up(spec.capacity, spec.chunk)
        arena = g.create_dataset(
            "arena",
            shape=(spec.slots, cap),
            maxshape=(spec.slots, None),
            dtype=np.uint8,
            chunks=(1, spec.chunk),
            fillvalue=0,
        )
        arena[0, :1] = 0  # written once before SWMR starts: an early reader fails otherwise
        return name

    # -- committing ---------------------------------------------------------------------------

    def commit(
        self,
        *,
        steps: Sequence[StepFrame] = (),
        snapshots: Sequence[SnapshotFrame] = (),
        health: Sequence[HealthFrame] = (),
        last_step: int | None = None,
    ) -> None:
        """Durably write a group of items. Each payload here is one contiguous uint8 array;
        a health row is a float64 vector in ``HEALTH_COLUMNS`` order.

        A group of a fast loop holds many more steps than the ring has slots: only the newest
        item of each slot is written (the others would be overwritten within this group, never
        seen). Each commit invalidates the slots it rewrites until its last flush, so a group is
        written in parts: first the snapshots going to empty slots; then one step alone, with
        its snapshot (``_anchor``), and every health row; then the steps going to empty slots,
        then those that replace older ones, in two halves; each other snapshot alone, as soon
        as its step is in the ring; the status last. At every moment of a commit, ``kill -9``
        included, the ring still holds whole steps and a snapshot to replay them from (one
        group rewriting every slot at once left none: a killed writer's file had no step)."""
        n_steps, n_snaps = len(steps), len(snapshots)
        nsteps = self._ring_slots["steps"]
        steps = sorted({s.step % nsteps: s for s in steps}.values(), key=lambda s: s.step)
        snaps = sorted({s.slot: s for s in snapshots}.values(), key=lambda s: s.step)
        markers = self._markers["steps"]
        smarkers = self._markers["snapshots"]
        # A snapshot going to an empty slot displaces nothing: it goes first, before the steps
        # it anchors (after them, a kill between the two commits of a run's first group left
        # steps in the ring and no snapshot to replay them from).
        empty = [s for s in snaps if smarkers[s.slot] < 0]
        parts: list[tuple[list[StepFrame], list[SnapshotFrame]]] = [([], [s]) for s in empty]
        # Then one snapshot of a step the group holds, and that step alone: two commits that
        # displace one old step and one old snapshot, chosen so that the old ring keeps a
        # snapshot of one of its steps meanwhile; from then on the new snapshot anchors the
        # group's steps, whatever they overwrite. (Without it, a group of 251 steps kept its
        # last 60, which do not line up with the old ring: their first half overwrote its
        # middle, the steps of both of its snapshots included, and a kill left no window.)
        anchor = self._anchor(steps, snaps)
        picked = None
        if anchor is not None:
            first, picked = anchor
            if picked is None or picked in empty:
                parts.append(([first], []))
            else:
                parts += [([first], []), ([], [picked])]
            steps = [s for s in steps if s is not first]
        snaps = [s for s in snaps if s is not picked and s not in empty]
        fresh = [s for s in steps if markers[s.step % nsteps] < 0]
        rest = [s for s in steps if markers[s.step % nsteps] >= 0]
        half = max(1, len(rest) // 2) if len(rest) > nsteps // 4 else len(rest)
        for part in (fresh, rest[:half], rest[half:]):
            if part:
                parts.append((part, []))
                present = set(markers[markers >= 0].tolist()) | {s.step for s in part}
                ready = [s for s in snaps if s.step in present]
                snaps = [s for s in snaps if s.step not in present]
                parts += [([], [snap]) for snap in ready]
        parts += [([], [snap]) for snap in snaps]  # (their steps are still to come)
        parts = parts or [([], [])]
        for i, (part, snap_part) in enumerate(parts):
            final = i == len(parts) - 1
            self._commit(
                steps=part,
                snapshots=snap_part,
                health=health if i == 0 else (),
                last_step=last_step if final else None,
                counts=(n_steps, n_snaps) if final else (0, 0),
            )

    def _anchor(
        self, steps: list[StepFrame], snaps: list[SnapshotFrame]
    ) -> tuple[StepFrame, SnapshotFrame | None] | None:
        """A step of ``steps`` to write alone, with its snapshot from ``snaps`` (None: one the
        file holds), that leaves the ring a snapshot of one of its steps while both are written,
        if it has one now; the first such in step order (else the first at all)."""
        nsteps = self._ring_slots["steps"]
        markers, smarkers = self._markers["steps"], self._markers["snapshots"]
        held = {s.step: s for s in steps}
        kept = {int(st) for st in smarkers if st >= 0}
        candidates: list[tuple[StepFrame, SnapshotFrame | None]] = sorted(
            [(held[st], None) for st in kept if st in held]
            + [(held[s.step], s) for s in snaps if s.step in held],
            key=lambda c: c[0].step,
        )
        if not candidates:  # (most groups of a slow loop: one step, no snapshot)
            return None
        # the snapshots the file holds whose step it holds too (a few slots, not the ring)
        old = {st for st in kept if markers[st % nsteps] == st}
        for step, snap in candidates:
            gone = {int(markers[step.step % nsteps])}
            if snap is not None:
                gone.add(int(smarkers[snap.slot]))
            if not old or old - gone:
                return step, snap
        return candidates[0]

    def _commit(
        self,
        *,
        steps: Sequence[StepFrame],
        snapshots: Sequence[SnapshotFrame],
        health: Sequence[HealthFrame],
        last_step: int | None,
        counts: tuple[int, int],
    ) -> None:
        """One group, under the commit protocol: invalidate, payloads, markers (a flush each)."""
        f = self.f
        nslots = self._ring_slots
        ring_items: list[tuple[str, int, int, np.ndarray, int]] = [
            ("steps", s.step % nslots["steps"], s.step, _contiguous(s.payload), s.mlen)
            for s in steps
        ]
        ring_items += [
            ("snapshots", s.slot, s.step, _contiguous(s.payload), s.mlen) for s in snapshots
        ]
        hitems = [(h.step % self.health_slots, h.step, h.row) for h in health]
        touched = {ring: sorted({it[1] for it in ring_items if it[0] == ring}) for ring in nslots}
        hslots = sorted({slot for slot, _, _ in hitems})
        # Every small HDF5 write costs ~0.2 ms of CPU here whatever its size, so markers and
        # lengths are kept in memory and written as spans: a handful of calls per commit.
        # 1. invalidate
        for ring, slots in touched.items():
            self._markers[ring][slots] = -1
            self._write_spans(self._ring_ds[ring]["step"], self._markers[ring], slots)
        self._hmarkers[hslots] = -1
        self._write_spans(self._hstep, self._hmarkers, hslots)
        f.flush()
        # 2. payloads (in order: when a group rewrites a slot, the newest item wins)
        for ring, slot, step, payload, mlen in ring_items:
            arena = self._ring_ds[ring]["arena"]
            if payload.size > arena.shape[1]:
                chunk = arena.chunks[1]
                arena.resize(
                    (arena.shape[0], _round_up(max(payload.size, 2 * arena.shape[1]), chunk))
                )
            self._write_row(arena, slot, payload)
            self._lengths[ring][0][slot] = payload.size
            self._lengths[ring][1][slot] = mlen
            self._lengths[ring][2][slot] = slot_crc(step, payload)
        for ring, slots in touched.items():
            for k, values in zip(("nbytes", "mlen", "crc"), self._lengths[ring]):
                self._write_spans(self._ring_ds[ring][k], values, slots)
        if hitems:
            latest = {slot: (step, row) for slot, step, row in hitems}
            block = np.stack([latest[s][1] for s in hslots])
            for i, slot in enumerate(hslots):
                self._hcrcs[slot] = health_crc(latest[slot][0], block[i])
            self._write_spans(self._hcrc, self._hcrcs, hslots)
            i = 0
            for a, b in _spans(hslots):
                self._hvals[a:b] = block[i : i + b - a]
                i += b - a
        f.flush()
        # 3. markers: the health rows' first, in a flush of their own. Written in one flush
        # with the steps', a kill during that flush could leave steps in the ring without
        # their health rows (a group kill's file had steps 0..211 and rows only to 72): the
        # library writes its cached chunks in no order we choose. A row without its step is
        # what any ring holds anyway.
        if hitems:
            for slot, step, _ in hitems:
                self._hmarkers[slot] = step
            self._write_spans(self._hstep, self._hmarkers, hslots)
            if ring_items:
                f.flush()
        for ring, slot, step, *_ in ring_items:
            self._markers[ring][slot] = step
        for ring, slots in touched.items():
            self._write_spans(self._ring_ds[ring]["step"], self._markers[ring], slots)
        if last_step is not None:
            self.status[1] = max(self.status[1], last_step)
        self.status[2:4] += counts  # steps_total, snapshots_total
        self._status[:] = self.status
        f.flush()

    def _write_row(self, arena: Any, slot: int, payload: np.ndarray) -> None:
        """The payload into arena row ``slot``, chunk by chunk, past HDF5's chunk cache.

        A slice assignment costs ~200 us of CPU for a 146 KB step, direct chunk writes ~60 us
        (the dataset has no filters, so a chunk's bytes are its data). The last, partial chunk
        is padded with zeros; the bytes past ``nbytes`` are not part of the payload.
        """
        chunk = arena.chunks[1]
        n = payload.size
        dsid = arena.id
        full = n // chunk
        for c in range(full):
            dsid.write_direct_chunk((slot, c * chunk), payload[c * chunk : (c + 1) * chunk])
        rest = n - full * chunk
        if rest:
            pad = self._pad.get(chunk)
            if pad is None:
                pad = self._pad[chunk] = np.zeros(chunk, np.uint8)
            pad[:rest] = payload[full * chunk :]
            pad[rest:] = 0
            dsid.write_direct_chunk((slot, full * chunk), pad)

    @staticmethod
    def _write_spans(ds: Any, values: np.ndarray, slots: list[int]) -> None:
        for a, b in _spans(slots):
            ds[a:b] = values[a:b]

    def mark_draining(self, steps_to_come: int) -> None:
        """Training died without closing: say so in the lock file (``liveness.writer_state``)."""
        if self._lock is None:
            return
        with contextlib.suppress(OSError, ValueError):  # the lock alone still tells a writer lives
            info = lock_info(self._lock)
            info.update(state="draining", steps_to_come=int(steps_to_come), since=time.time())
            blob = json.dumps(info).encode()
            os.pwrite(self._lock, blob, 0)
            os.ftruncate(self._lock, len(blob))

    def drop_lock(self) -> None:
        """A writer that failed leaves its HDF5 file as it is (closing it may crash), and no lock
        file beside it: nobody writes that file after it."""
        if self._lock is None:
            return
        try:  # unlink the lock file while still holding it, then let go (see ``_take_lock``)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path(self.path))
        finally:
            os.close(self._lock)
        self._lock = None

    def close(self, *, clean: bool = True, ended: dict[str, Any] | None = None) -> None:
        """``ended``: how the program ended, when it raised outside any step (``/ended``)."""
        if self.f is None:
            return
        try:
            if ended is not None and "ended" in self.f:  # (files made before it have none)
                text = json_blob(ended)
                if text.size < ENDED_BYTES:  # (the recorder cuts its traceback to fit)
                    self.f["ended"][: text.size] = text
            if clean:
                self.status[0] = 1
                self._status[:] = self.status
                self.f.flush()
        finally:
            try:
                self.f.close()
            finally:
                self.f = None
                self.drop_lock()
