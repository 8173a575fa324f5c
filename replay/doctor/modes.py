"""Rules over the module modes recorded with every step (``module.training``)."""

from __future__ import annotations

from .context import Context
from .registry import Finding, rule

# Modules whose forward differs between train() and eval(): in eval mode Dropout does nothing
# and BatchNorm normalises with its running statistics instead of the batch's (and stops
# updating them).
_MODE_SENSITIVE = ("Dropout", "BatchNorm", "InstanceNorm")


@rule
def model_in_eval_mode(ctx: Context) -> Finding | None:
    """The model trained in eval() mode: Dropout and BatchNorm behaved as at inference."""
    modules = ctx.modules
    sensitive = [i for i, m in enumerate(modules) if any(k in m.cls for k in _MODE_SENSITIVE)]
    steps = ctx.batch_steps
    if not sensitive or not steps.size:
        return None
    picks = sorted({int(steps[0]), int(steps[len(steps) // 2]), int(steps[-1])})
    modes = ctx.modes_at(picks)
    if not modes or any(m.size != len(modules) for m in modes.values()):
        return None
    if any(m[0] for m in modes.values()):  # the model itself was in train() at some step
        return None
    frozen = [modules[i].name for i in sensitive if not any(m[i] for m in modes.values())]
    if not frozen:
        return None
    return Finding(
        "model_in_eval_mode",
        "warning",
        f"the model trained in eval() mode at every step checked ({', '.join(map(str, picks))}): "
        f"{len(frozen)} Dropout/BatchNorm layer(s) behaved as at inference "
        f"({', '.join(frozen[:4])}{', ...' if len(frozen) > 4 else ''})",
        {"steps": picks, "layers": frozen, "model_training": False},
        "Call model.train() before the training loop (and again after every evaluation that "
        "called model.eval()): in eval mode Dropout is off and BatchNorm uses, and no longer "
        "updates, its running statistics.",
        picks,
    )
