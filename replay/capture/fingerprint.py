"""Cheap per-step numbers that replay recomputes the same way and compares bitwise.

The recorder and the replay engine both use these functions, so a recorded value and a replayed
one come from the same code. Tensors stay on the device (no host sync); the writer thread reads
them a step late.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .readback import value_now
from .sharded import any_dtensor, local

__all__ = [
    "param_fingerprint",
    "grad_norm",
    "grad_absmax",
    "absmax",
    "exact_if_needed",
    "GradMeter",
    "loss_of",
    "group_by_dtype",
]


def loss_of(ret: Any) -> Any:
    """The loss inside whatever ``step_fn`` returned: a tensor, a number, a dict or a tuple."""
    if isinstance(ret, dict):
        ret = ret.get("loss")
    elif isinstance(ret, (tuple, list)) and ret:
        ret = ret[0]
    if isinstance(ret, torch.Tensor):
        if ret.dtype.is_complex or (ret.ndim and not ret.numel()):
            return None  # not a loss a health row can hold; the step still counts
        return ret.detach() if ret.ndim == 0 else ret.detach().reshape(-1)[0]
    if isinstance(ret, (int, float)):
        try:
            return float(ret)
        except OverflowError:  # an int beyond float64: as large as a float gets
            return math.inf if ret > 0 else -math.inf
    return None


def group_by_dtype(tensors: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return list(groups.values())


def param_fingerprint(params: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """Sum of per-parameter L2 norms in float64: changes with any update, NaN if any is NaN."""
    total = None
    with torch.no_grad():
        # A DTensor's local shard (FSDP2): no collective, each rank its own (sharded.py).
        for g in group_by_dtype(local(p).detach() for p in params):
            s = torch.stack(torch._foreach_norm(g)).to(torch.float64).sum()
            total = s if total is None else total + s.to(total.device)
    return total


def grad_norm(params: list[torch.Tensor]) -> torch.Tensor | None:
    """Global L2 norm of the gradients present (float64 on the device), ``None`` if none.

    Three ops for a model whose gradients share one dtype and device: this runs every step in
    the optimizer's pre-hook, where each op costs ~15 us on the CPU (cold caches after the
    backward), so the op count is what matters.
    """
    grads = [local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return None
    if any(g.requires_grad for g in grads):  # backward(create_graph=True): record no graph
        with torch.no_grad():
            return _norm_of_groups(group_by_dtype(grads))
    return _norm_of_groups(group_by_dtype(grads))  # (entering no_grad costs ~15 us there)


def _norm_of_groups(groups: list[list[torch.Tensor]]) -> torch.Tensor:
    norms = [
        torch.linalg.vector_norm(torch.stack(torch._foreach_norm(g)), dtype=torch.float64)
        for g in groups
    ]
    if len(norms) == 1:
        one: torch.Tensor = norms[0]
        return one
    dev = norms[0].device
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack([n.to(dev) for n in norms]))
    return total


class GradMeter:
    """``(grad_norm, grad_absmax)`` of one fixed parameter list as the health row takes them,
    at a fraction of ``grad_norm``'s Python cost: float64 tensors on the gradients' device,
    never read here (``capture/readback.py`` brings them to the host); ``grad_absmax`` is
    ``None`` when a norm already known finite proves every element finite.

    It runs every step in the optimizer's pre-hook, right after the backward, where caches are
    cold and every Python-level call costs ~10 us on the CPU. The (dtype, device) groups are
    worked out once from the parameters (a gradient has its parameter's dtype and device), so a
    call is one list comprehension per group plus the three ops of ``grad_norm``; the value is
    bit for bit the one ``grad_norm`` gives (same ops, same order), so recordings made before it
    replay identically.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self._groups = group_by_dtype(params)
        self._sharded = any_dtensor(params)  # FSDP2: the local shards, through grad_norm

    def grad_norm(self) -> torch.Tensor | None:
        if len(self._groups) != 1 or self._sharded:
            return grad_norm(self.params)
        grads = [p.grad for p in self._groups[0] if p.grad is not None]
        if not grads:
            return None
        if torch.is_grad_enabled() and any([g.requires_grad for g in grads]):  # (no generator)
            return grad_norm(self.params)
        try:
            return _norm_of_groups([grads])
        except RuntimeError:  # the parameters changed dtype or device since (model.half())
            self._groups = group_by_dtype(self.params)
            return grad_norm(self.params)

    def __call__(self) -> tuple[Any, Any]:
        gn = self.grad_norm()
        if gn is None:
            return None, None
        return gn, exact_if_needed(gn, lambda: grad_absmax(self.params))


def _cpu_absmax(tensors: list[torch.Tensor]) -> torch.Tensor:
    # aminmax per tensor: 0.27 ms on the 1.8M-parameter bisect benchmark MLP, where the CPU
    # kernel of _foreach_norm(ord=inf) takes 5 ms. Both propagate NaN and inf.
    ends: list[torch.Tensor] = []
    for t in tensors:
        if t.numel() == 0:
            continue
        lo, hi = torch.aminmax(t.abs() if t.is_complex() else t)
        ends += (lo, hi)
    if not ends:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(ends).to(torch.float64).abs().max()


def absmax(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """Largest absolute value (float64 on the device): non-finite exactly when an element is.

    The health flags use this, not the norms: an L2 norm of finite float32 values overflows to
    inf long before any element does (a diverging run showed inf norms 5 steps before the first
    inf element), which would make bisect blame the wrong step.
    """
    if not tensors:
        return None
    with torch.no_grad():
        total = None
        for g in group_by_dtype(local(t).detach() for t in tensors):
            if g[0].device.type == "cpu":
                m = _cpu_absmax(g)
            else:  # one fused kernel, launched asynchronously
                m = torch.stack(torch._foreach_norm(g, math.inf)).to(torch.float64).max()
            total = m if total is None else torch.maximum(total, m.to(total.device))
        return total


def exact_if_needed(norm: torch.Tensor | None, exact: Callable[[], Any]) -> Any:
    """``exact()`` (an ``absmax``) when a non-finite flag needs it, else ``None``.

    A finite norm proves every element finite, so where the norm is in host memory already
    (``readback.value_now``: a CPU tensor) the second pass over the tensors runs only after an
    inf/NaN norm. A device norm is not read (that would wait for the device): the pass is queued
    asynchronously every time, while the tensors are still these.
    """
    if norm is None:
        return None
    value = value_now(norm)
    if value is None:
        return exact()
    return exact() if not math.isfinite(value) else None


def grad_absmax(params: list[torch.Tensor]) -> torch.Tensor | None:
    """``absmax`` over the gradients present."""
    return absmax([p.grad for p in params if p.grad is not None])
