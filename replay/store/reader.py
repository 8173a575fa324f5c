"""Reading a recording, also one still being written or whose writer was killed (numpy + h5py).

Readers of a live file follow docs/format.md ("Reading"): open with ``swmr=True``, ``refresh()`` every dataset
before reading it, and read each ring slot under a seqlock (marker, payload, marker again) so a
slot being rewritten is skipped, never returned torn.

Example::

    >>> rec = open_recording("run.h5")
    >>> rec.replayable_window()
    (0, 299)
    >>> rec.read_step(42)["batch"]
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import h5py
import numpy as np

from ..errors import RecordingError, first_line
from ..reports.verdict import Ended
from . import validate as V
from .checksum import health_crc, slot_crc
from .contracts import RunMeta
from .layout import (
    ENDED_BYTES,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEALTH_COLUMNS,
    READABLE_VERSIONS,
    STATUS_FIELDS,
    split_object_column,
)
from .liveness import writer_state
from .tree import decode

__all__ = ["Recording", "open_recording", "Window", "sidecar_path", "claimed_size"]

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def sidecar_path(path: str) -> str:
    """Where the forensics of a recording are written: ``run.h5`` -> ``run.forensics.h5``."""
    root, ext = os.path.splitext(path)
    return f"{root}.forensics{ext or '.h5'}"


@dataclass(frozen=True)
class Window:
    """Steps ``first..last`` (inclusive) can be replayed from the snapshot at ``first``."""

    first: int
    last: int
    snapshots: tuple[int, ...]

    def __contains__(self, step: object) -> bool:
        return isinstance(step, (int, np.integer)) and bool(self.first <= step <= self.last)

    def outside(self, what: str) -> str:
        """How a refusal says that ``what`` (``--step 40``) lies outside this window."""
        return f"{what} is outside the replayable window (steps {self.first}..{self.last})"

    def snapshot_for(self, step: int) -> int:
        """The newest snapshot at or before ``step`` inside this window."""
        return max(s for s in self.snapshots if s <= step)

    def from_snapshot(self, step: int) -> Window | None:
        """The part of this window from its oldest snapshot at or after ``step``, or ``None``."""
        later = [s for s in self.snapshots if s >= step]
        return Window(min(later), self.last, tuple(later)) if later else None


def _check_signature(path: str, probe: bool = True) -> None:
    """Refuse what is not an HDF5 file; with ``probe``, also a file that ends before the end its
    superblock claims, unless HDF5 still opens it in time: HDF5 opening a truncated file in SWMR
    mode retries its metadata reads for minutes instead of failing. (One that opens is read, and
    ``replay info`` calls it truncated.)"""
    V.check_regular_file(path)  # before any open: a FIFO would block, a device never end
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as e:
        raise RecordingError(f"{path}: cannot be read ({e.strerror})") from None
    if head != _HDF5_SIGNATURE:
        raise RecordingError(
            f"{path}: not an HDF5 file, so not a replay recording "
            "(recordings are written by replay.Recorder)"
        )
    size, claimed = (claimed_size(path) if probe else None) or (0, 0)  # (0, 0): not checked
    if claimed > size and not _opens_in_time(path):
        raise RecordingError(
            f"{path}: the file is truncated ({size} of {claimed} bytes: the copy is "
            "incomplete, or the writer died before its first flush); it cannot be opened"
        )


def claimed_size(path: str) -> tuple[int, int] | None:
    """``(size, claimed)``: the file's real size and the end the HDF5 superblock claims for it
    (its base plus end-of-file address), or ``None`` where the superblock says nothing we read.

    Superblock versions 2 and 3 (what ``libver="latest"`` writes): signature, version, offset
    size, length size, flags, then base, extension, EOF addresses.
    """
    with open(path, "rb") as fh:
        sb = fh.read(48)
        size = os.fstat(fh.fileno()).st_size
    if len(sb) < 12 or sb[8] not in (2, 3):
        return None
    width = sb[9]
    if width not in (4, 8) or len(sb) < 12 + 3 * width:
        return None
    fmt = "<I" if width == 4 else "<Q"
    base = struct.unpack_from(fmt, sb, 12)[0]
    eof = struct.unpack_from(fmt, sb, 12 + 2 * width)[0]
    return size, int(base + eof)


def _opens_in_time(path: str, timeout: float = 10.0) -> bool:
    """Whether HDF5 can open a file that ends early, probed in a child that can be killed.

    A recording whose disk filled up ends early yet opens (everything it flushed is readable);
    a cut copy makes HDF5 retry for minutes. Only files that end early pay for this probe.
    """
    # Every read whose metadata may lie past the end: the status, health and markers, and each
    # record's manifest (its arena row's chunk index). A damaged record is not a hang: its
    # RecordingError is left to the real read; only a probe that does not finish refuses the file.
    code = (
        "import sys\n"
        "sys.path[0:1] = [sys.argv.pop(2)]  # this replay, whatever the working directory holds\n"
        "from replay.errors import RecordingError\n"
        "from replay.store import reader as r\n"
        "rec = r.Recording(sys.argv[1], probe=False)\n"
        "rec.status(); rec.health()\n"
        "for ring, steps in (('steps', rec.steps()), ('snapshots', rec.snapshot_steps())):\n"
        "    for s in steps:\n"
        "        try:\n"
        "            rec._read_manifest(ring, int(s))\n"
        "        except (KeyError, RecordingError):\n"
        "            pass\n"
        "rec.close()"
    )
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, path, pkg_root],
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0 or b"RecordingError" in proc.stderr


# Metadata read attempts of a SWMR reader. HDF5 retries a metadata block whose checksum fails
# (a live writer may be mid-flush), 100 times by default, with a growing wait between the later
# attempts: a file with one flipped byte in its metadata kept `replay info` busy for minutes
# (measured here: 20 attempts fail in 6 ms, 40 did not finish in 120 s). 16 quick attempts still
# cover a writer's flush; the reader's own seqlock retries cover the rest.
SWMR_READ_ATTEMPTS = 16


@functools.lru_cache(maxsize=1)
def _hdf5_library() -> ctypes.CDLL | None:
    """The libhdf5 that h5py loaded (from ``/proc/self/maps``), for the one setting h5py does
    not expose (``H5Pset_metadata_read_attempts``); ``None`` where it cannot be found."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "libhdf5" in line}
    except OSError:
        return None
    for p in sorted(paths):
        if not re.fullmatch(r"libhdf5(-[0-9a-f]+)?\.so[.0-9]*", os.path.basename(p)):
            continue
        try:
            lib = ctypes.CDLL(p)
            fn = lib.H5Pset_metadata_read_attempts
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
        return lib
    return None


