"""Where and when each op runs (``OpSite``), decided before it runs.

- phase: ``backward`` while an autograd node is current (``torch._C._current_autograd_node()``),
  ``optimizer`` inside ``optimizer.step`` (``scope.StepPhase``), ``other`` after a backward op until
  the next module forward (``scope.py``), else ``forward``;
- module: the innermost module whose forward is running (``scope.py``); for backward ops, the
  module of the forward op that created the node, read from the node's ``metadata``;
- source: the innermost user frame (``source.py`` decides what is user code); for backward ops
  the forward creation site. The torch function running (seen by the function mode) gives the
  site of the ops it runs and of the autograd nodes it makes, which it tags (``tag``); custom
  ``autograd.Function``\\ s are tagged at ``.apply`` (``patches.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch.autograd.graph import Node

from replay.store.contracts import Phase
from replay.trace.dispatch import FunctionMode, Off
from replay.trace.rules import OpInfo
from replay.trace.scope import ModuleScope, StepPhase
from replay.trace.source import Interner, Locations

__all__ = ["OpSite", "Sites", "Tag", "TAG", "FORWARD", "BACKWARD", "OPTIMIZER", "OTHER"]

# The phase column holds the codes of store.contracts.Phase (the forensics file's encoding).
FORWARD, BACKWARD, OPTIMIZER, OTHER = (p.code for p in Phase)
TAG = "replay.trace"  # key of our Tag in grad_fn.metadata
#: What ``Sites.tag`` stores under ``TAG`` in an autograd node's metadata: the forward op's
#: ``(module, location, stack, function)``; function: a custom ``autograd.Function``'s name.
Tag = tuple[int, int, int, str | None]
# ``site`` is called by ``Tracer.on_op``, called by the dispatch mode, called by the code running
# the op: ``sys._getframe(_OP_CALLER)`` is that code's frame (made only when it is needed).
_OP_CALLER = 3


@dataclass(slots=True)
class OpSite:
    """Where and when one op ran: one value per op, handed to what records it. ``module``,
    ``location``, ``stack`` and ``node`` index the string tables (-1: none); a backward op's
    location and stack are those of the forward op that made its node."""

    index: int  # the op's row in the table
    op: OpInfo
    phase: int  # a Phase code
    module: int
    location: int
    stack: int
    node: int  # the autograd node running it (backward ops), else -1
    closure: int  # the closure call it ran in (scope.StepPhase), -1: none


def _metadata(node: Node) -> dict[str, Any]:
    """An autograd node's metadata dict, free for any tool to write to (torch's stubs declare
    the property a method)."""
    return node.metadata  # type: ignore[return-value]  # torch stubs


class Sites:
    def __init__(self, off: Off, scope: ModuleScope, phase: StepPhase) -> None:
        self.off = off
        self.scope = scope
        self.phase = phase
        self.locs = Locations()
        self.nodes = Interner()
        # the torch function running (set by on_function) and its (location, stack), once known
        self.fn_frame: FrameType | None = None
        self.fn_site: tuple[int, int] | None = None
        # those of the function that started each backward a forward is recomputed in
        self._outer: list[tuple[FrameType | None, tuple[int, int] | None]] = []
        self._recompute_mode: FunctionMode | None = None
        scope.on_recompute = self.recompute

    def site(self, info: OpInfo, index: int) -> OpSite:
        node: Node | None = torch._C._current_autograd_node()  # None outside backward
        scope = self.scope
        if node is not None:
            scope.after_backward = True
            tag: Tag | None = _metadata(node).get(TAG)
            if scope.recomputed():
                # a module's forward run again by the backward (activation checkpointing):
                # where it runs, not where the node that runs it was made
                mod = scope.innermost()
                loc, stack = self._here()
                if loc == self._backward_site() and tag is not None:
                    # no user code in the recomputed forward (torch's own modules): the user
                    # frame found is the one that called backward; the node's forward site
                    # says more
                    loc, stack = tag[1], tag[2]
            elif tag is not None:
                mod, loc, stack, _ = tag
            else:
                mod = loc = stack = -1
            return OpSite(
                index, info, BACKWARD, mod, loc, stack, self.nodes(node.name()), self.phase.closure
            )
        # Inside optimizer.step with grad mode on is a closure's forward (Lightning runs the
        # last micro-batch's training_step in optimizer.step(closure)); the update itself
        # runs under no_grad.
        in_opt = self.phase.in_optimizer and not scope.stack and not torch.is_grad_enabled()
        phase = OPTIMIZER if in_opt else OTHER if scope.after_backward else FORWARD
        loc, stack = self._here()
        return OpSite(index, info, phase, scope.innermost(), loc, stack, -1, self.phase.closure)

    def _here(self) -> tuple[int, int]:
        if self.fn_frame is not None:
            return self._fn_site()
        return self.locs.here(sys._getframe(_OP_CALLER + 1))

    def on_function(
        self, func: Callable[..., object], args: Sequence[object], kwargs: dict[str, object]
    ) -> object:
        """A torch function (above autograd): its ops' site, and it tags the nodes it makes."""
        if self.fn_frame is not None:
            return func(*args, **kwargs)
        self.fn_frame, self.fn_site = sys._getframe(2), None  # the caller of the mode's handler
        try:
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                if out.grad_fn is not None:
                    self.tag(out.grad_fn, None)
            elif isinstance(out, (tuple, list)):
                for t in out:
                    if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                        self.tag(t.grad_fn, None)
            return out
        finally:
            self.fn_frame, self.fn_site = None, None

    def recompute(self, entering: bool) -> None:
        """A forward recomputed in the backward starts or ends (``scope.on_recompute``). The
        torch function running is the one that started the backward (Tensor.backward): inside
        the recomputed forward, torch functions are sites of their own again, and tag the nodes
        they make (the backward of the recomputed graph runs those nodes). The function mode is
        off for the whole backward (it is inside the handler of that torch function): it is
        entered again for the recomputed forward."""
        if entering:
            self._outer.append((self.fn_frame, self.fn_site))
            self.fn_frame = self.fn_site = None
            if self.scope.recomputing == 1 and not self.off.on:
                self._recompute_mode = FunctionMode(self.off, self.on_function)
                self._recompute_mode.__enter__()  # type: ignore[no-untyped-call]  # torch stubs
        else:
            self.fn_frame, self.fn_site = self._outer.pop()
            if not self.scope.recomputing:
                self.close()

    def close(self) -> None:
        """Leave the recomputed forward's function mode (also one that never returned)."""
        if self._recompute_mode is not None:
            self._recompute_mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            self._recompute_mode = None

    def _fn_site(self) -> tuple[int, int]:
        """``(location, stack)`` of the torch function running (``fn_frame``), found once per
        call: the ops it runs and the nodes it makes share it."""
        if self.fn_site is None:
            self.fn_site = self.locs.here(self.fn_frame)
        return self.fn_site

    def _backward_site(self) -> int:
        """The location of the torch function that started the backward a forward is being
        recomputed in (-1: none known)."""
        frame, site = self._outer[0] if self._outer else (None, None)
        if site is None and frame is not None:
            site = self.locs.here(frame)
            self._outer[0] = (frame, site)
        return site[0] if site is not None else -1

    def tag(self, node: Node, frame: FrameType | None, function: str | None = None) -> None:
        """Tag ``node`` (and untagged nodes it leads to, e.g. a weight's ``t()``) with the
        current module and the forward site: ``frame``'s, or (None) the torch function's."""
        if TAG in _metadata(node):
            return
        loc, stack = self.locs.here(frame) if frame is not None else self._fn_site()
        value: Tag = (self.scope.innermost(), loc, stack, function)
        todo = [node]
        while todo:
            n = todo.pop()
            md = _metadata(n)
            if TAG in md:
                continue
            md[TAG] = value
            for nxt, _ in n.next_functions:
                if nxt is not None and TAG not in _metadata(nxt) and nxt.next_functions:
                    todo.append(nxt)
