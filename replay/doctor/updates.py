"""Rules over parameter updates: update/weight ratio, parameters frozen, never updated or
never receiving gradients, and an optimizer that never steps."""

from __future__ import annotations

import numpy as np

from ..thresholds import UPDATE_RATIO_BAND
from .arrays import as_float
from .context import Context
from .registry import Finding, rule


def update_ratios(ctx: Context) -> dict[str, float]:
    """Per weight tensor: median over consecutive snapshot pairs of the per-step relative change."""
    _, ratios = ctx.update_ratio_table
    finite = [(p.name, r[np.isfinite(r)]) for p, r in zip(ctx.params, ratios)]
    return {name: float(np.median(r)) for name, r in finite if r.size}


@rule
def update_ratio(ctx: Context) -> Finding | None:
    """The update-to-weight ratio is far from ~1e-3 (from consecutive snapshots)."""
    ratios = {k: v for k, v in update_ratios(ctx).items() if v > 0}
    if not ratios:
        return None
    med = float(np.median(list(ratios.values())))
    low, high = UPDATE_RATIO_BAND
    if low <= med <= high:
        return None
    big = med > high
    return Finding(
        "update_ratio",
        "warning",
        f"weights change by {med:.2g} of their norm per step (median over weight tensors); "
        "about 1e-3 is healthy",
        {
            "median_ratio": med,
            "per_tensor": ratios,
            "lr": ctx.lr,
            "snapshots": [s.step for s in ctx.snapshots],
        },
        (
            "Updates this large rewrite the weights every few steps: lower the learning rate."
            if big
            else "Updates this small barely move the weights: raise the learning rate (try "
            "10x), or check that it is not decayed to ~0 and that the gradients are not tiny."
        )
        + " (Measured between snapshots, so it is a lower bound when steps point different ways.)",
        [s.step for s in ctx.snapshots],
    )


@rule
def params_frozen(ctx: Context) -> Finding | None:
    """Parameters have requires_grad=False."""
    frozen = [p for p in ctx.params if not p.requires_grad]
    if not frozen:
        return None
    total = sum(p.numel for p in ctx.params) or 1
    n = sum(p.numel for p in frozen)
    return Finding(
        "params_frozen",
        "warning",
        f"{len(frozen)} parameter tensors ({n:,} values, {n / total:.0%} of the model) have "
        "requires_grad=False: " + ", ".join(p.name for p in frozen[:6]),
        {"frozen": [p.name for p in frozen], "frozen_values": n, "total_values": total},
        "Frozen parameters never learn. If they are a pretrained backbone, that is intended; "
        "if they are freshly initialised, unfreeze them (requires_grad_(True)) or the model "
        "learns on top of random features.",
    )


@rule
def optimizer_never_stepped(ctx: Context) -> Finding | None:
    """optimizer.step() never ran inside the step function (of a run that has an optimizer: a
    loop that updates its weights by hand, word_language_model's, has none to step)."""
    if ctx.rec.run_meta.optimizer is None:
        return None
    h = ctx.health
    stepped = h["optimizer_stepped"][np.isfinite(h["optimizer_stepped"])]
    if stepped.size < 3 or np.any(stepped == 1) or np.all(h["scaler_skipped"] == 1):
        return None
    return Finding(
        "optimizer_never_stepped",
        "error",
        f"optimizer.step() ran at none of {stepped.size} recorded steps",
        {"steps": int(stepped.size)},
        "Without optimizer.step() the weights never change: call it after loss.backward() in "
        "the step function (with AMP: scaler.step(optimizer); scaler.update()).",
        [int(h["step"][0]), int(h["step"][-1])],
    )


def _only_zero_lr_steps(ctx: Context, first: int, last: int) -> bool:
    """Whether every optimizer step among steps ``first``..``last - 1`` (between the snapshots
    before them) ran at a learning rate of 0, and there was one: such steps move no weight. A
    warmup that starts at 0 (diffusers', transformers') moves nothing in its first step, and a
    short run may have no snapshot past it. (No optimizer step at all is another finding's.)"""
    h = ctx.health
    stepped = (h["step"] >= first) & (h["step"] < last) & (h["optimizer_stepped"] == 1)
    return bool(stepped.any()) and bool(np.all(h["lr"][stepped] == 0))


@rule
def params_never_updated(ctx: Context) -> Finding | None:
    """Trainable parameters are bit-identical in every snapshot."""
    snaps = ctx.snapshots
    if len(snaps) < 2 or _only_zero_lr_steps(ctx, snaps[0].step, snaps[-1].step):
        return None
    trainable = [p.name for p in ctx.params if p.requires_grad]
    same = [
        n
        for n in trainable
        if all(n in s.weights for s in snaps)
        and all(np.array_equal(snaps[0].weights[n], s.weights[n]) for s in snaps[1:])
    ]
    if not same:
        return None
    every = len(same) == len(trainable)
    return Finding(
        "params_never_updated",
        "error" if every else "warning",
        f"{len(same)} of {len(trainable)} trainable parameter tensors never changed between "
        f"snapshots {snaps[0].step}..{snaps[-1].step}: " + ", ".join(same[:6]),
        {"unchanged": same, "snapshots": [s.step for s in snaps]},
        "A trainable parameter that never changes gets no gradient (it is unused in forward, "
        "behind a .detach() or torch.no_grad(), or behind dead units) or is not in the "
        "optimizer (the optimizer was built before the layer was added or replaced).",
        [s.step for s in snaps],
    )


@rule
def params_without_grad(ctx: Context) -> Finding | None:
    """Parameters in the optimizer have no gradient statistics (Adam state absent or zero)."""
    if not ctx.snapshots:
        return None
    snap = ctx.snapshots[-1]
    if snap.step <= int(ctx.rec.config.get("start_step", 0)):
        return None
    state = ctx.optimizer_state(snap)
    rg = {p.name: p.requires_grad for p in ctx.params}
    none: list[str] = []
    for name, st in state.items():
        if not rg.get(name, True):
            continue
        v = as_float(st.get("exp_avg_sq")) if isinstance(st, dict) and st else None
        # no state yet (Adam/AdamW create it at the first gradient), or a zero second moment
        if not st or (v is not None and not np.any(v)):
            none.append(name)
    has_adam = any(isinstance(st, dict) and "exp_avg_sq" in st for st in state.values())
    if not none or not has_adam:
        return None
    return Finding(
        "params_without_grad",
        "error",
        f"{len(none)} parameter tensors have received no gradient by step {snap.step}: "
        + ", ".join(none[:6]),
        {"without_grad": none, "snapshot": snap.step},
        "Their gradient has been exactly zero or None at every step so far: the units feeding "
        "them are dead (ReLU outputs all 0), the tensor is unused in forward, or the graph is "
        "cut (.detach(), .item(), numpy round-trips, torch.no_grad()).",
        [snap.step],
    )
