"""The per-op tracer, in the shape of torch's ``flop_counter``: a public context manager around
thin private modes (``dispatch.py``) and the parts it owns: the log of op rows (``oplog.py``),
each op's site (``sites.py``) from the module scope and the optimizer's phase (``scope.py``),
the non-finite findings (``findings.py``), the op rules (``rules.py``: registered, never written
into the mode) and the global functions replaced while tracing (``patches.py``).

NB: not reentrant; one ``Tracer`` per traced step. Statistics are computed with ``off`` set, so
the tensors they touch are neither traced nor tagged.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch
from torch._ops import OpOverload

from replay.trace.dispatch import (
    DispatchMode,
    FunctionMode,
    Off,
    _DirectDispatchMode,
    collect,
    compiled_frames,
    dispatch_mode,
    tensors,
)
from replay.trace.findings import STATUS, Findings
from replay.trace.oplog import NO_HIST, OpLog
from replay.trace.origins import Storages
from replay.trace.patches import Patches
from replay.trace.scope import ModuleScope, StepPhase
from replay.trace.sites import OpSite, Sites
from replay.trace.stats import NO_STATS

__all__ = ["Tracer", "TracerFault"]

# ``on_op`` is called by ``dispatch._dispatch``, which the code running the op called: in
# ``on_op``, ``sys._getframe(_OP_CALLER)`` is that code's frame, where the op ran.
_OP_CALLER = 2
_FINITE, _RAISED = STATUS["finite"], STATUS["raised"]


class TracerFault(BaseException):
    """The tracer's own work on an op's outputs failed (a bug in replay, not the step's
    error). A ``BaseException``, so that the step's own ``except Exception`` cannot take it for
    its error and go on with a half-traced step: ``trace_step`` raises it as ``TraceFailed``."""


class Tracer:
    """Records one step. Use as a context manager around the step; read its parts after.

    ``others``: the run's other models and optimizers by name (a GAN's netG and optG): their
    modules are named ``netG.<module>``, their optimizer steps are watched like the optimizer's.
    ``direct_dispatch``: the dispatch mode without dynamo's wrapper where nothing compiled may
    run (``dispatch.dispatch_mode``); ``compiled_during``: it was used and dynamo compiled in
    the step anyway (the trace then misses ops: the caller traces the step again without it).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        batch_keys: Storages,
        present_keys: Storages,
        cuda: bool = False,
        mask_keys: Storages | None = None,
        others: Sequence[tuple[str, object]] = (),
        direct_dispatch: bool = False,
        progress: Callable[[Tracer], None] | None = None,
    ) -> None:
        self.off = Off()
        self.objects = [model, *(obj for _, obj in others)]
        self.direct_dispatch = direct_dispatch
        self.compiled_during = False
        # plain tensors only (no DTensor or other subclass that needs torch functions to work):
        # the per-op bookkeeping runs with torch functions disabled, a few microseconds an op
        self.plain = all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in model.parameters())
        self.log = OpLog(cuda)
        if progress is not None:
            self.log.progress = lambda: progress(self)
        self.findings = Findings(batch_keys, present_keys, mask_keys or {})
        self.scope = ModuleScope(self.off, [("", model), *others])
        opts = [optimizer, *(o for _, o in others if isinstance(o, torch.optim.Optimizer))]
        self.phase = StepPhase(self.off, [o for o in opts if o is not None])
        self.sites = Sites(self.off, self.scope, self.phase)
        self.patches = Patches(
            self.off, self.sites, self.notice, (__file__, inspect.getfile(Sites))
        )
        self._modes: list[FunctionMode | DispatchMode] = []
        self._frames_before = -1

    def __enter__(self) -> Tracer:
        self.scope.__enter__()
        self.phase.__enter__()
        self.patches.__enter__()
        mode = dispatch_mode(self.off, self.on_op, self.objects, self.direct_dispatch)
        self._frames_before = compiled_frames() if type(mode) is _DirectDispatchMode else -1
        self._modes = [FunctionMode(self.off, self.sites.on_function), mode]
        for m in self._modes:
            m.__enter__()  # type: ignore[no-untyped-call]  # torch stubs
        # Whatever called the step runs in the frame that entered the tracer or outside it:
        # the `replay` command, click, a notebook. Stacks stop there.
        self.sites.locs.outer = sys._getframe(1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.sites.locs.outer = None
        self.sites.close()  # (a recomputed forward that never returned)
        for m in reversed(self._modes):
            m.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # torch stubs
        if self._frames_before >= 0 and compiled_frames() > self._frames_before:
            self.compiled_during = True
        self._modes = []
        self.scope.__exit__()
        self.phase.__exit__()
        self.log.stage.flush()
        self.patches.__exit__()
        self.log.memory.close()

    def notice(self, t: torch.Tensor, what: str, index: int | None = None) -> None:
        """Record that the step looked at ``t`` (``findings.Noticed``) if it holds NaN/Inf."""
        at = len(self.log) if index is None else index
        self.findings.notice(t, what, at, self.phase.closure)

    def on_op(
        self, func: OpOverload[..., object], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> object:
        info = self.log.op(func)
        if info.rule.skip:
            return func(*args, **kwargs)
        site = self.sites.site(info, len(self.log))
        ins: list[torch.Tensor] = []
        collect(args, ins)
        if kwargs:
            collect(kwargs, ins)
        mutated: list[object] = []
        if info.mutated or info.mutated_kw:
            mutated = [args[i] for i in info.mutated if i < len(args)]
            mutated += [kwargs[k] for k in info.mutated_kw if k in kwargs]
            self.log.mutating(mutated)
        pre_bad = self.findings.pre_bad(mutated)
        if info.rule.reads and ins:
            with self.off:
                self.notice(ins[0], info.rule.reads, site.index)
        t0 = time.perf_counter_ns()
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            with self.off:
                at = self.sites.locs.here(sys._getframe(_OP_CALLER), ran=True)[0]
                self.findings.raised_op(site.index, e, ins, at)
                self.log.append(site, _RAISED, self.log.shapes_of(ins), -1, NO_STATS, NO_HIST, 0)
            raise
        elapsed = time.perf_counter_ns() - t0
        try:
            self._measure(site, args, kwargs, ins, mutated, pre_bad, out, elapsed)
        except Exception as e:
            raise TracerFault(f"op {site.index} ({info.name}): {type(e).__name__}: {e}") from e
        return out

    def _measure(
        self,
        site: OpSite,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        ins: list[torch.Tensor],
        mutated: list[object],
        pre_bad: dict[int, bool],
        out: object,
        elapsed: int,
    ) -> None:
        """An op's outputs measured and classified, its row appended."""
        # Tensor methods below skip the function mode (not for subclasses: torch functions)
        with self.off, torch._C.DisableTorchFunction() if self.plain else nullcontext():
            outs = tensors(out) or [t for t in mutated if isinstance(t, torch.Tensor)]
            log = self.log
            row, hist, kinds, floats, staged, alias = log.measure(site, ins, outs)
            status = _FINITE
            if any(k != "finite" for k in kinds):
                nf = self.findings.classify(
                    site, (args, kwargs), ins, mutated, pre_bad, floats, kinds
                )
                status = STATUS[nf.role]
                if nf.detailed:  # a non-finite op described in full: where it ran, too
                    nf.executed_at = self.sites.locs.here(sys._getframe(_OP_CALLER), ran=True)[0]
            else:
                self.findings.finite(floats)
            ins_at, outs_at = log.shapes_of(ins), log.shapes_of(outs)
            log.append(site, status, ins_at, outs_at, row, hist, elapsed, staged, alias)
