"""State the step reaches that the Recorder does not hold, said while the run trains.

When the step function is first known (at ``Recorder(step_fn=...)``, or at the first
``rec.step`` that hands it), its code is read for the models, optimizers, schedulers and other
``state_dict`` holders it reaches outside ``objects=`` (``capture/suspects.py``). No snapshot holds
them, so a replay from a later snapshot would start with them as the program makes them.

Most are said at once: an optimizer, a scheduler or a GradScaler the step reaches changes at every
step. A module none of whose parameters trains is another matter: a distillation teacher or a
frozen backbone never changes, and a replay that runs the program again makes it as it was. It
is said only if the steps did change it (an EMA written under ``no_grad``): its fingerprint is
taken now and compared once, before the first snapshot after the start is taken (the first a
replay could start from with it changed). Saying it for a frozen teacher taught users to ignore
the warning.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

from ..capture.fingerprint import param_fingerprint
from ..capture.objects import RunObjects
from ..errors import warn_at_user_line

__all__ = ["UnheldState"]


def _fingerprint(obj: object) -> float | None:
    """A module's floating-point (and complex) parameters and buffers in one number (read once
    to the host); ``None`` for anything else."""
    if not isinstance(obj, torch.nn.Module):
        return None
    tensors = [
        t
        for t in itertools.chain(obj.parameters(), obj.buffers())
        if t.is_floating_point() or t.is_complex()
    ]
    try:
        fp = param_fingerprint(tensors)
        return float(fp) if fp is not None else None
    except Exception:  # noqa: BLE001 - (a sparse or meta tensor): then it cannot be told
        return None


def _frozen(obj: object) -> bool:
    """A module none of whose parameters trains."""
    return isinstance(obj, torch.nn.Module) and not any(p.requires_grad for p in obj.parameters())


def _changed(now: float | None, then: float) -> bool:
    """``now``: ``None`` when it cannot be told (no module there any more): not said."""
    return now is not None and now != then and not (math.isnan(now) and math.isnan(then))


def _say(described: list[str], why: str = "") -> None:
    if described:
        warn_at_user_line(
            "replay: the step reads state the Recorder does not hold: "
            + ", ".join(described[:6])
            + ("; ..." if len(described) > 6 else "")
            + why
            + "; give it to objects= (no snapshot holds it, so a replay cannot start from one)"
        )


class UnheldState:
    """Says, once, the state a step function reaches that the Recorder does not hold."""

    def __init__(self) -> None:
        # frozen-looking modules to look at again: (what to say, where it is, its fingerprint)
        self._frozen: list[tuple[str, Callable[[], object], float]] = []
        self.look_again_at: int | None = None  # the step before which they are looked at

    def say(self, fn: Callable[..., Any], objects: RunObjects, first_snapshot: int) -> None:
        """Read ``fn``'s code; say now what changes for sure, keep the frozen-looking modules
        until step ``first_snapshot`` (the first snapshot after the start)."""
        from ..capture.suspects import unheld_state

        try:
            found = unheld_state(fn, objects)
            now = []
            for suspect, at in found:
                obj = at()
                fp = _fingerprint(obj) if _frozen(obj) else None
                if fp is None:
                    now.append(suspect.describe())
                else:
                    self._frozen.append((suspect.describe(), at, fp))
        except Exception:  # noqa: BLE001 - naming them helps; it must not stop training
            return
        _say(now)
        if self._frozen:
            self.look_again_at = first_snapshot

    def look_again(self) -> None:
        """The first snapshot after the start is due: the frozen-looking modules the steps
        changed are said now (the others never are)."""
        frozen, self._frozen, self.look_again_at = self._frozen, [], None
        try:
            changed = [d for d, at, fp in frozen if _changed(_fingerprint(at()), fp)]
        except Exception:  # noqa: BLE001 - naming them helps; it must not stop training
            return
        _say(changed, " (its parameters do not train, but the steps changed it)")
