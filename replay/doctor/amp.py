"""Rules over mixed precision: GradScaler skipping steps, and a collapsing loss scale."""

from __future__ import annotations

import numpy as np

from .context import Context
from .registry import Finding, rule


def _scaler(ctx: Context) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(steps, finite scales, skipped)`` of a run with a GradScaler (a finite scale
    recorded), else None; ``skipped`` is a bool mask over ``steps``."""
    h = ctx.health
    scale = h["scale"]
    if not np.isfinite(scale).any():
        return None
    return h["step"], scale[np.isfinite(scale)], h["scaler_skipped"] == 1


@rule
def amp_steps_skipped(ctx: Context) -> Finding | None:
    """The GradScaler skipped some steps (inf/NaN in the scaled gradients): normal in moderation."""
    if (s := _scaler(ctx)) is None:
        return None
    steps, finite, skipped = s
    n = int(skipped.sum())
    if n == 0 or n / len(steps) > 0.25:
        return None  # none, or too many: amp_scale_collapse speaks then
    return Finding(
        "amp_steps_skipped",
        "info",
        f"the GradScaler skipped {n} of {len(steps)} steps (inf in the scaled gradients); "
        "this is how it calibrates, not a failure",
        {
            "skipped": n,
            "steps": len(steps),
            "skipped_steps": [int(x) for x in steps[skipped][:20]],
            "scale_first": float(finite[0]),
            "scale_last": float(finite[-1]),
        },
        "Nothing to do: GradScaler halves the scale and skips the update when the scaled "
        "gradients overflow, then grows it again every growth_interval good steps. Worry only "
        "if skips become frequent or the scale keeps shrinking.",
        [int(x) for x in steps[skipped][:20]],
    )


@rule
def amp_scale_collapse(ctx: Context) -> Finding | None:
    """The loss scale shrinks to tiny values, or most steps are skipped."""
    if (s := _scaler(ctx)) is None:
        return None
    steps, finite, skipped = s
    frac = float(skipped.mean())
    if not (frac > 0.25 or float(finite[-1]) < 1.0):
        return None
    return Finding(
        "amp_scale_collapse",
        "error",
        f"the AMP loss scale collapses: {float(finite[0]):.3g} -> {float(finite[-1]):.3g}, "
        f"{frac:.0%} of steps skipped",
        {
            "scale_first": float(finite[0]),
            "scale_last": float(finite[-1]),
            "skipped_fraction": frac,
            "skipped": int(skipped.sum()),
        },
        "Gradients are inf/NaN even at a tiny scale, so this is not an overflow the scaler can "
        "fix: something produces inf/NaN in fp16 itself (an op overflowing 65504 in the "
        "forward, log/div/sqrt at 0, a loss computed in half precision). Run replay bisect on "
        "a skipped step, keep the loss and reductions in float32, or use bfloat16.",
        [int(x) for x in steps[skipped][:20]],
    )
