"""Shared memory between the training process and its writer process: a memfd (Linux), passed
to the child as an inherited descriptor and never named in a filesystem, so nothing is left
behind by a ``kill -9``. The frame ring (``frame_ring.py``) and the step log (``step_log.py``)
are both made here."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

__all__ = ["create_shared"]

T = TypeVar("T")


def create_shared(
    name: str, size: int, attach: Callable[[int], T], *, allocate: bool = False
) -> T | None:
    """``attach(fd)`` over a new memfd of ``size`` bytes, or ``None`` where memfd is missing
    (not Linux) or the memory cannot be had. The descriptor is inheritable on purpose (the
    writer process is given it). ``allocate``: its pages are allocated now, so that a write
    into it can never fail later (a shared page that cannot be allocated is a SIGBUS)."""
    try:
        fd = os.memfd_create(name, 0)
    except (AttributeError, OSError):  # (no os.memfd_create: not Linux)
        return None
    try:
        os.ftruncate(fd, size)
        if allocate:
            os.posix_fallocate(fd, 0, size)
        return attach(fd)
    except (OSError, ValueError):
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
