"""The HDF5 writer runs in a child process, so no HDF5 failure can ever take training down.

Measured here: after a failed write (``EFBIG``), closing or merely releasing the h5py handle
segfaulted inside the HDF5 library, and parking the handle only moved the crash to interpreter
exit. In a child process such a crash ends recording, never the run. A bonus for durability: when
the training process is killed, the child reads EOF on its input, commits the last complete
message and closes the file properly.

Protocol over the child's stdin (parent -> child): frames of ``u64 header length``, a JSON header,
then ``u64 body length`` and the body bytes. The child answers each frame with one line on stdout:
``ok`` or ``error <message>``. Pickle is not used.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from typing import Any, BinaryIO

import numpy as np

from .writer import RingSpec, StoreWriter

__all__ = ["WriterClient", "WriterError", "WriterDied"]

_U64 = struct.Struct("<Q")


class WriterError(OSError):
    """The writer process reported a failure; the message is its own, one line."""


class WriterDied(WriterError):
    """The writer process stopped answering (it crashed, or was killed)."""


def _write_frame(out: BinaryIO, header: dict[str, Any], parts: list[np.ndarray]) -> None:
    head = json.dumps(header).encode()
    total = sum(p.nbytes for p in parts)
    out.write(_U64.pack(len(head)))
    out.write(head)
    out.write(_U64.pack(total))
    for p in parts:
        out.write(memoryview(np.ascontiguousarray(p)).cast("B"))
    out.flush()


def _read_exact(inp: BinaryIO, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = inp.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _read_frame(inp: BinaryIO) -> tuple[dict[str, Any], bytes] | None:
    raw = _read_exact(inp, 8)
    if raw is None:
        return None
    head = _read_exact(inp, _U64.unpack(raw)[0])
    raw = _read_exact(inp, 8) if head is not None else None
    if head is None or raw is None:
        return None
    body = _read_exact(inp, _U64.unpack(raw)[0])
    if body is None:
        return None  # a frame cut short by the parent's death is not committed
    return json.loads(head), body


class WriterClient:
    """Parent side: same ``commit``/``close`` as :class:`StoreWriter`, in a child process."""

    def __init__(self) -> None:
        """Start the child now; it imports numpy and h5py while training gets going."""
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = pkg_root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "replay.store.writer_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )

    def create(
        self,
        path: str,
        *,
        run_id: str,
        meta: dict[str, Any],
        sources: dict[str, str],
        steps: RingSpec,
        snapshots: RingSpec,
        health_slots: int,
    ) -> WriterClient:
        self._call(
            {
                "op": "create",
                "path": path,
                "run_id": run_id,
                "meta": meta,
                "sources": sources,
                "steps": [steps.slots, steps.chunk, steps.capacity],
                "snapshots": [snapshots.slots, snapshots.chunk, snapshots.capacity],
                "health_slots": health_slots,
            },
            [],
        )
        return self

    def _call(self, header: dict[str, Any], parts: list[np.ndarray]) -> None:
        try:
            _write_frame(self.proc.stdin, header, parts)  # type: ignore[arg-type]
            answer = self.proc.stdout.readline().decode().strip()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, ValueError) as e:
            raise WriterDied(f"the writer process died ({e})") from None
        if answer == "ok":
            return
        if not answer:
            code = self.proc.poll()
            raise WriterDied(f"the writer process died (exit code {code})")
        raise WriterError(answer.removeprefix("error ").strip())

    def commit(self, *, steps=(), snapshots=(), health=(), last_step=None) -> None:  # noqa: ANN001
        parts: list[np.ndarray] = []
        header: dict[str, Any] = {
            "op": "commit",
            "last_step": last_step,
            "steps": [],
            "snapshots": [],
            "health": [],
        }
        for step, payload, mlen in steps:
            header["steps"].append([int(step), int(mlen), int(payload.size)])
            parts.append(payload)
        for slot, step, payload, mlen in snapshots:
            header["snapshots"].append([int(slot), int(step), int(mlen), int(payload.size)])
            parts.append(payload)
        for step, row in health:
            header["health"].append(int(step))
            parts.append(np.asarray(row, dtype=np.float64))
        self._call(header, parts)

    def close(self, *, clean: bool = True) -> None:
        try:
            self._call({"op": "close", "clean": clean}, [])
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _serve(inp: BinaryIO, out: BinaryIO) -> int:
    store: StoreWriter | None = None
    while True:
        frame = _read_frame(inp)
        if frame is None:  # parent gone: keep what is committed, close the file properly
            if store is not None:
                store.close(clean=False)
            return 0
        header, body = frame
        try:
            op = header["op"]
            if op == "create":
                store = StoreWriter(
                    header["path"],
                    run_id=header["run_id"],
                    meta=header["meta"],
                    sources=header["sources"],
                    steps=RingSpec(*header["steps"]),
                    snapshots=RingSpec(*header["snapshots"]),
                    health_slots=header["health_slots"],
                )
            elif op == "commit":
                assert store is not None
                data = np.frombuffer(body, dtype=np.uint8)
                pos = 0
                steps, snaps, health = [], [], []
                for step, mlen, n in header["steps"]:
                    steps.append((step, data[pos : pos + n], mlen))
                    pos += n
                for slot, step, mlen, n in header["snapshots"]:
                    snaps.append((slot, step, data[pos : pos + n], mlen))
                    pos += n
                for step in header["health"]:
                    n = 8 * len(store.health_columns)
                    health.append((step, data[pos : pos + n].view(np.float64)))
                    pos += n
                store.commit(
                    steps=steps, snapshots=snaps, health=health, last_step=header["last_step"]
                )
            elif op == "close":
                if store is not None:
                    store.close(clean=bool(header.get("clean", True)))
                    store = None
                out.write(b"ok\n")
                out.flush()
                return 0
            out.write(b"ok\n")
            out.flush()
        except Exception as e:  # noqa: BLE001 - reported to the parent, which stops recording
            msg = " ".join(f"{type(e).__name__}: {e}".split())
            out.write(f"error {msg}\n".encode())
            out.flush()
            # HDF5 may be in a state where closing crashes: leave without touching it.
            os._exit(1)


def main() -> int:
    # Ctrl-C and a scheduler's SIGTERM reach the whole process group; the parent decides when
    # recording ends (it closes our input), so the child outlives it long enough to commit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return _serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
