"""Turning a :class:`Verdict` or a :class:`WindowCheck` into the report the commands print
(``replay.reports``: ``BisectReport``, ``VerifyReport``; ``replay/cli/render.py`` words them
for a person)."""

from __future__ import annotations

from ..jsonsafe import json_safe
from ..reports import BisectReport, DivergenceCause, VerifiedStep, VerifyReport
from ..reports.verdict import exception_info
from .search import Verdict
from .verify import WindowCheck

__all__ = ["bisect_report", "verify_report"]


def bisect_report(v: Verdict, *, recording: str, entry_files: list[str]) -> BisectReport:
    """The bisector's verdict as a report; the trace and the divergence's cause come later."""
    row = v.culprit_row or {}
    return BisectReport(
        healthy=v.healthy,
        kind=v.kind,
        criterion=v.criterion,
        first_bad_step=v.first_bad_step,
        symptom_step=v.symptom_step,
        exception=exception_info(v.exception),
        deterministic=v.deterministic,
        reproducible=v.reproducible,
        divergence=json_safe(v.divergence) if v.divergence else None,
        replayed_steps=v.replayed_steps,
        rechecked_steps=v.rechecked_steps,
        snapshot=v.snapshot,
        snapshots_checked=v.snapshots_checked,
        device=v.device,
        window=list(v.window),
        checked=list(v.checked) if v.checked else None,
        loss=json_safe(row.get("loss")) if row else None,
        grad_norm=json_safe(row.get("grad_norm")) if row else None,
        notes=list(v.notes),
        recording=recording,
        entry_files=list(entry_files),
    )


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
        first_divergence=json_safe(r.first_divergence) if r.first_divergence else None,
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
