"""Bitwise comparison of a replayed health row with the recorded one (pure python)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

from ..errors import ReplayError
from ..reports.divergence import Divergence

__all__ = [
    "same_bits",
    "compare_rows",
    "with_exception_type",
    "compare_replays",
    "VERIFIED_COLUMNS",
    "HINT_RAISED",
    "HINT_OUTSIDE",
    "HINT_CARRIED",
    "HINT_NONDET",
    "HINT_OR_CARRIED",
]

# The columns a replay must reproduce bit for bit: replay is verified, never assumed.
VERIFIED_COLUMNS = ("loss", "param_fingerprint")

# What to change, for each reason a replay can differ (replay/workflows/why.py tells them apart).
HINT_RAISED = (
    "the step depends on state that neither its batch nor the objects the Recorder holds bring "
    "(a global the training loop sets or fills between steps, an object build_fn does not "
    "return): pass it through rec.step(batch, name=value), or give it to the Recorder as a "
    "named object (objects=..., or returned by build_fn)"
)
HINT_OUTSIDE = (
    "something outside step_fn changes what the step reads: give the Recorder every stateful "
    "object (objects=..., or from build_fn), and pass values the loop computes (a learning "
    "rate, a curriculum knob) through rec.step(batch, name=value) instead of a global"
)
HINT_CARRIED = (
    "the step reads state the program keeps outside the objects the Recorder was given (a "
    "batch an earlier step prefetched into a global, a counter, a cache): a replay carried on "
    "from an earlier step rebuilds it, one from a snapshot cannot. Hand it to the step "
    "through rec.step(batch, name=value), or keep it in an object given in objects=..."
)
HINT_OR_CARRIED = (
    "or the step changes state that it reads on its next run and that no snapshot holds (a "
    "batch it prefetches into a global, a counter): hand that to the step through "
    "rec.step(batch, name=value)"
)
HINT_NONDET = (
    "the same inputs gave different bits: look for non-deterministic kernels "
    "(torch.use_deterministic_algorithms(True)), code that depends on thread timing or "
    "uninitialised memory, or a flaky device"
)


def same_bits(a: float | None, b: float | None) -> bool:
    """Equal as float64 bit patterns; any NaN equals any NaN (NaN payloads carry no meaning)."""
    a = math.nan if a is None else float(a)
    b = math.nan if b is None else float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return struct.pack("<d", a) == struct.pack("<d", b)


def _ulps(a: float, b: float) -> int | None:
    """How many representable values apart ``a`` and ``b`` are: float32's when both are
    float32 values (a float32 loss, kept as float64 in the health row: one float32 ulp is 2**29
    float64 ones), else float64's."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return None
    f32 = _is_float32(a) and _is_float32(b)
    fmt, ifmt, mask = ("<f", "<i", 0x7FFFFFFF) if f32 else ("<d", "<q", 0x7FFFFFFFFFFFFFFF)

    def key(x: float) -> int:
        i: int = struct.unpack(ifmt, struct.pack(fmt, x))[0]
        return i if i >= 0 else -(i & mask)

    return abs(key(a) - key(b))


def _is_float32(x: float) -> bool:
    try:
        return bool(struct.unpack("<f", struct.pack("<f", x))[0] == x)
    except OverflowError:  # beyond float32's range
        return False


def compare_rows(recorded: dict[str, Any] | None, replayed: dict[str, Any]) -> Divergence | None:
    """``None`` when the replayed step matches the recording, else what differs and by how much.

    A step that raised matches when the replay raised the same exception type.
    """
    if recorded is None:
        return None  # nothing recorded to compare with (health row rolled out)
    step = int(replayed["step"])
    rec_raised = recorded.get("raised") == 1.0
    rep_exc = replayed.get("exception")
    if rec_raised or rep_exc is not None:
        want = recorded.get("exception_type")
        got = rep_exc.get("type") if rep_exc else None
        if rec_raised != (rep_exc is not None) or (want and got != want):
            return Divergence(step, "exception", want if rec_raised else None, got)
        return None
    # The watched objects' fingerprints too (netG__param_fingerprint: capture/watch.py).
    watched = [c for c in recorded if c.endswith("__param_fingerprint") and c in replayed]
    for col in (*VERIFIED_COLUMNS, *watched):
        flag = recorded.get(col.removesuffix("param_fingerprint") + "param_nonfinite")
        if col.endswith("param_fingerprint") and (flag is None or math.isnan(float(flag))):
            continue  # the recorder measures it every `fingerprint_every` steps only
        differs = _column_differs(step, col, recorded.get(col), replayed.get(col))
        if differs is not None:
            return differs
    return None


def with_exception_type(
    row: dict[str, Any] | None, recorded_exception: Callable[[int], dict[str, Any] | None]
) -> dict[str, Any] | None:
    """A recorded health row with the type of the exception its step raised (what
    ``compare_rows`` compares with a replay's), read by ``recorded_exception(step)``; a row
    of a step that did not raise as it is (a record no longer kept: no type)."""
    if row is None or row.get("raised") != 1.0:
        return row
    try:
        exc = recorded_exception(int(row["step"])) or {}
    except ReplayError:
        exc = {}
    return {**row, "exception_type": exc.get("type")}


def _column_differs(step: Any, col: str, a: Any, b: Any) -> Divergence | None:
    """``compare_rows``'s entry for column ``col`` whose values ``a`` (recorded) and ``b``
    (replayed) differ in their bits, else ``None``."""
    if same_bits(a, b):
        return None
    r = math.nan if a is None else float(a)
    p = math.nan if b is None else float(b)
    diff = abs(r - p) if math.isfinite(r) and math.isfinite(p) else None
    return Divergence(step, col, r, p, diff, _ulps(r, p))


def compare_replays(carried: dict[str, Any], fresh: dict[str, Any]) -> Divergence | None:
    """``None`` when a replay of a step from its snapshot (``fresh``) gives the bits the replay
    carried on to it gave, else the first column that differs, in ``compare_rows``'s shape
    (``recorded``: the carried-on value). Every column the replay measures counts, also where
    the recording measured none (a parameter fingerprint between ``fingerprint_every`` steps),
    and the exception's type where both raised."""
    step = int(fresh["step"])
    want = (carried.get("exception") or {}).get("type")
    got = (fresh.get("exception") or {}).get("type")
    if (carried.get("exception") is None) != (fresh.get("exception") is None) or want != got:
        return Divergence(step, "exception", want, got)
    cols = (*VERIFIED_COLUMNS, "grad_norm")
    diffs = (_column_differs(step, c, carried.get(c), fresh.get(c)) for c in cols)
    return next((d for d in diffs if d is not None), None)
