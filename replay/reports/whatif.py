"""``WhatIfReport``: ``replay whatif --json``, the failing steps replayed as recorded and once
per change (``replay/workflows/whatif.py`` runs them)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..jsonsafe import json_safe
from .divergence import Divergence
from .ranks import MultiRankRun, RankReplay, json_of, ranks_from_json, ranks_json
from .verdict import known

__all__ = ["CHANGES", "Experiment", "StepResult", "WhatIfReport"]

#: The changes ``replay whatif`` takes (its flags without the dashes), each with what its value
#: looks like ("": none): the command, its workflow and the TUI's form read them here.
CHANGES = {
    "set": "KEY=VALUE",
    "scale": "KEY=FACTOR",
    "clip": "MAXNORM",
    "skip-step": "N",
    "drop-samples": "N:3,17",
    "seed": "K",
    "no-autocast": "",
    "dtype": "float32",
}


def _number(x: Any) -> float | None:
    """A number as the JSON holds it back as a float ("nan", "inf", "-inf" included)."""
    if isinstance(x, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(x)
    return x if isinstance(x, (int, float)) else None


@dataclass
class StepResult:
    """One step of an experiment (or of the recording): ``None`` is "not measured"."""

    step: int
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    failed: bool = False
    exception: str | None = None  # the exception type, when the step raised
    skipped: bool = False  # --skip-step: not run
    samples: int | None = None  # --drop-samples: the samples this step ran on

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.samples is None:
            del out["samples"]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepResult:
        numbers = {k: _number(d.get(k)) for k in ("loss", "grad_norm", "lr")}
        return cls(**{**known(cls, d), **numbers})


@dataclass
class Experiment:
    """The steps one change (or none: the baseline) produced."""

    change: str  # "--scale lr=0.1"; "baseline" for the replay as recorded
    steps: list[StepResult] = field(default_factory=list)
    first_failure: int | None = None
    removes_failure: bool = False
    stopped: int | None = None  # the step that raised: nothing after it ran
    param_distance: float | None = None  # ||params - baseline's|| / ||baseline's|| at the end

    def final(self) -> StepResult | None:
        ran = [s for s in self.steps if not s.skipped]
        return ran[-1] if ran else None

    def to_json(self) -> dict[str, Any]:
        last = self.final()
        return {
            "change": self.change,
            "first_failure": self.first_failure,
            "removes_failure": self.removes_failure,
            "stopped": self.stopped,
            "final_step": None if last is None else last.step,
            "final_loss": None if last is None else last.loss,
            "final_grad_norm": None if last is None else last.grad_norm,
            "param_distance": self.param_distance,
            "steps": [s.to_json() for s in self.steps],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Experiment:
        """Read one back (``final_*`` follow from its steps)."""
        steps = [StepResult.from_json(s) for s in d.get("steps") or []]
        distance = _number(d.get("param_distance"))
        return cls(**{**known(cls, d), "steps": steps, "param_distance": distance})


@dataclass
class WhatIfReport:
    """What ``replay whatif`` found; ``to_json()`` is its ``--json`` output, ``from_json()``
    reads it back (the TUI's what-if panel)."""

    recording: str
    window: tuple[int, int]
    snapshot: int  # the replay starts from the snapshot taken before this step
    from_step: int
    to_step: int
    kind: str  # the failure looked for: "nonfinite" or "exception"
    recorded_failure: int | None  # the first failing step the recording shows in the range
    recorded: list[StepResult]
    baseline: Experiment
    reproduces: bool  # the baseline matches the recording bitwise
    divergence: Divergence | None
    experiments: list[Experiment]
    notes: list[str] = field(default_factory=list)
    # A DDP rank set replayed together: each rank's baseline check and what removed its failure
    ranks: dict[str, RankReplay] = field(default_factory=dict)
    multi_rank: MultiRankRun | None = None

    @property
    def helpful(self) -> list[Experiment]:
        """The experiments that removed the failure."""
        return [e for e in self.experiments if e.removes_failure]

    def to_json(self) -> dict[str, Any]:
        out = {
            "recording": self.recording,
            "window": list(self.window),
            "snapshot": self.snapshot,
            "from_step": self.from_step,
            "to_step": self.to_step,
            "kind": self.kind,
            "recorded_failure": self.recorded_failure,
            "baseline_failure": self.baseline.first_failure,
            "reproduces": self.reproduces,
            "divergence": None if self.divergence is None else self.divergence.to_json(),
            "removed_by": [e.change for e in self.helpful],
            "recorded": [s.to_json() for s in self.recorded],
            "baseline": self.baseline.to_json(),
            "experiments": [e.to_json() for e in self.experiments],
            "notes": list(self.notes),
        }
        if self.ranks:
            out["ranks"] = ranks_json(self.ranks)
            out["multi_rank"] = json_of(self.multi_rank)
        safe: dict[str, Any] = json_safe(out)
        return safe

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WhatIfReport:
        """Read one back (``baseline_failure`` and ``removed_by`` follow from the experiments)."""
        typed = {
            "window": (int(d["window"][0]), int(d["window"][1])),
            "recorded": [StepResult.from_json(s) for s in d.get("recorded") or []],
            "baseline": Experiment.from_json(d["baseline"]),
            "divergence": Divergence.from_json(d.get("divergence")),
            "experiments": [Experiment.from_json(e) for e in d.get("experiments") or []],
        }
        return cls(**known(cls, {**d, **ranks_from_json(d), **typed}))  # (it has no rank_set)
