"""Recording: capture on the training thread, encode and write on a background thread."""

from __future__ import annotations

from typing import Any

__all__ = ["Recorder"]


def __getattr__(name: str) -> Any:
    # Lazy: ``replay.capture.guard`` (read by ``replay preflight``) must not import torch.
    if name == "Recorder":
        from .recorder import Recorder

        return Recorder
    raise AttributeError(f"module 'replay.record' has no attribute {name!r}")
