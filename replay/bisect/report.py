"""Turning a :class:`Verdict` or a :class:`VerifyReport` into the JSON every report is built
from (``replay/cli/render.py`` words it for a person)."""

from __future__ import annotations

from typing import Any

from ..jsonsafe import json_safe
from .search import Verdict
from .verify import VerifyReport

__all__ = ["verdict_json", "verify_json", "TRACE_FIELDS"]

# Filled by the per-op tracer when it runs; null until then (docs/forensics.md, /verdict).
TRACE_FIELDS = (
    "cause",
    "op_index",
    "op",
    "phase",
    "module",
    "source",
    "made",
    "made_from",
    "nan_from_inf",
    "data",
    "samples",
    "samples_exact",
    "sample_axes",
    "closure",
    "surfaced",
)


_num = json_safe  # (one rule for every report: replay/jsonsafe.py)


def _exc(e: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if e is None else {"type": e.get("type"), "message": e.get("message")}


def verdict_json(v: Verdict, **extra: Any) -> dict[str, Any]:
    row = v.culprit_row or {}
    out: dict[str, Any] = {
        "healthy": v.healthy,
        "kind": v.kind,
        "criterion": v.criterion,
        "first_bad_step": v.first_bad_step,
        "symptom_step": v.symptom_step,
        "exception": _exc(v.exception),
        "deterministic": v.deterministic,
        "reproducible": v.reproducible,
        "divergence": {k: _num(x) for k, x in v.divergence.items()} if v.divergence else None,
        "replayed_steps": v.replayed_steps,
        "rechecked_steps": v.rechecked_steps,
        "snapshot": v.snapshot,
        "snapshots_checked": v.snapshots_checked,
        "device": v.device,
        "window": list(v.window),
        "checked": list(v.checked) if v.checked else None,
        "loss": _num(row.get("loss")) if row else None,
        "grad_norm": _num(row.get("grad_norm")) if row else None,
        **{k: None for k in TRACE_FIELDS},
        "forensics": None,
        "notes": list(v.notes),
        "divergence_cause": None,  # why the replay differs from the recording (engine/why.py)
    }
    trace_notes = extra.pop("trace_notes", None) or []
    out.update(extra)
    out["notes"] += [n for n in trace_notes if n not in out["notes"]]
    return out


def _cause_json(c: dict[str, Any] | None) -> dict[str, Any] | None:
    if c is None:
        return None
    out = dict(c)
    if out.get("differs"):
        out["differs"] = [{**d, "max_abs_diff": _num(d.get("max_abs_diff"))} for d in c["differs"]]
    return out


def verify_json(r: VerifyReport, **extra: Any) -> dict[str, Any]:
    out = {
        "deterministic": r.deterministic,
        "window": list(r.window),
        "device": r.device,
        "replayed_steps": r.replayed_steps,
        "first_divergence": (
            {k: _num(x) for k, x in r.first_divergence.items()} if r.first_divergence else None
        ),
        "steps": [
            {
                "step": s["step"],
                "match": s["divergence"] is None,
                "compared": s["compared"],
                "loss": _num(s["replayed"]["loss"]),
                "recorded_loss": _num(s["recorded"]["loss"]) if s["recorded"] else None,
                "param_fingerprint": _num(s["replayed"]["param_fingerprint"]),
                "recorded_param_fingerprint": (
                    _num(s["recorded"]["param_fingerprint"]) if s["recorded"] else None
                ),
                "exception": _exc(s["exception"]),
            }
            for s in r.steps
        ],
        "cause": _cause_json(r.cause),
    }
    out.update(extra)
    return out
