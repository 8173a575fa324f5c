"""Rules over the loss curve: initial loss against ln(C), flat, rising, oscillating."""

from __future__ import annotations

import math

import numpy as np

from .context import Context
from .registry import Finding, rule

MIN_STEPS = 12  # fewer points than this say nothing about a curve's shape


def _ends(ctx: Context) -> tuple[np.ndarray, float, np.ndarray, float] | None:
    """The first and last quarter of the finite losses (3 at least): steps, median loss each."""
    steps, loss = ctx.loss
    if loss.size < MIN_STEPS:
        return None
    k = max(3, loss.size // 4)
    return steps[:k], float(np.median(loss[:k])), steps[-k:], float(np.median(loss[-k:]))


@rule
def initial_loss(ctx: Context) -> Finding | None:
    """The first loss of a classifier is far from ln(C), what a fresh model should give."""
    c = ctx.n_classes
    steps, loss = ctx.loss
    if c is None or not loss.size or int(steps[0]) != int(ctx.health["step"][0]):
        return None
    if int(ctx.rec.config.get("start_step", 0)) != int(steps[0]):
        return None  # a resumed run: its first loss is not a fresh model's
    expected = math.log(c)
    first = float(loss[0])
    if abs(first - expected) <= max(1.0, 0.5 * expected):
        return None
    high = first > expected
    return Finding(
        "initial_loss",
        "warning",
        f"initial loss {first:.3g} is far from ln({c}) = {expected:.3g}",
        {"initial_loss": first, "expected": expected, "classes": c, "step": int(steps[0])},
        (
            "A freshly initialised classifier should predict about uniformly, giving ln(C). "
            + (
                "Much higher means over-confident wrong predictions from the start: look at "
                "the input scale (normalise the inputs), the initialisation of the last layer "
                "(small weights, zero bias) and whether the labels match the outputs."
                if high
                else "Much lower before any training suggests the labels leak into the inputs, "
                "or the loss is not the cross-entropy you think."
            )
        ),
        [int(steps[0])],
    )


@rule
def loss_rising(ctx: Context) -> Finding | None:
    """The loss ends much higher than it started."""
    if (t := _ends(ctx)) is None:
        return None
    went_nonfinite = bool(np.any(ctx.health["loss_nonfinite"] == 1))
    s0, a, s1, b = t
    if not (b > 1.5 * a and b - a > 0.1):
        return None
    return Finding(
        "loss_rising",
        "error" if went_nonfinite or b > 10 * a else "warning",
        f"the loss rises: median {a:.3g} over steps {s0[0]}..{s0[-1]}, "
        f"{b:.3g} over steps {s1[0]}..{s1[-1]}"
        + (" before turning non-finite" if went_nonfinite else ""),
        {
            "early_median": a,
            "late_median": b,
            "lowest": float(ctx.loss[1].min()),
            "lowest_step": int(ctx.loss[0][int(np.argmin(ctx.loss[1]))]),
            "nonfinite": went_nonfinite,
        },
        "A loss that goes up is diverging: the usual cause is a learning rate too high for this "
        "model (lower it 3-10x, add warm-up) or gradients exploding (clip them with "
        "torch.nn.utils.clip_grad_norm_). If it fell first and then rose, the steps overshoot "
        "once the loss is low: decay the learning rate.",
        [int(ctx.loss[0][int(np.argmin(ctx.loss[1]))]), int(s1[-1])],
    )


@rule
def loss_flat(ctx: Context) -> Finding | None:
    """The loss does not move."""
    if (t := _ends(ctx)) is None:
        return None
    s0, a, s1, b = t
    if a <= 1e-3 or (a - b) / abs(a) > 0.03 or b > 1.5 * a:
        return None
    return Finding(
        "loss_flat",
        "warning",
        f"the loss does not decrease: median {a:.4g} over steps {s0[0]}..{s0[-1]}, "
        f"{b:.4g} over steps {s1[0]}..{s1[-1]}",
        {"early_median": a, "late_median": b, "steps": int(ctx.loss[0].size)},
        "Nothing is being learnt. In order: can the model overfit one batch (replay overfit)? "
        "Are the labels right and the inputs normalised? Does the output layer match the loss "
        "(logits into CrossEntropyLoss, no softmax)? Is the learning rate sane? Are "
        "optimizer.step() and zero_grad() both called, and do the parameters get gradients?",
        [int(s0[0]), int(s1[-1])],
    )


@rule
def loss_oscillating(ctx: Context) -> Finding | None:
    """The loss jumps up and down by a large fraction of its level from step to step."""
    steps, loss = ctx.loss
    if loss.size < MIN_STEPS:
        return None
    half = loss[loss.size // 2 :]
    level = float(np.median(np.abs(half)))
    if level <= 1e-6:
        return None
    jump = float(np.median(np.abs(np.diff(half))))
    rel = jump / level
    if rel < 0.3:
        return None
    return Finding(
        "loss_oscillating",
        "warning",
        f"the loss oscillates: consecutive steps differ by {rel:.0%} of its level (median)",
        {"median_step_change": jump, "median_level": level, "relative": rel},
        "Step-to-step swings this large mean the updates overshoot: lower the learning rate, "
        "or use a larger batch. Check also that zero_grad() runs every step and that the "
        "inputs are normalised.",
        [int(steps[loss.size // 2]), int(steps[-1])],
    )
