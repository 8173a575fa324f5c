"""Every optimizer's param-group hyper-parameters, taken before each step (docs/format.md,
``/steps``: ``hparams`` for the run's optimizer, ``object_hparams`` for each other one).

A scheduler stepped outside the step function changes them between steps (a GAN's two
optimizers, an encoder's and a decoder's), so a replay needs them at every step. On the
training thread: one tuple of each group's entries, compared with the last step's; a copy is
made only when one changed, and the same copy is handed over otherwise (the step log then
reuses its encoding). No device sync: a tensor entry is copied like the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .objects import RunObjects, inner_optimizer, optimizers
from .tensors import CopyStats, copy_tree

__all__ = ["HyperParams", "put_back"]

_MISSING = object()


class _Groups:
    """One optimizer's groups: the entries last seen, and the copy taken of them."""

    def __init__(self) -> None:
        self.items: Any = None
        self.tensors = False
        self.copy: list[dict[str, Any]] | None = None

    def take(self, optimizer: Any, copied: CopyStats) -> list[dict[str, Any]]:
        groups = optimizer.param_groups
        if self.copy is not None and not self.tensors and self._same(groups):
            return self.copy
        items = tuple(
            tuple(
                (k, tuple(v) if isinstance(v, list) else v) for k, v in g.items() if k != "params"
            )
            for g in groups
        )
        self.tensors = any(isinstance(v, torch.Tensor) for it in items for _, v in it)
        self.items = items
        self.copy = copy_tree([dict(it) for it in items], stats=copied)
        return self.copy

    def _same(self, groups: list[dict[str, Any]]) -> bool:
        """Whether every group holds the entries last seen: each the same object, or an equal
        one (a scheduler writes a new float each step; most entries never change)."""
        if len(groups) != len(self.items):
            return False
        for g, last in zip(groups, self.items):
            if len(g) != len(last) + 1:  # (+ params)
                return False
            for k, v in last:
                x = g.get(k, _MISSING)
                if x is not v and (tuple(x) if type(x) is list else x) != v:
                    return False
        return True


class HyperParams:
    """The hyper-parameters of the run's optimizer and of every other named optimizer
    (``capture.objects.optimizers``), taken at each step."""

    def __init__(self, optimizer: Any, others: dict[str, Any]) -> None:
        self._optimizer = optimizer
        self._main = _Groups()
        seen = {id(optimizer), id(inner_optimizer(optimizer))}
        self._others: dict[str, tuple[Any, _Groups]] = {}
        for k, o in others.items():  # (a scheduler's own optimizer is one of them already)
            if id(o) not in seen:
                seen.add(id(o))
                self._others[k] = (o, _Groups())
        # ``{name: groups}`` of the other optimizers at the last step taken (``None``: none)
        self.others: dict[str, list[dict[str, Any]]] | None = None

    def take(self, copied: CopyStats) -> list[dict[str, Any]]:
        """The run's optimizer's groups for this step's record (``[]`` without one); the other
        optimizers' are then in :attr:`others`. Each is the very object handed over last time
        while nothing in it changed."""
        main = self._main.take(self._optimizer, copied) if self._optimizer is not None else []
        if self._others:
            now = {k: g.take(opt, copied) for k, (opt, g) in self._others.items()}
            last = self.others
            if last is None or any(now[k] is not last[k] for k in now):
                self.others = now
        return main


def put_back(objects: RunObjects, recorded: Any, convert: Callable[[Any], Any]) -> None:
    """A replay's side: set each other named optimizer's groups to a step's ``object_hparams``
    (``convert``: a recorded leaf to the value the group holds). An optimizer the replay does
    not have, or whose group count differs, is left as the snapshot made it."""
    if not isinstance(recorded, dict):
        return
    live = optimizers(objects)
    for name, groups in recorded.items():
        opt = live.get(name) if name != "optimizer" else None
        if opt is None or not isinstance(groups, list) or len(groups) != len(opt.param_groups):
            continue
        for g, h in zip(opt.param_groups, groups):
            for k, v in h.items() if isinstance(h, dict) else ():
                g[k] = convert(v)
