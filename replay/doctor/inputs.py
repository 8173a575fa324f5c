"""Rules over the recorded batches: inputs far from normalised."""

from __future__ import annotations

import numpy as np

from ..reports.doctor import EvidenceValue
from .context import Context
from .registry import Finding, rule


@rule
def inputs_not_normalised(ctx: Context) -> Finding | None:
    """Float inputs have a mean or spread far from a standardised scale."""
    steps = ctx.batch_steps
    if not steps.size:
        return None
    picks = sorted({int(steps[0]), int(steps[len(steps) // 2]), int(steps[-1])})
    stats: dict[str, list[np.ndarray]] = {}
    for s in picks:
        for path, a in ctx.batch_leaves(s):
            if a.dtype.kind == "f" and a.ndim >= 2:  # 1-D float leaves are targets, not inputs
                stats.setdefault(path, []).append(a.reshape(a.shape[0], -1).astype(np.float64))
    # A carried state (an RNN's hidden state fed back as part of the batch) starts as zeros and
    # is the model's own output afterwards: it is not data, and its scale is the model's.
    carried = [p for p, arrs in stats.items() if len(arrs) > 1 and not arrs[0].any()]
    bad: dict[str, dict[str, EvidenceValue]] = {}  # each leaf's evidence, the first's in words
    title = ""
    for path, arrs in stats.items():
        if path in carried:
            continue
        if len({a.shape[1] for a in arrs}) > 1:  # its shape changes by step (images of their
            arrs = [a.reshape(-1, 1) for a in arrs]  # own sizes, padded lengths): values only
        x = np.concatenate(arrs)
        x = x[:, np.isfinite(x).all(axis=0)] if x.size else x
        if not x.size:
            continue
        mean, std = float(x.mean()), float(x.std())
        feat_std = x.std(axis=0)
        spread = float(feat_std.max() / max(float(np.median(feat_std)), 1e-12))
        why = [
            w
            for w, hit in (
                (f"|mean| {abs(mean):.3g} > 5", abs(mean) > 5),
                (f"std {std:.3g} > 20", std > 20),
                (f"std {std:.3g} < 1e-3", 0 < std < 1e-3),
                (f"one feature spreads {spread:.3g}x the median feature", spread > 1e3),
            )
            if hit
        ]
        if why:
            lo, hi = float(x.min()), float(x.max())
            title = title or (
                f"input '{path}' is not normalised ({'; '.join(why)}): mean {mean:.3g}, "
                f"std {std:.3g}, range [{lo:.3g}, {hi:.3g}]"
            )
            bad[path] = {
                "why": why,
                "mean": mean,
                "std": std,
                "min": lo,
                "max": hi,
                "feature_std_spread": spread,
            }
    if not bad:
        return None
    return Finding(
        "inputs_not_normalised",
        "warning",
        title,
        {"leaves": bad, "steps": picks, "carried_state_skipped": carried},
        "Networks train best on inputs of mean ~0 and std ~1 per feature: subtract the training "
        "set's mean and divide by its std (images: scale to [0, 1], then normalise per "
        "channel). Unscaled inputs make the first layer's outputs huge, the initial loss far "
        "from ln(C) and the good learning rate tiny.",
        picks,
    )
