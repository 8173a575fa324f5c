"""Overfit one recorded batch: the "first law" of debugging training, automated (imports torch).

Rebuild the objects with the replay engine (recorded entry points, snapshot, RNG, hyper-
parameters, modes), put them in the state right before step N, then call the user's own
``step_fn`` on step N's batch ``iters`` times and watch the loss.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..reports import OverfitReport
from .session import AS_RECORDED, ReplayOptions, with_engine

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store.reader import Recording

__all__ = ["overfit_batch", "judge", "CLOSE"]


TARGET = 0.01  # the goal: the loss below this, or below this times a first loss over 1
CLOSE = 1.15  # within 15% of the goal: a healthy model that needs a few more iterations
PLATEAU_DROP = 0.05  # the last quarter of the iterations lowered the loss by less than 5%


def judge(
    losses: list[float], goal: float, reached: int | None, error: str | None
) -> tuple[str, float | None, float | None]:
    """``(verdict, progress, recent_drop)``.

    ``verdict``: ``overfits`` (the goal was reached), ``close`` (the lowest loss is within 15%
    of the goal), ``still_falling`` (not there, but the last quarter of the iterations still
    lowered the loss by 5% or more: run longer), ``plateau`` (stalled well above the goal: the
    bug signal), or ``error``. ``progress``: the share of the way from the first loss to the
    goal that the lowest loss covered (in log space when both are positive).
    """
    if error is not None or not losses:
        return "error", None, None
    first, low = losses[0], min(losses)
    if reached is not None:
        return "overfits", 1.0, None
    progress = None
    if math.isfinite(first) and math.isfinite(low) and first > goal:
        if low > 0 and goal > 0:
            progress = (math.log(first) - math.log(low)) / (math.log(first) - math.log(goal))
        else:
            progress = (first - low) / (first - goal)
    if low <= goal * CLOSE:
        return "close", progress, None
    q = max(2, len(losses) // 4)
    before, last = min(losses[:-q]) if len(losses) > q else first, min(losses[-q:])
    drop = (before - last) / abs(before) if before and math.isfinite(before) else None
    if drop is not None and drop >= PLATEAU_DROP:
        return "still_falling", progress, drop
    return "plateau", progress, drop


def overfit_batch(
    path: str,
    *,
    step: int | None = None,
    iters: int = 200,
    lr: float | None = None,
    options: ReplayOptions = AS_RECORDED,
) -> OverfitReport:
    """Train on step ``step``'s recorded batch; report whether the loss reaches ~0 and how fast.

    "Overfits" means the loss falls below ``TARGET`` (absolute), or below ``TARGET`` times its
    first value when that is large (a loss in the thousands going to 1% of itself).
    """
    from ..capture.fingerprint import loss_of
    from ..errors import ReplayError

    def work(rec: Recording, eng: Engine) -> OverfitReport:
        t = eng.window.first if step is None else step
        eng.state_before(t)
        opt = eng.optimizer
        if lr is not None and opt is not None:
            for g in opt.param_groups:
                g["lr"] = lr
        # A loop without an optimizer passes its lr as a per-step value: --lr overrides that.
        override = {"lr": lr} if lr is not None and "lr" in eng.values(t) else {}
        run = eng.step_callable(t, **override)
        batch = eng.batch(t)
        losses: list[float] = []
        error = None
        for _ in range(iters):
            try:
                ret = run(eng.model, opt, batch)
            except Exception as e:  # noqa: BLE001 - the user's step failing is a result, not our failure
                error = f"{type(e).__name__}: {e}"
                break
            loss = loss_of(ret)
            if loss is None:
                raise ReplayError("step_fn returned no loss, so there is nothing to watch")
            v = float(loss)
            losses.append(v)
            if not math.isfinite(v):
                error = f"the loss became {v} at iteration {len(losses)}"
                break
        eng.invalidate()
        first = losses[0] if losses else math.nan
        goal = TARGET * max(1.0, first) if math.isfinite(first) else TARGET
        reached = next((i + 1 for i, v in enumerate(losses) if v <= goal), None)
        verdict, progress, recent_drop = judge(losses, goal, reached, error)
        g0 = opt.param_groups[0] if opt is not None and opt.param_groups else eng.values(t)
        lr0 = g0.get("lr")
        return OverfitReport(
            path=path,
            step=t,
            iters=len(losses),
            lr=float(lr0) if isinstance(lr0, (int, float)) else None,
            first_loss=first,
            final_loss=losses[-1] if losses else math.nan,
            min_loss=min(losses) if losses else math.nan,
            goal=goal,
            overfits=verdict in ("overfits", "close", "still_falling"),
            verdict=verdict,
            progress=progress,
            recent_drop=recent_drop,
            reached_at=reached,
            error=error,
            curve=losses,
        )

    return with_engine(path, work, options)
