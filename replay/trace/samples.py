"""Which samples of a batch make the step fail: delta debugging over the batch dimension.

The caller supplies ``fails(indices)``, which restores the state and replays the step on just
those samples (``slice_batch``). ``find_culprit_samples`` returns a 1-minimal set (ddmin, Zeller
and Hildebrandt 2002): removing any single sample makes the failure go away. With batch-coupled
layers (BatchNorm in training mode) a sub-batch changes every sample's computation, so the answer
is approximate (``exact`` is False).

Example::

    idx, exact = find_culprit_samples(lambda ix: replay_fails(slice_batch(batch, ix)),
                                      batch_size_of(batch), coupled=has_batch_coupling(model))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

__all__ = ["find_culprit_samples", "slice_batch", "batch_size_of", "has_batch_coupling"]


def batch_size_of(batch) -> int | None:
    """The most common dim-0 size among the batch's tensor leaves (None without any)."""
    from replay.trace.picture import batch_leaves

    sizes = Counter(t.shape[0] for _, t in batch_leaves(batch) if t.dim() >= 1)
    return sizes.most_common(1)[0][0] if sizes else None


def slice_batch(batch, indices: list[int]):
    """The same nested structure (dict, list, tuple, namedtuple) with every tensor leaf whose
    dim 0 is the batch size indexed by ``indices``; other leaves are kept as they are."""
    size = batch_size_of(batch)
    return _slice(batch, list(indices), size)


def _slice(x, indices: list[int], size: int | None):
    if isinstance(x, torch.Tensor):
        if size is not None and x.dim() >= 1 and x.shape[0] == size:
            return x[torch.as_tensor(indices, dtype=torch.long, device=x.device)]
        return x
    if isinstance(x, dict):
        return type(x)((k, _slice(v, indices, size)) for k, v in x.items())
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_slice(v, indices, size) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_slice(v, indices, size) for v in x)
    return x


def has_batch_coupling(model: torch.nn.Module) -> bool:
    """True when a layer mixes samples: BatchNorm in training mode (or without running stats)."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and (
            m.training or not m.track_running_stats
        ):
            return True
    return False


def find_culprit_samples(
    fails: Callable[[list[int]], bool], batch_size: int, *, coupled: bool
) -> tuple[list[int], bool]:
    """Smallest set of sample indices (sorted) for which ``fails`` still holds, and whether the
    answer is exact. If the full batch does not fail, returns ``(all indices, False)``."""
    cache: dict[tuple[int, ...], bool] = {}

    def test(ix: list[int]) -> bool:
        key = tuple(ix)
        if key not in cache:
            cache[key] = bool(fails(list(ix)))
        return cache[key]

    current = list(range(batch_size))
    if not current or not test(current):
        return current, False
    n = 2
    while len(current) >= 2:
        chunk = len(current) / n
        parts = [current[round(i * chunk): round((i + 1) * chunk)] for i in range(n)]
        parts = [p for p in parts if p]
        for p in parts:  # reduce to a subset
            if test(p):
                current, n = p, 2
                break
        else:
            for p in parts:  # reduce to a complement
                rest = [i for i in current if i not in set(p)]
                if n > 2 and rest and test(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    return sorted(current), not coupled
