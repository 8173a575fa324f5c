"""A one-line progress bar on stderr, drawn only when stderr is a terminal (never in pipes/logs)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, label: str) -> None:
        self.stream: TextIO = sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.label, self.width = label, 30
        self._t0 = time.perf_counter()
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        filled = int(self.width * done / total)
        rate = done / max(time.perf_counter() - self._t0, 1e-9)
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
            f"{done}/{total} steps ({rate:.1f}/s)"
        )
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False