def _open_swmr(path: str) -> h5py.File:
    """``h5py.File(path, "r", swmr=True)`` with at most ``SWMR_READ_ATTEMPTS`` metadata reads."""
    lib = _hdf5_library()
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_EARLIEST, h5py.h5f.LIBVER_LATEST)
    if lib is None or lib.H5Pset_metadata_read_attempts(fapl.id, SWMR_READ_ATTEMPTS) < 0:
        return h5py.File(path, "r", swmr=True)
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl=fapl)
    return h5py.File(fid)


# A writer holds HDF5's own file lock from the moment it opens the new file until it has turned
# SWMR on (``StoreWriter._open``: milliseconds); a reader arriving then waits this long for it.
LOCK_WAIT_S = 5.0


def _open_h5(path: str, probe: bool = True) -> h5py.File:
    """``_check_signature``, then ``_open_swmr``, waiting up to ``LOCK_WAIT_S`` while HDF5's file
    lock is held."""
    _check_signature(path, probe)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return _open_swmr(path)
        except BlockingIOError as e:
            if time.monotonic() >= deadline:
                raise RecordingError(
                    f"{path}: another process holds it open for writing and has not let readers "
                    f"in for {LOCK_WAIT_S:g} s ({first_line(e)})"
                ) from None
            time.sleep(0.02)
        except OSError as e:
            msg = str(e)
            with contextlib.suppress(OSError):  # files not written in SWMR mode open normally
                return h5py.File(path, "r")
            if "truncated" in msg or "addr overflow" in msg or "eof" in msg.lower():
                raise RecordingError(
                    f"{path}: the file is truncated (its writer died before the first flush, or "
                    "the copy is incomplete); nothing in it can be recovered"
                ) from None
            raise RecordingError(f"{path}: HDF5 cannot open it ({first_line(e)})") from None


class _SharedFile:
    """One open ``h5py.File`` of a recording and its dataset handles, shared by every
    :class:`Recording` of that file in this process.

    Measured with HDF5 2.0 / h5py 3.16: with one SWMR file opened twice in a process, a
    ``refresh()`` of a dataset that both opened makes *both* read the first chunk's data in place
    of every chunk never written (health markers of a short run turned from 11 steps into 143,
    step 0 showing up at slot 8192). The TUI did that on every refresh of a rank set (its own
    rank's file open, the set read again). One file and one handle per dataset avoids it.
    """

    def __init__(self, key: tuple[int, int], f: h5py.File) -> None:
        self.key, self.f = key, f
        self.handles: dict[str, h5py.Dataset] = {}
        self.checked: set[str] = set()
        self.users = 0


