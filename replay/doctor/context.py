"""What the rules read: the recorded health, snapshots, batches and meta, loaded lazily once.

Everything here is numpy: doctor never imports torch or the user's code (a recording is data).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..store.contracts import ModuleMeta, ParamMeta
from ..store.forensics import ForensicsReader
from ..store.hparams import step_hparams
from ..store.reader import DamagedSlot, Recording
from ..store.tree import iter_leaves
from .arrays import as_array, as_float

__all__ = ["Context", "Snapshot", "per_step_ratio"]


@dataclass(frozen=True)
class Snapshot:
    """One kept snapshot as the rules see it: the floating weights by parameter name, as float64,
    and the optimizer's state dict as recorded (untrusted: ``Context.optimizer_state`` reads it)."""

    step: int
    weights: dict[str, np.ndarray]
    optimizer: Any


class Context:
    """One recording, seen by the rules. Properties are computed on first use and cached."""

    def __init__(self, rec: Recording) -> None:
        self.rec = rec

    # -- health --------------------------------------------------------------------------------

    @cached_property
    def health(self) -> dict[str, np.ndarray]:
        return self.rec.health()

    @cached_property
    def loss(self) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, losses)`` of the steps whose loss is finite."""
        h = self.health
        ok = np.isfinite(h["loss"])
        return h["step"][ok], h["loss"][ok]

    @cached_property
    def grad_norm(self) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, norms)`` of finite gradient norms, AMP-skipped steps excluded (scaled infs)."""
        h = self.health
        ok = np.isfinite(h["grad_norm"]) & (h["scaler_skipped"] != 1)
        return h["step"][ok], h["grad_norm"][ok]

    # -- meta ----------------------------------------------------------------------------------

    @property
    def params(self) -> tuple[ParamMeta, ...]:
        """The parameters, in ``named_parameters()`` order."""
        return self.rec.run_meta.model.params

    @property
    def modules(self) -> tuple[ModuleMeta, ...]:
        """The modules, in ``named_modules()`` order (the order of a step's ``modes``)."""
        return self.rec.run_meta.model.modules

    @cached_property
    def leaf_modules(self) -> list[ModuleMeta]:
        """Modules without children, in registration order (the execution order of a Sequential)."""
        names = [m.name for m in self.modules]
        return [
            m for m in self.modules if m.name and not any(o.startswith(m.name + ".") for o in names)
        ]

    # -- batches -------------------------------------------------------------------------------

    def batch_leaves(self, step: int) -> list[tuple[str, np.ndarray]]:
        """``(path, values)`` of the non-empty array leaves of step ``step``'s recorded batch
        (bfloat16 as float32); none when the step's record is not kept or is damaged."""
        try:
            batch = self.rec.read_step(step)["batch"]
        except (KeyError, DamagedSlot):  # a damaged record counts as missing
            return []
        arrays = ((path, as_array(leaf)) for path, leaf in iter_leaves(batch))
        return [(path, a) for path, a in arrays if a is not None and a.size]

    @cached_property
    def batch_steps(self) -> np.ndarray:
        return self.rec.steps()

    @cached_property
    def n_classes(self) -> int | None:
        """Classes of a classification run: the last Linear's out_features (its last 2-D weight),
        when an integer leaf of the first batch holds labels inside it (else ``None``: not a
        classifier we can recognise)."""
        weights = (p for p in reversed(self.params) if p.name.endswith("weight"))
        c = next((p.shape[0] for p in weights if len(p.shape) == 2), None)
        if c is None or c < 2:
            return None
        s = self.batch_steps
        first = self.batch_leaves(int(s[0])) if s.size else []
        labels = (a for _, a in first if a.dtype.kind in "iu")
        return c if any(a.min() >= 0 and a.max() < c for a in labels) else None

    # -- snapshots -----------------------------------------------------------------------------

    @cached_property
    def snapshots(self) -> list[Snapshot]:
        """Kept snapshots, oldest first (damaged ones skipped)."""
        out: list[Snapshot] = []
        names = {p.name for p in self.params}
        for s in self.rec.snapshot_steps():
            try:
                snap = self.rec.read_snapshot(int(s))
            except (KeyError, DamagedSlot):
                continue
            model = {k: as_float(v) for k, v in (snap.get("model") or {}).items() if k in names}
            weights = {k: a for k, a in model.items() if a is not None}
            out.append(Snapshot(int(s), weights, snap.get("optimizer")))
        return out

    @cached_property
    def update_ratio_table(self) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, ratios)``: per pair of consecutive kept snapshots, the later one's step, and
        ``ratios[param, pair]``, each weight tensor's per-step update ratio between the two
        (``per_step_ratio``; NaN for a tensor under 2-D, reshaped, or not finite in either)."""
        snaps = self.snapshots
        ratios = np.full((len(self.params), max(0, len(snaps) - 1)), np.nan)
        for j, (a, b) in enumerate(zip(snaps, snaps[1:])):
            for i, p in enumerate(self.params):
                w0, w1 = a.weights.get(p.name), b.weights.get(p.name)
                if w0 is None or w1 is None or w0.ndim < 2 or w1.shape != w0.shape:
                    continue
                if np.isfinite(w0).all() and np.isfinite(w1).all():
                    ratios[i, j] = per_step_ratio(w0, w1, b.step - a.step)
        return np.array([s.step for s in snaps[1:]], dtype=np.int64), ratios

    def optimizer_state(self, snap: Snapshot) -> dict[str, Any]:
        """Optimizer state per parameter name (Adam's exp_avg_sq, SGD's momentum_buffer...).

        The state dict numbers parameters in param-group order; they map onto
        ``named_parameters()`` when the optimizer got all of them, or all trainable ones.
        """
        opt = snap.optimizer or {}
        groups = opt.get("param_groups", [])
        # A recording is untrusted input: a state dict of another shape (a custom optimizer's,
        # or a crafted one) means "no per-parameter state", never an exception.
        if not isinstance(groups, list) or not all(
            isinstance(g, dict) and isinstance(g.get("params", []), list) for g in groups
        ):
            return {}
        ids = [i for g in groups for i in g.get("params", [])]
        if not all(isinstance(i, int) for i in ids):
            return {}
        every = [p.name for p in self.params]
        trainable = [p.name for p in self.params if p.requires_grad]
        if len(ids) == len(every):
            names = every
        elif len(ids) == len(trainable):
            names = trainable
        else:
            return {}
        state = opt.get("state", {}) or {}
        if not isinstance(state, dict):
            return {}
        return {n: state.get(i, {}) for i, n in zip(ids, names)}

    @cached_property
    def lr(self) -> float | None:
        """The learning rate of the run's last recorded step (param group 0)."""
        h = self.health
        ok = np.isfinite(h["lr"])
        return float(h["lr"][ok][-1]) if ok.any() else None

    def lr_at(self, steps: list[int]) -> float | None:
        """The learning rate recorded at the first of ``steps`` that has one (a value that was
        used, never a median of a schedule), else the last one recorded before them."""
        h = self.health
        ok = np.isfinite(h["lr"])
        for s in steps:
            hit = ok & (h["step"] == s)
            if hit.any():
                return float(h["lr"][hit][0])
        before = ok & (h["step"] <= (min(steps) if steps else np.inf))
        return float(h["lr"][before][-1]) if before.any() else self.lr

    def lrs_at(self, steps: list[int]) -> dict[str, list[float]]:
        """Every optimizer's learning rate, per param group, at the first of ``steps`` (the
        last recorded step when none is given) whose record is kept: ``{"optimizer": [group
        0's, group 1's], "optD": [...]}``; ``{}`` when none is (``lr`` is group 0's alone)."""
        for s in steps or self.batch_steps[-1:].tolist():
            try:
                groups = step_hparams(self.rec, int(s))
            except (KeyError, DamagedSlot):
                continue
            return {k: [g.get("lr", math.nan) for g in v] for k, v in groups.items() if v}
        return {}

    def modes_at(self, steps: list[int]) -> dict[int, np.ndarray]:
        """``module.training`` per module (``modules`` order) at each kept step of ``steps``."""
        out: dict[int, np.ndarray] = {}
        for s in steps:
            try:
                modes = self.rec.read_step(int(s)).get("modes")
            except (KeyError, DamagedSlot):
                continue
            a = as_array(modes) if modes is not None else None
            if a is not None:
                out[int(s)] = np.asarray(a, dtype=bool).reshape(-1)
        return out

    # -- forensics (optional) ------------------------------------------------------------------

    @cached_property
    def forensics(self) -> ForensicsReader | None:
        """The sidecar's reader when ``RUN.forensics.h5`` exists and is readable, else None."""
        path = self.rec.forensics_path
        if not os.path.exists(path):
            return None
        try:
            return ForensicsReader.open(path)
        except Exception:  # noqa: BLE001 - an unreadable sidecar only costs its evidence
            return None

    def close(self) -> None:
        f = self.__dict__.get("forensics")
        if f is not None:
            f.close()


def per_step_ratio(w0: np.ndarray, w1: np.ndarray, gap: int) -> float:
    """Relative change per step between two snapshots ``gap`` steps apart (a lower bound of the
    per-step update-to-weight ratio: steps in different directions partly cancel)."""
    n0 = float(np.linalg.norm(w0))
    if gap <= 0 or n0 == 0 or not math.isfinite(n0):
        return float("nan")
    return float(np.linalg.norm(w1 - w0)) / n0 / gap
