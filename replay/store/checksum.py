"""Checksums of ring slots and health rows (format v2): CRC-32 of the step number and the bytes.

The writer stores one with every slot and row, in the same commit as the bytes; the reader
recomputes it on every read, so a flipped byte or a torn copy is reported as damaged instead of
being decoded (bytes past the end of a cut file read back as zeros, which decode fine).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

__all__ = ["slot_crc", "health_crc"]


def slot_crc(step: int, payload: np.ndarray | bytes | memoryview) -> int:
    """A ring slot's checksum: CRC-32 of its step number and its whole payload (the manifest
    and the arena bytes), so a slot labelled with the wrong step fails too."""
    view = payload.data if isinstance(payload, np.ndarray) else memoryview(payload)
    return zlib.crc32(view.cast("B"), zlib.crc32(struct.pack("<q", int(step))))


def health_crc(step: int, row: np.ndarray) -> int:
    """A health row's checksum: CRC-32 of its step number and its float64 values."""
    values = np.ascontiguousarray(row, dtype=np.float64)
    return zlib.crc32(values.data.cast("B"), zlib.crc32(struct.pack("<q", int(step))))
