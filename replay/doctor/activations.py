"""Rules over activations: dead ReLUs, saturated sigmoid/tanh, softmax fed to cross-entropy.

Without forensics, activations are recomputed in numpy for the leading chain of Linear and
element-wise layers (a Sequential MLP head), from a recorded batch and the snapshot weights
taken right before it. With a forensics sidecar, its per-module statistics are used as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .context import Context
from .registry import Finding, rule

_ELEMENTWISE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "ReLU": lambda z: np.maximum(z, 0),
    "LeakyReLU": lambda z: np.where(z > 0, z, 0.01 * z),
    "Tanh": np.tanh,
    "Sigmoid": lambda z: 1 / (1 + np.exp(-np.clip(z, -80, 80))),
    "GELU": lambda z: 0.5 * z * (1 + np.tanh(0.79788456 * (z + 0.044715 * z**3))),
    "Dropout": lambda z: z,  # a statistic over units, not exact values: identity is enough
    "Identity": lambda z: z,
    "Flatten": lambda z: z,
}


def forward_chain(ctx: Context) -> list[tuple[str, str, np.ndarray]]:
    """``(module, class, output)`` for the leading Linear/element-wise modules, in numpy."""
    held = {int(x) for x in ctx.batch_steps}  # (once: built per snapshot, it was quadratic)
    snaps = [s for s in ctx.snapshots if s.step in held]
    if not snaps:
        return []
    snap = snaps[-1]
    leaves = ctx.batch_leaves(snap.step)
    mods = ctx.leaf_modules
    if not mods or mods[0].cls != "Linear":
        return []
    w = snap.weights.get(f"{mods[0].name}.weight")
    if w is None or w.ndim != 2:
        return []
    x = next(
        (
            a.reshape(-1, a.shape[-1]).astype(np.float64)
            for _, a in leaves
            if a.dtype.kind == "f" and a.ndim >= 2 and a.shape[-1] == w.shape[1]
        ),
        None,
    )
    if x is None:
        return []
    out: list[tuple[str, str, np.ndarray]] = []
    for m in mods:
        name, cls = m.name, m.cls
        if cls == "Linear":
            w = snap.weights.get(f"{name}.weight")
            if w is None or w.ndim != 2 or w.shape[1] != x.shape[-1]:
                break
            b = snap.weights.get(f"{name}.bias")
            x = x @ w.T + (b if b is not None else 0)
        elif cls in _ELEMENTWISE:
            with np.errstate(over="ignore", invalid="ignore"):
                x = _ELEMENTWISE[cls](x)
        else:
            break
        if not np.isfinite(x).all():
            break
        out.append((name, cls, x))
    return out


@rule
def dead_relu(ctx: Context) -> Finding | None:
    """ReLU units that output zero for every sample of a batch (they get no gradient)."""
    layers = {}
    for name, cls, y in forward_chain(ctx):
        if cls == "ReLU" and y.shape[0] >= 2:
            dead = float(np.mean(np.all(y <= 0, axis=0)))
            layers[name] = {"dead_fraction": dead, "units": int(y.shape[1])}
    source = "recomputed from a recorded batch and the snapshot before it"
    f = ctx.forensics
    if f is not None:
        for m in f.modules():
            if m.get("kind") == "ReLU" and np.isfinite(m.get("act_zero_frac", np.nan)):
                layers.setdefault(m["name"], {"zero_fraction": float(m["act_zero_frac"])})
        source += "; forensics of the traced step"
    bad = {
        k: v
        for k, v in layers.items()
        if v.get("dead_fraction", 0) >= 0.5 or v.get("zero_fraction", 0) >= 0.95
    }
    if not bad:
        return None
    worst = max(v.get("dead_fraction", v.get("zero_fraction", 0)) for v in bad.values())
    return Finding(
        "dead_relu",
        "error" if worst >= 0.9 else "warning",
        f"dead ReLUs: {worst:.0%} of the units of " + ", ".join(bad) + " output 0 for every sample",
        {"layers": layers, "source": source},
        "A ReLU whose input is negative for every sample outputs 0 and passes back no "
        "gradient, so it never recovers. Causes: a learning rate too high (one big step pushes "
        "the bias far negative), a bad initialisation (negative biases, huge weights), "
        "unnormalised inputs. Use Kaiming init with zero bias, a lower learning rate, "
        "LeakyReLU/GELU, or normalisation before the activation.",
    )


@rule
def activations_saturated(ctx: Context) -> Finding | None:
    """Sigmoid/tanh units pinned at their limits, where the gradient is ~0."""
    layers = {}
    for name, cls, y in forward_chain(ctx):
        if cls == "Tanh":
            layers[name] = float(np.mean(np.abs(y) > 0.99))
        elif cls == "Sigmoid":
            layers[name] = float(np.mean((y < 0.01) | (y > 0.99)))
    bad = {k: v for k, v in layers.items() if v >= 0.5}
    if not bad:
        return None
    return Finding(
        "activations_saturated",
        "warning",
        "saturated activations: " + ", ".join(f"{k} {v:.0%}" for k, v in bad.items()),
        {"saturated_fraction": layers},
        "Saturated sigmoid/tanh units have a gradient near 0: normalise the inputs, use a "
        "smaller initialisation (Xavier for tanh), or switch to ReLU-family activations.",
    )


@rule
def softmax_before_cross_entropy(ctx: Context) -> Finding | None:
    """The model ends in Softmax while the labels are class indices (cross-entropy on probs)."""
    mods = ctx.leaf_modules
    c = ctx.n_classes
    if not mods or mods[-1].cls != "Softmax" or c is None:
        return None
    floor = math.log(1 + (c - 1) / math.e)
    _, loss = ctx.loss
    lowest = float(loss.min()) if loss.size else None
    return Finding(
        "softmax_before_cross_entropy",
        "error",
        f"the model's last layer is Softmax ({mods[-1].name}) and the labels are class indices: "
        "cross_entropy applies log-softmax again",
        {"module": mods[-1].name, "classes": c, "loss_floor": floor, "lowest_loss": lowest},
        f"F.cross_entropy / nn.CrossEntropyLoss expect raw logits. Fed probabilities, the loss "
        f"cannot go below ln(1 + (C-1)/e) = {floor:.3g} and its gradients are squashed. Remove "
        "the Softmax from the model (apply it only at inference), or end with LogSoftmax and "
        "use nll_loss. (Likewise: BCELoss wants a sigmoid output, BCEWithLogitsLoss must not "
        "get one.)",
    )
