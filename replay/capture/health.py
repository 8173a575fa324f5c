"""A step's health row: the store's float64 columns from what the recorder measured.

Built on the training thread when the step goes straight into the step log (CPU runs), on the
writer thread when it waits there for the GPU's copies; one rule either way.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch

from ..store.contracts import check_health_keys
from ..store.layout import COL, HEALTH_COLUMNS

__all__ = ["health_row", "host_value"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm: list[int] = []  # an fd kept open: opening /proc each step cost more than the read


def _rss() -> float:
    try:
        if not _statm:
            _statm.append(os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        return float(int(os.pread(_statm[0], 128, 0).split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        return math.nan


def host_value(x: Any) -> float:
    """A measured value as a python float (NaN for ``None`` or an empty tensor)."""
    if x is None:
        return math.nan
    if isinstance(x, torch.Tensor):
        if x.numel() == 1 and x.device.type == "cpu":
            return float(x.item())  # one call: the training thread builds rows on CPU runs
        return float(x.detach().to("cpu", torch.float64).reshape(-1)[0]) if x.numel() else math.nan
    return float(x)


def health_row(h: dict[str, Any]) -> np.ndarray:
    """The row for one step; names that are not columns (``grad_absmax``, ``param_absmax``,
    ``scale_after``) only decide the flags. A name outside ``HEALTH_KEYS`` raises ``KeyError``
    (a misspelt name used to vanish without a trace)."""
    check_health_keys(h)
    row = np.full(len(HEALTH_COLUMNS), np.nan)
    for name, value in h.items():
        if name in COL:  # else one of HEALTH_INPUTS, read below
            row[COL[name]] = host_value(value)
    loss, gn, fp = row[COL["loss"]], row[COL["grad_norm"]], row[COL["param_fingerprint"]]
    if "loss" in h:
        row[COL["loss_nonfinite"]] = float(not math.isfinite(loss))
    # The flags come from the largest |element| when measured: norms overflow while every
    # element is still finite.
    if h.get("grad_absmax") is not None:
        row[COL["grad_nonfinite"]] = float(not math.isfinite(host_value(h["grad_absmax"])))
    elif h.get("grad_norm") is not None:
        row[COL["grad_nonfinite"]] = float(not math.isfinite(gn))
    if h.get("local_grad_norm") is not None:
        row[COL["local_grad_nonfinite"]] = float(not math.isfinite(row[COL["local_grad_norm"]]))
    if h.get("param_absmax") is not None:
        row[COL["param_nonfinite"]] = float(not math.isfinite(host_value(h["param_absmax"])))
    elif "param_fingerprint" in h:
        row[COL["param_nonfinite"]] = float(not math.isfinite(fp))
    if "scale_after" in h:
        before, after = row[COL["scale"]], host_value(h["scale_after"])
        row[COL["scaler_skipped"]] = float(after < before)
    row[COL["rss"]] = _rss()
    return row
