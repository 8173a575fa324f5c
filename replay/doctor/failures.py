"""Hard failures already in the health record: NaN/Inf and exceptions. Doctor points to bisect."""

from __future__ import annotations

from .context import Context
from .registry import Finding, rule


@rule
def nonfinite_recorded(ctx: Context) -> Finding | None:
    """A NaN/Inf loss, gradient or weight was recorded (AMP-skipped steps excluded)."""
    step = ctx.rec.first_bad()["nonfinite"]
    if step is None:
        return None
    h = ctx.health
    i = int((h["step"] == step).nonzero()[0][0])
    where = [k for k in ("loss", "grad", "param") if h[f"{k}_nonfinite"][i] == 1]
    return Finding(
        "nonfinite_recorded",
        "error",
        f"non-finite values first recorded at step {step} (in: {', '.join(where)})",
        {"step": step, "in": where},
        f"Run `replay bisect {ctx.rec.path}` to find the first op that produced it, the module, "
        "the source line and the samples of the batch responsible.",
        [step],
    )


@rule
def exception_recorded(ctx: Context) -> Finding | None:
    """A step raised an exception."""
    step = ctx.rec.first_bad()["exception"]
    if step is None:
        return None
    try:
        exc = ctx.rec.read_step(step).get("exception") or {}
    except KeyError:
        exc = {}
    return Finding(
        "exception_recorded",
        "error",
        f"step {step} raised {exc.get('type', 'an exception')}: {exc.get('message', '')}"[:200],
        {"step": step, "type": exc.get("type"), "message": exc.get("message")},
        f"Run `replay bisect {ctx.rec.path}` to get the op, module, source line and samples "
        "that raised, replayed from the recorded state.",
        [step],
    )
