"""A step's health row: the store's float64 columns from what the recorder measured.

Built on the training thread when the step goes straight into the step log (CPU runs), on the
writer thread when it waits there for the GPU's copies; one rule either way.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import torch

from ..store.contracts import check_health_keys
from ..store.layout import COL, HEALTH_COLUMNS

__all__ = ["health_row", "health_values", "host_value", "object_values", "RSS_EVERY"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm: list[int] = []  # an fd kept open: opening /proc each step cost more than the read
#: The process's memory is read at most this often (seconds); a step in between reports the
#: last reading. Reading ``/proc/self/statm`` right after a step's backward cost 15-27 us of a
#: sub-millisecond step's budget (under 1 us when warm); memory moves slower than that.
RSS_EVERY = 0.01
_last_rss = [-math.inf, math.nan]  # (monotonic time, bytes)


def _rss() -> float:
    now = time.monotonic()
    if 0.0 <= now - _last_rss[0] < RSS_EVERY:
        return _last_rss[1]
    try:
        if not _statm:
            _statm.append(os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        value = float(int(os.pread(_statm[0], 128, 0).split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        value = math.nan
    _last_rss[:] = [now, value]
    return value


def host_value(x: Any) -> float:
    """A measured value as a python float (NaN for ``None`` or an empty tensor)."""
    if x is None:
        return math.nan
    if type(x) is float:
        return x
    if isinstance(x, torch.Tensor):
        if x.numel() == 1 and x.device.type == "cpu":
            return float(x.item())  # one call: the training thread builds rows on CPU runs
        return float(x.detach().to("cpu", torch.float64).reshape(-1)[0]) if x.numel() else math.nan
    return float(x)


_checked: set[tuple[str, ...]] = set()  # the name sets already checked (a loop has one or two)

_NCOLS = len(HEALTH_COLUMNS)
_LOSS, _GN, _FP, _SCALE = COL["loss"], COL["grad_norm"], COL["param_fingerprint"], COL["scale"]


def health_values(h: dict[str, Any], watched: tuple[str, ...] = ()) -> list[float]:
    """The row for one step as python floats, in ``HEALTH_COLUMNS`` order; names that are not
    columns (``grad_absmax``, ``param_absmax``, ``scale_after``) only decide the flags. A name
    outside ``HEALTH_KEYS`` raises ``KeyError`` (a misspelt name used to vanish without a trace).

    ``watched``: the objects whose columns (``store.layout.object_columns``) follow, from the
    health's ``<object>__grad_norm``, ``__grad_absmax``, ``__param_fingerprint`` and
    ``__param_absmax`` (see ``capture/watch.py``).

    Plain python, no numpy: on a CPU run the training thread builds the row right after the
    backward, when every call not already in the cache costs several times its warm price."""
    names = tuple(h)
    if names not in _checked:
        check_health_keys(names)
        _checked.add(names)
    nan = math.nan
    row = [nan] * _NCOLS
    for name, value in h.items():
        i = COL.get(name)
        if i is not None:  # else one of HEALTH_INPUTS, read below
            row[i] = value if type(value) is float else host_value(value)  # (most are)
    isfinite = math.isfinite
    if h.get("loss") is not None:  # (a step that returned no loss has no loss to flag)
        row[COL["loss_nonfinite"]] = float(not isfinite(row[_LOSS]))
    # The flags come from the largest |element| when measured: norms overflow while every
    # element is still finite.
    if h.get("grad_absmax") is not None:
        row[COL["grad_nonfinite"]] = float(not isfinite(host_value(h["grad_absmax"])))
    elif h.get("grad_norm") is not None:
        row[COL["grad_nonfinite"]] = float(not isfinite(row[_GN]))
    if h.get("local_grad_norm") is not None:
        row[COL["local_grad_nonfinite"]] = float(not isfinite(row[COL["local_grad_norm"]]))
    if h.get("param_absmax") is not None:
        row[COL["param_nonfinite"]] = float(not isfinite(host_value(h["param_absmax"])))
    elif h.get("param_fingerprint") is not None:  # (None: a model that holds no parameters)
        row[COL["param_nonfinite"]] = float(not isfinite(row[_FP]))
    if "scale_after" in h:
        row[COL["scaler_skipped"]] = float(host_value(h["scale_after"]) < row[_SCALE])
    row[COL["rss"]] = _rss()
    for name in watched:
        row += object_values(h, name)
    return row


def _flag(measured: Any, exact: Any) -> float:
    """The non-finite flag of a norm (``measured``, a float) decided by the largest |element|
    when measured (``exact``), as the run's own flags are."""
    if exact is not None:
        return float(not math.isfinite(host_value(exact)))
    return math.nan if math.isnan(measured) else float(not math.isfinite(measured))


def object_values(h: dict[str, Any], name: str) -> list[float]:
    """One watched object's columns, in ``store.layout.OBJECT_METRICS`` order."""
    gn = h.get(f"{name}__grad_norm")
    fp = h.get(f"{name}__param_fingerprint")
    g, p = host_value(gn), host_value(fp)
    gflag = math.nan if gn is None else _flag(g, h.get(f"{name}__grad_absmax"))
    pflag = math.nan if fp is None else _flag(p, h.get(f"{name}__param_absmax"))
    return [g, gflag, p, pflag]


def health_row(h: dict[str, Any], watched: tuple[str, ...] = ()) -> np.ndarray:
    """:func:`health_values` as the store's float64 row."""
    return np.array(health_values(h, watched), dtype=np.float64)
