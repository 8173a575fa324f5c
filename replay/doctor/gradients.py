"""Rules over gradients: exploding, vanishing (overall and per layer), accumulating."""

from __future__ import annotations

import numpy as np

from ..thresholds import VANISHING_GRAD_NORM
from .arrays import as_float
from .context import Context
from .registry import Finding, rule


@rule
def grad_norm_exploding(ctx: Context) -> Finding | None:
    """The gradient norm grows by orders of magnitude within a few steps."""
    steps, g = ctx.grad_norm
    if g.size < 6:
        return None
    # The smallest of the first steps: a run whose norm explodes within its first few steps
    # (a learning rate far too high) has an exploded median there already.
    start = g[: min(5, g.size)]
    start = start[start > 0]
    if not start.size:
        return None
    base = float(start.min())
    win = 5
    # Explosion is fast: >10x within `win` steps, and >100x over the start overall.
    jumps = np.array([g[i + win] / max(g[i], 1e-30) for i in range(g.size - win)])
    i = int(np.argmax(jumps))
    peak = float(g.max())
    h = ctx.health
    nonfinite = h["step"][(h["grad_nonfinite"] == 1) & (h["scaler_skipped"] != 1)]
    if not ((jumps[i] > 10 and peak > 100 * base) or (nonfinite.size and peak > 10 * base)):
        return None
    return Finding(
        "grad_norm_exploding",
        "error",
        f"the gradient norm explodes: {base:.3g} at the start, {peak:.3g} at step "
        f"{int(steps[int(np.argmax(g))])}"
        + (f", non-finite from step {int(nonfinite[0])}" if nonfinite.size else ""),
        {
            "start": base,
            "peak": peak,
            "peak_step": int(steps[int(np.argmax(g))]),
            "fastest_growth": float(jumps[i]),
            "fastest_growth_steps": [int(steps[i]), int(steps[i + win])],
            "first_nonfinite_grad_step": int(nonfinite[0]) if nonfinite.size else None,
        },
        "Each update makes the next gradient larger: lower the learning rate, clip the global "
        "gradient norm (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) between "
        "backward() and step()), and check the initialisation and normalisation layers of deep "
        "or recurrent parts.",
        [int(steps[i]), int(steps[i + win])],
    )


@rule
def grad_norm_vanishing(ctx: Context) -> Finding | None:
    """The global gradient norm is essentially zero while the loss is not."""
    steps, g = ctx.grad_norm
    _, loss = ctx.loss
    if g.size < 3 or not loss.size:
        return None
    med = float(np.median(g))
    if med > VANISHING_GRAD_NORM or float(np.median(np.abs(loss))) < 1e-4:
        return None
    return Finding(
        "grad_norm_vanishing",
        "warning",
        f"the gradient norm is {med:.2g} (median) while the loss is {float(np.median(loss)):.3g}",
        {"median_grad_norm": med, "median_loss": float(np.median(loss))},
        "No gradient reaches the parameters: look for .detach(), torch.no_grad(), an argmax or "
        "round in the forward, saturated sigmoids/tanh, or dead ReLUs.",
        [int(steps[0]), int(steps[-1])],
    )


@rule
def grad_accumulating(ctx: Context) -> Finding | None:
    """The gradient norm grows steadily step after step: gradients are never zeroed."""
    steps, g = ctx.grad_norm
    if g.size < 15:
        return None
    up = float(np.mean(np.diff(g) > 0))
    rank = np.argsort(np.argsort(g))
    rho = float(np.corrcoef(rank, np.arange(g.size))[0, 1])
    growth = float(np.median(g[-3:]) / max(float(np.median(g[:3])), 1e-30))
    if not (up > 0.7 and rho > 0.9 and growth > 3):
        return None
    return Finding(
        "grad_accumulating",
        "error",
        f"the gradient norm grows at {up:.0%} of steps ({growth:.3g}x from the first steps to "
        "the last): gradients accumulate across steps",
        {"fraction_of_steps_growing": up, "rank_correlation_with_step": rho, "growth": growth},
        "PyTorch adds every backward() into .grad. Call optimizer.zero_grad(set_to_none=True) "
        "at the start of every step (or after each optimizer.step() when accumulating on "
        "purpose over N micro-batches, and then divide the loss by N).",
        [int(steps[0]), int(steps[-1])],
    )


@rule
def layer_grad_vanishing(ctx: Context) -> Finding | None:
    """Some layers get gradients orders of magnitude smaller than the largest (per layer)."""
    # per weight tensor: its gradient RMS from Adam's second moment in the newest snapshot
    state = ctx.optimizer_state(ctx.snapshots[-1]) if ctx.snapshots else {}
    weights = {k: st for k, st in state.items() if k.endswith("weight") and isinstance(st, dict)}
    second = {k: as_float(st.get("exp_avg_sq")) for k, st in weights.items()}
    rms = {k: float(np.sqrt(np.mean(v))) for k, v in second.items() if v is not None}
    source = "Adam's second moment (exp_avg_sq) in the newest snapshot"
    f = ctx.forensics
    if not rms and f is not None:
        rms = {
            p["name"]: p["grad_norm"] / max(p["numel"], 1) ** 0.5
            for p in f.params()
            if p.get("has_grad") and np.isfinite(p.get("grad_norm", np.nan))
        }
        source = "the traced step (forensics)"
    if len(rms) < 2:
        return None
    top = max(rms.values())
    if top <= 0:
        return None
    weak = {k: v for k, v in rms.items() if v < 1e-4 * top}
    if not weak:
        return None
    return Finding(
        "layer_grad_vanishing",
        "warning",
        f"{len(weak)} of {len(rms)} weight tensors get gradients <1e-4 of the largest: "
        + ", ".join(list(weak)[:4]),
        {"grad_rms": {k: float(v) for k, v in rms.items()}, "largest": top, "source": source},
        "Gradients vanish on the way to these layers: dead ReLUs or saturated sigmoid/tanh in "
        "front of them, a detach(), or a very deep stack without residual connections or "
        "normalisation. Check the activations feeding them.",
    )
