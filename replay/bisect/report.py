"""Turning a :class:`WindowCheck` into the report the commands print (``replay.reports``:
``VerifyReport``; the search makes its ``BisectReport`` itself; ``replay/cli/render.py`` words them
for a person)."""

from __future__ import annotations

from ..jsonsafe import json_safe
from ..reports import DivergenceCause, VerifiedStep, VerifyReport
from ..reports.verdict import exception_info
from .verify import WindowCheck

__all__ = ["verify_report"]


def verify_report(
    r: WindowCheck,
    *,
    recording: str,
    entry_files: list[str],
    cause: DivergenceCause | None = None,
) -> VerifyReport:
    """The window's bitwise check as a report; ``cause``: why its first divergence happened."""
    return VerifyReport(
        deterministic=r.deterministic,
        window=list(r.window),
        device=r.device,
        replayed_steps=r.replayed_steps,
        first_divergence=r.first_divergence,
        steps=[
            VerifiedStep(
                step=s["step"],
                match=s["divergence"] is None,
                compared=s["compared"],
                loss=json_safe(s["replayed"]["loss"]),
                recorded_loss=json_safe(s["recorded"]["loss"]) if s["recorded"] else None,
                param_fingerprint=json_safe(s["replayed"]["param_fingerprint"]),
                recorded_param_fingerprint=(
                    json_safe(s["recorded"]["param_fingerprint"]) if s["recorded"] else None
                ),
                exception=exception_info(s["exception"]),
            )
            for s in r.steps
        ],
        cause=cause,
        recording=recording,
        entry_files=list(entry_files),
    )
