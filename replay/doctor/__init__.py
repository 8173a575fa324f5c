"""``replay doctor``: the debugging checklist, run over a recording (numpy + h5py, no torch).

Rules read the recorded health history, snapshots, batches and, when present, the forensics
sidecar, and return findings with a severity, the evidence as numbers and steps, and advice.
One module per rule family; the registry refuses duplicate names.

Example::

    >>> from replay.doctor import diagnose
    >>> for f in diagnose("run.h5"):
    ...     print(f.severity, f.rule, f.title)
"""

from __future__ import annotations

import os
from contextlib import closing

from ..store import open_recording
from . import activations, amp, failures, gradients, inputs, loss, lr, modes, updates  # noqa: F401
from .context import Context
from .registry import RULES, SEVERITIES, Finding, Rule, rule

__all__ = ["diagnose", "Finding", "Rule", "RULES", "rule", "SEVERITIES"]


def diagnose(path: str | os.PathLike[str]) -> list[Finding]:
    """Run every rule on the recording at ``path``; findings sorted by severity, then rule."""
    with open_recording(path) as rec, closing(Context(rec)) as ctx:
        found: list[Finding] = []
        for r in RULES.values():
            out = r.check(ctx)
            if out is not None:
                found.extend([out] if isinstance(out, Finding) else out)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(found, key=lambda f: (order[f.severity], f.rule))
