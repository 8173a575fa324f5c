"""Every optimizer's hyper-parameters at a step, as numbers (docs/format.md, ``/steps``:
``hparams``, ``object_hparams``): what ``replay info`` and ``replay export`` show.

Read from the step's record, never run: the run's optimizer is named ``optimizer``, the others
by their names among the run's objects (``netD_opt``); each group's numbers are its ``lr``,
``momentum``, ``weight_decay``..., and each of ``betas`` as ``betas.0``, ``betas.1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .tree import TensorLeaf

if TYPE_CHECKING:
    from .reader import Recording

__all__ = ["Groups", "scalars", "step_hparams"]

#: ``{optimizer name: [{hyper-parameter: value} per param group]}``
Groups = dict[str, list[dict[str, float]]]


def step_hparams(rec: Recording, step: int) -> Groups:
    """Every optimizer's numeric hyper-parameters at ``step``, from its record (``KeyError``
    when the ring no longer holds it). A recording without an optimizer: ``{}``."""
    r = rec.read_step_entries(step, ("hparams", "object_hparams"))
    out: Groups = {}
    if r.get("hparams"):
        out["optimizer"] = scalars(r["hparams"])
    others = r.get("object_hparams")
    if isinstance(others, dict):
        out.update((str(k), scalars(v)) for k, v in others.items())
    return out


def scalars(groups: Any) -> list[dict[str, float]]:
    """Each group's entries that are numbers, as floats (a one-element tensor counts; a flag,
    a string or ``None`` does not)."""
    out: list[dict[str, float]] = []
    for g in groups if isinstance(groups, list) else []:
        row: dict[str, float] = {}
        for k, v in g.items() if isinstance(g, dict) else ():
            if isinstance(v, (list, tuple)):
                for i, x in enumerate(v):
                    if (f := _number(x)) is not None:
                        row[f"{k}.{i}"] = f
            elif (f := _number(v)) is not None:
                row[str(k)] = f
        out.append(row)
    return out


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, TensorLeaf):
        if v.dtype not in ("float64", "float32", "float16", "int64", "int32") or v.data.size != 1:
            return None  # (bfloat16's bytes are a uint16 view)
        return float(v.data.reshape(-1)[0])
    if isinstance(v, (np.ndarray, np.generic)) and np.size(v) == 1 and v.dtype.kind in "fiu":
        return float(np.asarray(v).reshape(-1)[0])
    return None
