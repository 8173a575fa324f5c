"""The learning rate judged from the loss curve and the size of the updates."""

from __future__ import annotations

from .context import Context
from .gradients import grad_norm_exploding
from .loss import loss_flat, loss_oscillating, loss_rising
from .registry import Finding, rule
from .updates import update_ratios


@rule
def learning_rate(ctx: Context) -> Finding | None:
    """The learning rate looks too high (diverging, oscillating) or too low (flat, tiny updates)."""
    if (lr := ctx.lr) is None:
        return None
    # Tensors that never move (dead units, no gradient) are other rules' business.
    moving = sorted(v for v in update_ratios(ctx).values() if v > 0)
    med = moving[len(moving) // 2] if moving else None
    unstable = loss_rising(ctx) or grad_norm_exploding(ctx) or loss_oscillating(ctx)
    if unstable is not None and (med is None or med > 1e-3):
        lr = ctx.lr_at(unstable.steps) or lr  # the value in use where it went wrong
        lrs = ctx.lrs_at(unstable.steps)
        return Finding(
            "learning_rate",
            "warning",
            f"the learning rate {lr:.3g}"
            + (f" (recorded at step {unstable.steps[0]})" if unstable.steps else "")
            + f" looks too high: {unstable.rule.replace('_', ' ')}"
            + _every_group(lrs),
            {"lr": lr, "lrs": lrs, "median_update_ratio": med, "symptom": unstable.rule},
            f"Try {lr / 10:.3g} (10x lower) and a warm-up; find the range with a short "
            "learning-rate sweep: the best is usually a few times below where the loss "
            "starts to diverge.",
            unstable.steps,
        )
    flat = loss_flat(ctx)
    if flat is not None and med is not None and med < 1e-5:
        lr = ctx.lr_at(flat.steps) or lr
        lrs = ctx.lrs_at(flat.steps)
        return Finding(
            "learning_rate",
            "warning",
            f"the learning rate {lr:.3g} looks too low: the loss is flat and the weights move by "
            f"{med:.2g} of their norm per step" + _every_group(lrs),
            {"lr": lr, "lrs": lrs, "median_update_ratio": med},
            f"Try {lr * 10:.3g} (10x higher); updates of about 1e-3 of the weight norm per step "
            "are typical of a learning rate that works.",
            flat.steps,
        )
    return None


def _every_group(lrs: dict[str, list[float]]) -> str:
    """The learning rate of every group of every optimizer, when there is more than one (the
    one cited is the run's optimizer's first group's)."""
    if sum(map(len, lrs.values())) < 2:
        return ""
    said = "; ".join(
        f"{name} group {i} {lr:.3g}" for name, groups in lrs.items() for i, lr in enumerate(groups)
    )
    return f" (learning rates: {said})"
