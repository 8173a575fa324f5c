"""Filtering the op table by phase, module and op name, with numpy over whole id columns.

The expression is words: ``phase:backward`` (or ``fw``/``bw``/``opt``), ``module:net.head`` (the
module and everything inside it), ``op:log`` or a bare word (a substring of the op name).

Example::

    f = OpFilter.parse("phase:bw module:net.fc1 mm")
    rows = f.rows(columns, strings)     # ascending op indices
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["OpFilter", "PHASE_NAMES"]

PHASE_NAMES = {"forward": 0, "fw": 0, "backward": 1, "bw": 1, "optimizer": 2, "opt": 2, "other": 3}
_PHASE_LABEL = ("forward", "backward", "optimizer", "other")


@dataclass(frozen=True)
class OpFilter:
    phase: int | None = None
    module: str | None = None
    name: str | None = None

    @classmethod
    def parse(cls, text: str) -> OpFilter:
        """Raises ``ValueError`` with a readable reason on an unknown phase or key."""
        phase = module = name = None
        for word in text.split():
            key, _, value = word.partition(":")
            if not _:
                name = word
            elif key in ("phase", "p"):
                if value not in PHASE_NAMES:
                    raise ValueError(f"unknown phase {value!r}: forward, backward, optimizer")
                phase = PHASE_NAMES[value]
            elif key in ("module", "m"):
                module = "" if value in ("", "root") else value
            elif key in ("op", "name"):
                name = value
            else:
                raise ValueError(f"unknown filter {key!r}: use phase:, module:, op:")
        return cls(phase, module, name)

    @property
    def active(self) -> bool:
        return self.phase is not None or self.module is not None or bool(self.name)

    def describe(self) -> str:
        parts = (
            f"phase:{_PHASE_LABEL[self.phase]}" if self.phase is not None else "",
            f"module:{self.module or 'root'}" if self.module is not None else "",
            f"op:{self.name}" if self.name else "",
        )
        return " ".join(p for p in parts if p)

    def rows(self, columns: dict[str, np.ndarray], strings: dict[str, list[str]]) -> np.ndarray:
        """Op indices passing the filter, from whole ``phase``/``module``/``name`` columns."""
        mask = np.ones(len(columns["phase"]), dtype=bool)
        if self.phase is not None:
            mask &= columns["phase"] == self.phase
        if self.module is not None:
            ids = [
                i
                for i, m in enumerate(strings["modules"])
                if self.module == "" or m == self.module or m.startswith(self.module + ".")
            ]
            mask &= np.isin(columns["module"], np.asarray(ids, dtype=np.int64))
        if self.name:
            needle = self.name.lower()
            ids = [i for i, s in enumerate(strings["ops"]) if needle in s.lower()]
            mask &= np.isin(columns["name"], np.asarray(ids, dtype=np.int64))
        return np.flatnonzero(mask)