_SHARED: dict[tuple[int, int], _SharedFile] = {}
_SHARED_LOCK = threading.Lock()


def _acquire(path: str, probe: bool) -> _SharedFile:
    st = V.check_regular_file(path)
    key = (st.st_dev, st.st_ino)
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None or not shared.f.id.valid:
            shared = _SHARED[key] = _SharedFile(key, _open_h5(path, probe))
        shared.users += 1
        return shared


def _release(shared: _SharedFile) -> None:
    with _SHARED_LOCK:
        shared.users -= 1
        if shared.users > 0:
            return
        if _SHARED.get(shared.key) is shared:
            del _SHARED[shared.key]
        shared.handles.clear()
        shared.f.close()


class Recording:
    """Read-only view of one recording. Cheap to open; reads on demand.

    The file is untrusted input (``validate.py``): its layout is checked when it is opened, and
    every later read is checked again before anything is allocated (a live file changes under
    the reader). A violation is a :class:`RecordingError` naming the dataset.
    """

    def __init__(self, path: str, *, probe: bool = True, health_only: bool = False) -> None:
        self.path = path  # as given: what messages name
        # Where it is: a replay runs the recorded program in its recorded working directory,
        # where a relative path names another file (another run.h5, or none)
        self.file = os.path.abspath(path)
        # health_only: the step and snapshot rings are not checked, so not read (a scan of a
        # thousand rank files reads health, status and meta alone: open_health)
        self.health_only = health_only
        self._shared: _SharedFile | None = _acquire(path, probe)
        self.f = self._shared.f
        self._checked = self._shared.checked
        self._handles = self._shared.handles
        self._live = self.f.mode == "r" and self.f.swmr_mode
        self._damaged: tuple[bytes, list[int]] | None = None
        self.damaged_health: set[int] = set()  # health rows dropped for a checksum mismatch
        try:
            self._validate()
            self.meta: dict[str, Any] = self._blob("meta/run")
            V.check_meta(
                self.meta,
                self.path,
                slots={
                    "step_slots": self._slots["steps"],
                    # v3 keeps snapshots in tiers (store/retention.py): keep_snapshots is the
                    # dense tier's count, snapshot_slots the ring's
                    "snapshot_slots" if self.format_version >= 3 else "keep_snapshots": (
                        self._slots["snapshots"]
                    ),
                    "health_slots": self._slots["health"],
                },
            )
        except BaseException:
            self.close()
            raise
        # what pin() read of a live file, served from memory from then on
        self._pinned: dict[tuple[str, int], dict[str, Any]] = {}
        self._pinned_devices: dict[int, dict[str, str]] = {}
        self._pinned_window: Window | None = None

    # -- validation --------------------------------------------------------------------------

    def _validate(self) -> None:
        """The layout of docs/format.md: attributes, groups, every dataset's dtype, rank and
        shape, and the ring and health sizes against each other."""
        f, where = self.f, self.path
        if V.attr_str(f, "format", where, required=False) != FORMAT_NAME:
            raise RecordingError(
                f"{self.path}: an HDF5 file, but not a replay recording "
                f"(no format attribute {FORMAT_NAME!r})"
            )
        version = V.attr_int(f, "format_version", where, lo=-(2**62), hi=2**62)
        if version > FORMAT_VERSION:
            raise RecordingError(
                f"{self.path}: written by a newer replay (format version {version}; this replay "
                f"reads up to {FORMAT_VERSION}). Upgrade: pip install -U torch-replay"
            )
        if version not in READABLE_VERSIONS:
            raise RecordingError(
                f"{self.path}: format version {version} is no longer readable; "
                f"open it with the torch-replay release that wrote it"
            )
        self.format_version = version
        for required in ("meta/run", "steps/step", "snapshots/step", "health/values", "status"):
            V.resolve(f, required, where)  # hard links only; says which one is missing
        self.run_id = V.attr_str(f, "run_id", where) or ""
        self.created = V.attr_float(f, "created", where)
        self._slots: dict[str, int] = {}
        for ring in ("steps", "snapshots"):
            g = V.resolve(f, ring, where)
            self._slots[ring] = V.attr_int(g, "slots", where, lo=1, hi=V.LIMITS["ring_slots"])
        g = V.resolve(f, "health", where)
        hslots = V.attr_int(g, "slots", where, lo=1, hi=V.LIMITS["health_slots"])
        self._slots["health"] = hslots
        columns = V.attr_json(g, "columns", where)
        if (
            not isinstance(columns, list)
            or not 0 < len(columns) <= V.LIMITS["health_columns"]
            or not all(isinstance(c, str) for c in columns)
            or len(set(columns)) != len(columns)
        ):
            raise RecordingError(f"{where}: /health columns is not a list of distinct names")
        self._columns: list[str] = columns
        if hslots * len(columns) * 8 > V.LIMITS["health_bytes"]:
            raise RecordingError(
                f"{where}: /health/values claims {hslots} x {len(columns)} values "
                f"(at most {V.LIMITS['health_bytes']} bytes are read)"
            )
        fields = V.attr_json(V.resolve(f, "status", where), "fields", where)
        if (
            not isinstance(fields, list)
            or not len(STATUS_FIELDS) <= len(fields) <= V.LIMITS["status_fields"]
            or not all(isinstance(x, str) for x in fields)
            or not set(STATUS_FIELDS) <= set(fields)
        ):
            raise RecordingError(
                f"{where}: /status fields are not a list holding {', '.join(STATUS_FIELDS)}"
            )
        self._fields: list[str] = fields
        # name -> (dtype, rank, shape); None: any length along that axis
        spec: dict[str, tuple[str, int, tuple[int | None, ...]]] = {}
        for ring in ("steps", "snapshots"):
            n = self._slots[ring]
            for k in ("step", "nbytes", "mlen"):
                spec[f"{ring}/{k}"] = ("<i8", 1, (n,))
            spec[f"{ring}/arena"] = ("|u1", 2, (n, None))
            if "crc" in f[ring]:  # format v2: slot checksums
                spec[f"{ring}/crc"] = ("<i8", 1, (n,))
        if "crc" in f["health"]:
            spec["health/crc"] = ("<i8", 1, (hslots,))
        spec["health/step"] = ("<i8", 1, (hslots,))
        spec["health/values"] = ("<f8", 2, (hslots, len(columns)))
        spec["status"] = ("<i8", 1, (len(fields),))
        if "ended" in f:  # (files made before it have none)
            spec["ended"] = ("|u1", 1, (ENDED_BYTES,))
        self._spec = spec
        rings = () if self.health_only else ("steps", "snapshots")
        for name in spec:
            if name.split("/")[0] not in ("steps", "snapshots") or rings:
                self._ds(name)
        for ring in rings:
            arena = self.f[f"{ring}/arena"]
            if arena.chunks is None or arena.chunks[0] != 1:
                raise RecordingError(f"{where}: /{ring}/arena is not chunked by slot")
        self.status()
        for ring in (*rings, "health"):  # checked again on every later read
            self._markers(ring)

    # -- small helpers ----------------------------------------------------------------------

    def _ds(self, name: str) -> h5py.Dataset:
        """A dataset of the layout, checked (links, storage, dtype once; shape every time)."""
        if self.health_only and name.split("/")[0] in ("steps", "snapshots"):
            raise RecordingError(f"{self.path}: opened for its health only, /{name} is not read")
        dtype, ndim, shape = self._spec[name]
        ds = self._handles.get(name)
        if ds is None:  # links, storage and dtype: once (they cannot change under a reader)
            ds = V.dataset(self.f, name, self.path, dtype=dtype, ndim=ndim, checked=self._checked)
            self._handles[name] = ds
        if self._live:
            ds.refresh()  # a live arena grows: its shape is checked after the refresh
        have = ds.shape
        if any(want is not None and want != got for want, got in zip(shape, have)):
            V.dataset(self.f, name, self.path, dtype=dtype, ndim=ndim, shape=shape)  # raises
        return ds

    def _read(self, name: str, sel: Any = ()) -> Any:
        """``ds[sel]`` of a checked dataset; HDF5 failures (a damaged chunk) become one line."""
        ds = self._ds(name)
        try:
            return ds[sel]
        except (*V.H5_ERRORS, IndexError) as e:
            raise RecordingError(f"{self.path}: /{name} cannot be read ({first_line(e)})") from None

    def _blob(self, name: str) -> Any:
        return V.read_json_blob(self.f, name, self.path, self._checked)

    def close(self) -> None:
        """Idempotent; the file closes when its last ``Recording`` in this process does."""
        shared, self._shared = self._shared, None
        if shared is not None:
            _release(shared)

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metadata ----------------------------------------------------------------------------

    @functools.cached_property
    def sources(self) -> dict[str, str]:
        """Source text of the entry points' files, as recorded (never read from disk)."""
        sources: dict[str, str] = self._blob("meta/sources")
        V.check_sources(sources, self.path)
        return sources

    @functools.cached_property
    def run_meta(self) -> RunMeta:
        """``/meta/run`` as a typed object (``meta`` is its JSON, as written)."""
        return RunMeta.from_json(self.meta)

    @property
    def config(self) -> dict[str, Any]:
        return self.meta.get("config") or {}

    @property
    def entry(self) -> dict[str, Any]:
        return self.meta.get("entry") or {}

    @property
    def program(self) -> dict[str, Any] | None:
        """How to run the recorded program again (re-entry), or ``None``."""
        p = self.meta.get("program")
        return p if isinstance(p, dict) else None

    @property
    def env(self) -> dict[str, Any]:
        return self.meta.get("env") or {}

    def status(self) -> dict[str, int]:
        values = self._read("status")
        out = dict(zip(self._fields, (int(v) for v in values)))
        closed, last = out["closed"], out["last_step"]
        if closed not in (0, 1) or not -1 <= last <= V.MAX_STEP:
            raise RecordingError(
                f"{self.path}: /status holds closed={closed}, last_step={last}: not a status"
            )
        for key in ("steps_total", "snapshots_total"):
            if not 0 <= out[key] <= V.MAX_STEP:
                raise RecordingError(f"{self.path}: /status {key} is {out[key]}")
        return out

    def ended(self) -> Ended | None:
        """How the program ended when it raised outside any step (``None``: it did not, or the
        file is older than ``/ended``)."""
        if "ended" not in self._spec:
            return None
        raw = bytes(self._read("ended")).split(b"\0", 1)[0]
        try:
            ended = Ended.from_json(V.parse_json(raw, f"{self.path}: /ended")) if raw else None
        except RecordingError:
            return None
        # "killed" is inferred by ending() from a file left unclosed, never written (format.md)
        return None if ended is None or ended.kind == "killed" else ended

    def ending(self) -> Ended | None:
        """How the program ended outside any step: :meth:`ended`; else, for a file never
        closed that no process writes any more, a kill no exception announced
        (:meth:`Ended.killed`, with the memory the process held). ``None``: neither."""
        ended = self.ended()
        if ended is None and not self.closed_cleanly and writer_state(self.path) is None:
            return Ended.killed(self.health_rows())
        return ended

    @property
    def closed_cleanly(self) -> bool:
        return bool(self.status()["closed"])

    # -- rings -----------------------------------------------------------------------------

    def _markers(self, ring: str) -> np.ndarray:
        markers: np.ndarray = self._read(f"{ring}/step")
        V.check_markers(markers, self.path, f"{ring}/step", modulo=ring != "snapshots")
        return markers

    def _slot_or_raise(self, ring: str, step: int) -> int:
        hits = np.flatnonzero(self._markers(ring) == step)
        if not hits.size:
            raise KeyError(f"step {step} is not in the {ring} ring of {self.path}")
        return int(hits[0])

    def _marker(self, ring: str, slot: int) -> int:
        return int(self._read(f"{ring}/step", slot))

    def _lengths(self, ring: str, step: int, slot: int) -> tuple[int, int] | None:
        """``(nbytes, mlen)`` of a slot, checked against its arena row: ``None`` when the slot
        was rewritten meanwhile (the caller retries), an error when it is simply wrong."""
        n = int(self._read(f"{ring}/nbytes", slot))
        mlen = int(self._read(f"{ring}/mlen", slot))
        width = self._ds(f"{ring}/arena").shape[1]
        if 0 <= mlen <= n <= width:
            return n, mlen
        if self._marker(ring, slot) != step:
            return None
        raise RecordingError(
            f"{self.path}: /{ring} slot {slot} (step {step}) claims {n} bytes with a "
            f"{mlen}-byte manifest in a {width}-byte arena row"
        )

    def _payload(self, ring: str, slot: int, n: int) -> np.ndarray:
        V.check_payload_stored(self._ds(f"{ring}/arena"), n, self.file, f"{ring}/arena")
        return cast("np.ndarray", self._read(f"{ring}/arena", np.s_[slot, :n]))

    def _manifest(self, ring: str, step: int, raw: bytes, arena_bytes: int) -> dict[str, Any]:
        where = f"{self.path}: /{ring} step {step}"
        manifest = V.parse_json(raw, where, max_depth=0)  # check_tree bounds the depth
        V.check_tree(manifest, arena_bytes, where)  # raises unless every node is an object
        return cast("dict[str, Any]", manifest)

    def _read_slot(self, ring: str, step: int, retries: int = 20) -> Any:
        for _ in range(retries):
            slot = self._slot_or_raise(ring, step)
            lengths = self._lengths(ring, step, slot)
            if lengths is None:
                continue
            n, mlen = lengths
            payload = self._payload(ring, slot, n)
            crc = int(self._read(f"{ring}/crc", slot)) if f"{ring}/crc" in self._spec else None
            if self._marker(ring, slot) != step:  # rewritten while we read: retry
                continue
            if crc is not None and slot_crc(step, payload) != crc:
                raise DamagedSlot(
                    f"{self.path}: /{ring} slot {slot} (step {step}) is damaged: its bytes do not "
                    "match their checksum, so it is treated as missing and never replayed"
                )
            manifest = self._manifest(ring, step, payload[:mlen].tobytes(), n - mlen)
            return decode(manifest, payload[mlen:].tobytes())
        raise KeyError(f"step {step} of the {ring} ring kept changing while being read")

    def _read_manifest(self, ring: str, step: int) -> dict[str, Any]:
        slot = self._slot_or_raise(ring, step)
        lengths = self._lengths(ring, step, slot)
        raw = b"" if lengths is None else self._payload(ring, slot, lengths[1]).tobytes()
        if lengths is None or self._marker(ring, slot) != step:
            raise KeyError(f"step {step} of the {ring} ring was rewritten while being read")
        n, mlen = lengths
        return self._manifest(ring, step, raw, n - mlen)

    def damaged_steps(self) -> list[int]:
        """Steps whose record in ``/steps`` fails its checksum, ascending (empty for format v1,
        which has none). Reads every kept step record: the ring's size, not the run's."""
        if "steps/crc" not in self._spec:
            return []
        markers = self._markers("steps")
        key = markers.tobytes()
        if self._damaged is not None and self._damaged[0] == key:
            return self._damaged[1]
        # The lengths, checksums and stored size read once, not per slot: a ring of 15,000 steps
        # took 9 s slot by slot (the stored size walks the arena's chunk index each time).
        crcs, nbytes, mlens = (self._read(f"steps/{k}") for k in ("crc", "nbytes", "mlen"))
        arena = self._ds("steps/arena")
        width = arena.shape[1]
        try:
            stored = V.bytes_stored(arena, self.file, "steps/arena")
        except RecordingError:  # its index unreadable (a cut copy): no record can be trusted
            stored = -1
        bad, suspect = [], []
        for slot in np.flatnonzero(markers >= 0):
            step, n, mlen = int(markers[slot]), int(nbytes[slot]), int(mlens[slot])
            if not 0 <= mlen <= n <= min(width, stored):  # lengths that break the format
                suspect.append((int(slot), step))
                continue
            try:
                payload = arena[slot, :n]
            except V.H5_ERRORS:
                suspect.append((int(slot), step))
                continue
            if slot_crc(step, payload) != int(crcs[slot]):
                suspect.append((int(slot), step))
        if suspect:  # a live file's slot rewritten meanwhile is judged at its next read
            again = self._markers("steps")
            bad = [step for slot, step in suspect if int(again[slot]) == step]
        bad.sort()
        self._damaged = (key, bad)
        return bad

    def steps(self) -> np.ndarray:
        """Steps whose record (RNG states, batch, hyper-parameters) is in the ring, ascending."""
        m = self._markers("steps")
        return np.sort(m[m >= 0])

    def snapshot_steps(self) -> np.ndarray:
        """Steps before which a model/optimizer snapshot was taken, ascending."""
        m = self._markers("snapshots")
        return np.sort(m[m >= 0])

    def read_step(self, step: int) -> dict[str, Any]:
        """The record of ``step``: ``rng``, ``hparams``, ``modes``, ``batch``, ``exception``."""
        return self._pinned.get(("steps", step)) or self._record("steps", step)

    def read_step_entries(self, step: int, keys: tuple[str, ...]) -> dict[str, Any]:
        """Those entries of ``step``'s record that it has, decoded from its manifest alone
        when none holds a buffer (the hyper-parameters: no batch read); from the whole record
        otherwise (a tensor ``lr``)."""
        pinned = self._pinned.get(("steps", step))
        root = {} if pinned is not None else self._read_manifest("steps", step)
        found = {
            k["v"]: v
            for k, v in zip(root.get("k", []), root.get("v", []))
            if k.get("t") == "str" and k.get("v") in keys
        }
        if pinned is not None or any("off" in n for v in found.values() for n in _nodes(v)):
            record = self.read_step(step)
            return {k: record[k] for k in keys if k in record}
        return {k: decode(v, b"") for k, v in found.items()}

    def read_snapshot(self, step: int) -> dict[str, Any]:
        """State before ``step``: ``model``, ``optimizer``, ``scheduler``, ``scaler`` trees."""
        return self._pinned.get(("snapshots", step)) or self._record("snapshots", step)

    def pin(self, steps: int, start: int | None = None) -> Window | None:
        """Read the first ``steps`` steps of the replayable window, with the snapshots they
        start from, and serve them (and that window) from memory from now on. ``start``: the
        steps from the oldest kept snapshot at or after that step instead (``None`` when the
        window holds none yet).

        A live run's ring moves on while a replay of it starts (the self-check re-runs the
        program for seconds first): what was committed when it was opened is what it replays.
        A slot overwritten while it is read is read again from the window as it is then.
        """
        for _ in range(20):
            w = self.replayable_window()
            if w is not None and start is not None:
                w = w.from_snapshot(start)
            if w is None:
                return None
            last = min(w.last, w.first + max(1, steps) - 1)
            pinned = Window(w.first, last, tuple(s for s in w.snapshots if s <= last))
            try:
                records = {("snapshots", s): self._record("snapshots", s) for s in pinned.snapshots}
                devices = {s: self.snapshot_devices(s) for s in pinned.snapshots}
                for t in range(pinned.first, pinned.last + 1):
                    records[("steps", t)] = self._record("steps", t)
            except (KeyError, DamagedSlot):  # the ring moved on: take the window as it is now
                continue
            self._pinned.update(records)
            self._pinned_devices.update(devices)
            self._pinned_window = pinned
            return pinned
        raise RecordingError(f"{self.path}: its ring moves on faster than it can be read")

    def _record(self, ring: str, step: int) -> dict[str, Any]:
        record: dict[str, Any] = self._read_slot(ring, step)
        V.check_record(record, ring, step, self.path)
        return record

    def snapshot_devices(self, step: int) -> dict[str, str]:
        """Where the tensors of each part of a snapshot lived (``{"model": "cuda:0", ...}``: its
        first tensor's, breadth first), read from its manifest alone (kilobytes, not the whole
        snapshot)."""
        if step in self._pinned_devices:
            return dict(self._pinned_devices[step])
        root = self._read_manifest("snapshots", step)
        return {
            k["v"]: next(
                (str(n.get("device", "cpu")) for n in _nodes(v) if n.get("t") == "tensor"), "cpu"
            )
            for k, v in zip(root.get("k", []), root.get("v", []))
            if k.get("t") == "str"
        }

    # -- health ----------------------------------------------------------------------------

    def health(self) -> dict[str, np.ndarray]:
        """Per-step metrics sorted by step: ``{"step": int64[n], column: float64[n], ...}``."""
        steps = self._markers("health")
        values = self._read("health/values")
        again = self._markers("health")
        ok = (steps >= 0) & (steps == again)  # seqlock: drop rows rewritten while we read
        if "health/crc" in self._spec:  # a row whose values fail their checksum is dropped
            crcs = self._read("health/crc")
            for row in np.flatnonzero(ok):
                if health_crc(int(steps[row]), values[row]) != int(crcs[row]):
                    ok[row] = False
                    self.damaged_health.add(int(steps[row]))
        rows = np.flatnonzero(ok)
        rows = rows[np.argsort(steps[rows], kind="stable")]
        out = {"step": steps[rows]}
        vals = values[rows]  # one copy: the file may hold up to LIMITS["health_slots"] rows
        del values
        # Columns by the names stored in the file: files written before a column was appended
        # lack it, and it reads as NaN ("not measured").
        have = {name: i for i, name in enumerate(self.health_columns)}
        for name in HEALTH_COLUMNS:
            i = have.get(name)
            out[name] = vals[:, i] if i is not None else np.full(len(vals), np.nan)
        # Then each watched object's columns (netG__grad_norm, ...), as the file names them.
        for name in self.object_columns:
            out[name] = vals[:, have[name]]
        return out

    def health_rows(self) -> list[dict[str, Any]]:
        """The health as rows, one dict per step: ``step`` plus every column (what the bisect
        criteria read)."""
        h = self.health()
        cols = [k for k in h if k != "step"]
        return [
            {"step": int(s), **{c: float(h[c][i]) for c in cols}} for i, s in enumerate(h["step"])
        ]

    @property
    def object_columns(self) -> list[str]:
        """The watched objects' health columns this file holds (``store.layout``'s
        ``object_columns``; none in a run with one model and one optimizer)."""
        return [c for c in self._columns if split_object_column(c) is not None]

    @property
    def watched_objects(self) -> list[str]:
        """The names of the objects with their own health columns, in the file's order."""
        split = (split_object_column(c) for c in self._columns)
        return list(dict.fromkeys(s[0] for s in split if s is not None))

    @property
    def health_columns(self) -> list[str]:
        """The health column names this file holds, in its own order."""
        return list(self._columns)

    def first_bad(self) -> dict[str, int | None]:
        """First step whose health shows a failure, by kind (``None`` when there is none)."""
        h = self.health()

        def first(mask: np.ndarray) -> int | None:
            idx = np.flatnonzero(mask)
            return int(h["step"][idx[0]]) if idx.size else None

        skipped = h["scaler_skipped"] == 1
        nonfinite = (h["loss_nonfinite"] == 1) | (h["param_nonfinite"] == 1)
        nonfinite |= (h["grad_nonfinite"] == 1) & ~skipped
        for name in self.watched_objects:  # any watched object going bad is a failure
            nonfinite |= h[f"{name}__param_nonfinite"] == 1
            nonfinite |= (h[f"{name}__grad_nonfinite"] == 1) & ~skipped
        return {"nonfinite": first(nonfinite), "exception": first(h["raised"] == 1)}

    def first_failure(self) -> int | None:
        """The first step whose health shows a failure of either kind (where ``bisect`` with no
        kind looks), ``None`` when there is none."""
        return min((s for s in self.first_bad().values() if s is not None), default=None)

    # -- replayability -------------------------------------------------------------------------

    def reach(self) -> dict[str, Any]:
        """How far back the recorder keeps steps replayable: ``tiers`` (``[every, span]``, span
        0: as far as the step ring reaches), ``step_slots``, ``snapshot_slots`` and ``reach``
        (every step of the last ``reach`` stays replayable). Files before v3 kept one tier."""
        r = self.meta.get("reach")
        if isinstance(r, dict):
            return dict(r)
        every = int(self.config.get("snapshot_every") or 1)
        slots = self._slots["snapshots"]
        return {
            "tiers": [[every, 0]],
            "step_slots": self._slots["steps"],
            "snapshot_slots": slots,
            "reach": max(1, every * (slots - 1) + 1),
        }

    def replayable_window(self) -> Window | None:
        """The widest run of consecutive recorded steps that starts at a kept snapshot.

        Step ``t`` is replayable when a snapshot at ``s <= t`` is kept and every step of
        ``[s, t]`` has its record. ``None`` when no step is replayable.
        """
        if self._pinned_window is not None:
            return self._pinned_window
        steps = self.steps()
        snaps = [int(s) for s in self.snapshot_steps()]
        if steps.size == 0 or not snaps:
            return None
        # A damaged step record is missing: the window stops before it (or starts after it).
        present = set(int(s) for s in steps) - set(self.damaged_steps())
        best: Window | None = None
        for s in snaps:
            if s not in present or (best is not None and s in best):
                continue
            end = s
            while end + 1 in present:
                end += 1
            inside = tuple(x for x in snaps if s <= x <= end)
            if best is None or end > best.last or (end == best.last and s < best.first):
                best = Window(s, end, inside)
        return best

    # -- forensics ---------------------------------------------------------------------------

    @property
    def forensics_path(self) -> str:
        """Where the sidecar is (absolute: a replay runs in the recorded directory)."""
        return sidecar_path(self.file)

    @property
    def forensics_name(self) -> str:
        """The sidecar as the user names it: beside the recording's path as given."""
        return sidecar_path(self.path)


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A manifest node and every node inside it (its keys' and values'), breadth first. The
    strings in the lists of a complex number (its parts) and an object (its attribute names)
    are not nodes."""
    queue: list[Any] = [node]
    for n in queue:
        if isinstance(n, dict):
            yield n
            for kids in (n.get("k"), n.get("v")):
                if isinstance(kids, list):
                    queue.extend(kids)


class DamagedSlot(RecordingError):
    """A ring slot whose bytes do not match their checksum (a flipped byte, a bad copy)."""


def open_recording(path: str | os.PathLike[str], *, health_only: bool = False) -> Recording:
    """Open a recording for reading; raises :class:`RecordingError` with a one-line reason.

    ``health_only``: check and read only its metadata, status and health (not the step and
    snapshot rings): what scanning a thousand rank files needs, at a fraction of the cost.
    """
    path = os.fspath(path)
    try:
        return Recording(path, health_only=health_only)
    except RecordingError:
        raise
    except V.H5_ERRORS as e:
        raise RecordingError(f"{path}: unreadable recording ({first_line(e)})") from None
