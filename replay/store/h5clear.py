"""Clear an HDF5 file's status flags, as ``h5clear -s`` does, so that a new writer can reopen it.

A file whose SWMR writer was killed keeps "open for writing" in its superblock: HDF5 refuses to
open it for writing again (``locking=False`` does not help; FINDINGS.md). The flags are byte 11
of a version 2 or 3 superblock (what ``libver="latest"`` writes), which ends with a Jenkins
lookup3 checksum of the bytes before it. The writer process that takes over a dead writer's
step log (``writer_process.py``, ``reopen``) clears them, under the recording's lock.
"""

from __future__ import annotations

import os
import struct

__all__ = ["clear_status_flags", "lookup3"]

_M = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' ``hashlittle`` (lookup3), byte by byte, as HDF5's ``H5_checksum_lookup3``.
    ``v`` is ``[a, b, c]``; ``mix`` and ``final`` are written as their rotation tables."""
    length = len(data)
    v = [(0xDEADBEEF + length + initval) & _M] * 3
    k = 0
    while length > 12:
        for i in range(3):
            v[i] = (v[i] + int.from_bytes(data[k + 4 * i : k + 4 * i + 4], "little")) & _M
        for x, r in zip((0, 1, 2, 0, 1, 2), (4, 6, 8, 16, 19, 4)):  # mix: x -= z, ^= rot, z += y
            y, z = (x + 1) % 3, (x + 2) % 3
            v[x] = ((v[x] - v[z]) & _M) ^ _rot(v[z], r)
            v[z] = (v[z] + v[y]) & _M
        length -= 12
        k += 12
    if length == 0:
        return v[2]
    tail = data[k : k + length] + bytes(12 - length)
    for i in range(3):
        v[i] = (v[i] + int.from_bytes(tail[4 * i : 4 * i + 4], "little")) & _M
    for x, r in zip((2, 0, 1, 2, 0, 1, 2), (14, 11, 25, 16, 4, 14, 24)):  # final: x ^= y, -= rot
        y = (x + 2) % 3
        v[x] = ((v[x] ^ v[y]) - _rot(v[y], r)) & _M
    return v[2]


def clear_status_flags(path: str) -> bool:
    """Clear the superblock's status flags in place; ``True`` when they were set. A superblock
    this does not know (not version 2 or 3, or a checksum that does not match) raises
    ``ValueError``: nothing is written then."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    try:
        head = os.pread(fd, 12, 0)
        if len(head) < 12 or head[:8] != b"\x89HDF\r\n\x1a\n" or head[8] not in (2, 3):
            raise ValueError(f"{path}: not an HDF5 file with a version 2 or 3 superblock")
        width = head[9]
        n = 12 + 4 * width  # base, extension, end-of-file and root group addresses
        sb = os.pread(fd, n + 4, 0)
        if len(sb) < n + 4 or struct.unpack_from("<I", sb, n)[0] != lookup3(sb[:n]):
            raise ValueError(f"{path}: its superblock's checksum does not match")
        if sb[11] == 0:
            return False
        fixed = sb[:11] + b"\x00" + sb[12:n]
        os.pwrite(fd, fixed + struct.pack("<I", lookup3(fixed)), 0)
        os.fsync(fd)
        return True
    finally:
        os.close(fd)
