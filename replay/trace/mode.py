"""The per-op tracer: a private ``TorchDispatchMode`` that records every aten op, a
``TorchFunctionMode`` that tags autograd nodes with their forward site, module hooks and
optimizer hooks for attribution.

Attribution:

- phase: ``backward`` while an autograd node is current (``torch._C._current_autograd_node()``),
  ``optimizer`` inside ``optimizer.step`` (step pre/post hooks), ``other`` after a backward op
  until the next module forward (gradient clipping, GradScaler unscaling), else ``forward``;
- module: the innermost module whose forward is running (forward pre/post hooks on the model's
  own modules, looked up weakly); for backward ops, the module of the forward op that created the
  node, read from the node's ``metadata``;
- source: the innermost user frame (``source.py`` decides what is user code); for backward ops
  the forward creation site. Custom ``torch.autograd.Function``\\ s are tagged at ``.apply``
  (``Function.apply`` is wrapped while tracing and restored afterwards).

NB: not reentrant; one ``Tracer`` per traced step. Statistics are computed with ``self.off``
set, so the tensors they touch are neither traced nor tagged.
"""

from __future__ import annotations

import math
import sys
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from replay.store.contracts import OpStatus, Phase
from replay.trace.memory import MemoryTracker
from replay.trace.origins import Origins
from replay.trace.source import Interner, Locations
from replay.trace.stats import N_BINS, NAN_ROW, finite_kind, kind_of_row, tensor_stats

__all__ = ["Tracer", "FORWARD", "BACKWARD", "OPTIMIZER", "OTHER", "TAG"]

# The phase column holds the codes of store.contracts.Phase (the forensics file's encoding).
FORWARD, BACKWARD, OPTIMIZER, OTHER = (p.code for p in Phase)
TAG = "replay.trace"  # key of our tag in grad_fn.metadata: (module, location, stack, function)
MAX_DETAILED = 64  # non-finite ops whose inputs get full statistics
SINGLE_THREAD_NUMEL = 1 << 20
_NO_HIST = np.zeros(N_BINS, dtype=np.float32)


@dataclass
class _OpInfo:
    name: str
    index: int
    mutated: tuple[int, ...]  # positions of arguments the op writes to
    mutated_kw: tuple[str, ...]


@dataclass
class NonFinite:
    """What the tracer knows about an op whose output was not finite."""

    role: str  # producer | converter | propagator | exempt (see origins.py)
    klass: str
    origins: frozenset[int]
    out_kind: str
    inputs: list[dict] = field(default_factory=list)
    output: dict = field(default_factory=dict)
    executed_at: int = -1


def _tensors(x: object) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _arg_kind(args: object) -> str:
    """The non-tensor arguments' kind, as ``finite_kind`` says for tensors: a fill value of
    ``-inf`` is "neginf", one of NaN "nan"."""
    kind = "finite"
    for a in tree_flatten(args)[0]:
        if isinstance(a, float) and not math.isfinite(a):
            if a != a:
                return "nan"
            kind = "inf" if a > 0 or kind == "inf" else "neginf"
    return kind


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype)[6:]}[{','.join(map(str, t.shape))}]@{t.device}"


class _DispatchMode(TorchDispatchMode):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.tracer.off or func.namespace == "profiler":  # record_function markers
            return func(*args, **kwargs)
        return self.tracer.on_op(func, args, kwargs)


class _FunctionMode(TorchFunctionMode):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tr = self.tracer
        if tr.off or tr.fn_frame is not None:
            return func(*args, **kwargs)
        tr.fn_frame, tr.fn_site = sys._getframe(1), None
        try:
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                if out.grad_fn is not None:
                    tr.tag(out.grad_fn, None)
            elif isinstance(out, (tuple, list)):
                for t in out:
                    if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                        tr.tag(t.grad_fn, None)
            return out
        finally:
            tr.fn_frame, tr.fn_site = None, None


class Tracer:
    """Records one step. Use as a context manager around the step; read the columns after."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer,
        batch_keys: set,
        present_keys: set,
        cuda: bool = False,
        mask_keys: set | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.off = False
        self.fn_frame = None
        self.fn_site: tuple[int, int] | None = None
        self.locs = Locations()
        self.op_names = Interner()
        self.modules = Interner()
        self.shapes = Interner()
        self.nodes = Interner()
        self.origins = Origins()
        self.origins.batch_keys = batch_keys
        self.origins.present_keys = present_keys
        self.origins.mask_keys = mask_keys or set()
        self.memory = MemoryTracker(cuda)
        cols = (
            "phase",
            "name",
            "module",
            "source",
            "stack",
            "node",
            "status",
            "inputs",
            "outputs",
            "mem_bytes",
            "time_ns",
        )
        self.cols: dict[str, list] = {c: [] for c in cols}
        self.stats: list[tuple] = []
        self.hist: list[np.ndarray] = []
        self.nonfinite: dict[int, NonFinite] = {}
        self.raised: list[tuple[int, BaseException, list[dict], int]] = []
        self.module_acts: dict[int, tuple] = {}  # module index -> activation row
        self.in_optimizer = False
        self.after_backward = False
        self.on_optimizer_pre = None  # callback, set by the caller
        self._module_stack: list[int] = []
        self._module_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._opinfo: dict = {}
        self._shape_key: dict[tuple, int] = {}
        self._handles: list = []
        self._modes: list = []
        self._apply = None

    # ---------------------------------------------------------------- setup and teardown
    def __enter__(self) -> Tracer:
        for name, mod in self.model.named_modules():
            self._module_names[mod] = self.modules(name)
            self._handles.append(mod.register_forward_pre_hook(self._pre_forward))
            self._handles.append(mod.register_forward_hook(self._post_forward, always_call=True))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._pre_step))
            self._handles.append(self.optimizer.register_step_post_hook(self._post_step))
        self._patch_function_apply()
        self._modes = [_FunctionMode(self), _DispatchMode(self)]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        self._modes = []
        for h in self._handles:
            h.remove()
        self._handles = []
        fn = torch.autograd.function.Function
        if self._apply is not None:
            fn.apply = self._apply
            self._apply = None
        self.memory.finish()
        self.memory.close()

    def _patch_function_apply(self) -> None:
        fn = torch.autograd.function.Function
        original = fn.__dict__["apply"]
        self._apply = original
        tracer = self

        def apply(cls, *args, **kwargs):
            out = original.__func__(cls, *args, **kwargs)
            if tracer.off:
                return out
            tracer.off = True  # grad_fn lookups go through torch functions too
            try:
                for t in _tensors(out):
                    if t.grad_fn is not None:
                        tracer.tag(t.grad_fn, sys._getframe(1), function=cls.__name__)
                        break
            finally:
                tracer.off = False
            return out

        fn.apply = classmethod(apply)

    # ---------------------------------------------------------------- hooks
    def _pre_forward(self, mod, args):
        self._module_stack.append(self._module_names.get(mod, -1))
        self.after_backward = False

    def _post_forward(self, mod, args, out):
        if self._module_stack:
            self._module_stack.pop()
        if self.off:
            return
        ts = [t for t in _tensors(out) if t.is_floating_point()]
        if ts:
            self.off = True
            try:
                with torch.no_grad():
                    row, _ = tensor_stats(ts[0], hist=False)
                n = max(row[9], 1.0)
                bad = row[5] + row[6] + row[7]
                self.module_acts[self._module_names.get(mod, -1)] = (
                    row[2],
                    row[3],
                    row[4],
                    row[8] / n,
                    bad,
                )
            finally:
                self.off = False

    def _pre_step(self, opt, args, kwargs):
        if self.on_optimizer_pre is not None and not self.in_optimizer:
            self.off = True
            try:
                self.on_optimizer_pre()
            finally:
                self.off = False
        self.in_optimizer = True

    def _post_step(self, opt, args, kwargs):
        self.in_optimizer = False

    # ---------------------------------------------------------------- attribution
    def _site(self) -> tuple[int, int]:
        if self.fn_frame is not None:
            if self.fn_site is None:
                self.fn_site = self.locs.here(self.fn_frame)
            return self.fn_site
        return self.locs.here(sys._getframe(3))

    def tag(self, node, frame, function: str | None = None) -> None:
        """Tag ``node`` (and untagged nodes it leads to, e.g. a weight's ``t()``) with the
        current module and the forward site."""
        if TAG in node.metadata:
            return
        loc, stack = self.locs.here(frame) if frame is not None else self._site()
        mod = self._module_stack[-1] if self._module_stack else -1
        value = (mod, loc, stack, function)
        todo = [node]
        while todo:
            n = todo.pop()
            md = n.metadata
            if TAG in md:
                continue
            md[TAG] = value
            for nxt, _ in n.next_functions:
                if nxt is not None and TAG not in nxt.metadata and nxt.next_functions:
                    todo.append(nxt)

    def _opinfo_of(self, func) -> _OpInfo:
        info = self._opinfo.get(func)
        if info is None:
            schema = func._schema
            name = schema.name if "::" in schema.name else f"aten::{schema.name}"
            pos, kw = [], []
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    (kw if a.kwarg_only else pos).append(i if not a.kwarg_only else a.name)
            info = self._opinfo[func] = _OpInfo(name, self.op_names(name), tuple(pos), tuple(kw))
        return info

    def _shapes(self, ts: list[torch.Tensor]) -> int:
        key = tuple((t.dtype, t.shape, t.device) for t in ts)
        i = self._shape_key.get(key)
        if i is None:
            i = self._shape_key[key] = self.shapes(", ".join(_describe(t) for t in ts))
        return i

    # ---------------------------------------------------------------- the op
    def on_op(self, func, args, kwargs):
        index = len(self.stats)
        info = self._opinfo_of(func)
        node = torch._C._current_autograd_node()
        tag = node.metadata.get(TAG) if node is not None else None
        if node is not None:
            phase = BACKWARD
            self.after_backward = True
            mod, loc, stack = tag[:3] if tag is not None else (-1, -1, -1)
            node_idx = self.nodes(node.name())
        else:
            # Inside optimizer.step with grad mode on is a closure's forward (Lightning runs the
            # last micro-batch's training_step in optimizer.step(closure)); the update itself
            # runs under no_grad.
            in_opt = self.in_optimizer and not self._module_stack and not torch.is_grad_enabled()
            phase = OPTIMIZER if in_opt else OTHER if self.after_backward else FORWARD
            mod = self._module_stack[-1] if self._module_stack else -1
            loc, stack = self._site()
            node_idx = -1
        ins = _tensors((args, kwargs))
        mutated = [args[i] for i in info.mutated if i < len(args)]
        mutated += [kwargs[k] for k in info.mutated_kw if k in kwargs]
        pre_bad = (
            {id(t): self.origins.known_bad(t) for t in mutated if isinstance(t, torch.Tensor)}
            if self.origins.by_storage
            else {}
        )
        t0 = time.perf_counter_ns()
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            self.off = True
            try:
                self._record_raise(index, info, e, ins, phase, mod, loc, stack, node_idx)
            finally:
                self.off = False
            raise
        elapsed = time.perf_counter_ns() - t0
        self.off = True
        try:
            outs = _tensors(out) or [t for t in mutated if isinstance(t, torch.Tensor)]
            self._record(
                index,
                info,
                (args, kwargs),
                ins,
                outs,
                mutated,
                pre_bad,
                phase,
                mod,
                loc,
                stack,
                node_idx,
                elapsed,
            )
        finally:
            self.off = False
        return out

    def _append(
        self,
        index,
        info,
        phase,
        mod,
        loc,
        stack,
        node_idx,
        status,
        ins_idx,
        outs_idx,
        row,
        hist,
        elapsed,
    ) -> None:
        c = self.cols
        c["phase"].append(phase)
        c["name"].append(info.index)
        c["module"].append(mod)
        c["source"].append(loc)
        c["stack"].append(stack)
        c["node"].append(node_idx)
        c["status"].append(status)
        c["inputs"].append(ins_idx)
        c["outputs"].append(outs_idx)
        c["time_ns"].append(elapsed)
        self.stats.append(row)
        self.hist.append(hist)
        c["mem_bytes"].append(self.memory.after_op(index))

    def _record(
        self,
        index,
        info,
        call,
        ins,
        outs,
        mutated,
        pre_bad,
        phase,
        mod,
        loc,
        stack,
        node_idx,
        elapsed,
    ) -> None:
        for t in ins:
            self.memory.see(t, index, info.name)
        for t in outs:
            self.memory.see(t, index, info.name)
        floats = [t for t in outs if t.is_floating_point()]
        main = floats[0] if floats else (outs[0] if outs else None)
        # Small reductions are latency-bound: an OpenMP fork/join per reduction costs more
        # than the work (and ms on a busy machine). Restored before the next user op runs.
        threads = torch.get_num_threads()
        single = threads > 1 and (main is None or main.numel() < SINGLE_THREAD_NUMEL)
        if single:
            torch.set_num_threads(1)
        try:
            if main is not None:
                row, hist = tensor_stats(main)
            else:
                row, hist = (*NAN_ROW, 0.0), _NO_HIST
            kinds = [kind_of_row(row)] if floats else []
            kinds += [finite_kind(t) for t in floats[1:]]
        finally:
            if single:
                torch.set_num_threads(threads)
        status = OpStatus.FINITE.code
        if any(k != "finite" for k in kinds):
            out_kind = "nan" if "nan" in kinds else "inf" if "inf" in kinds else "neginf"
            status = self._nonfinite(
                index, info, call, ins, mutated, pre_bad, floats, kinds, out_kind
            )
        elif self.origins.by_storage:
            for t in floats:
                self.origins.set_output(t, None)
        self._append(
            index,
            info,
            phase,
            mod,
            loc,
            stack,
            node_idx,
            status,
            self._shapes(ins),
            self._shapes(outs),
            row,
            hist,
            elapsed,
        )

    def _nonfinite(self, index, info, call, ins, mutated, pre_bad, floats, kinds, out_kind) -> int:
        mutated_ids = {id(t) for t in mutated}
        checked = []
        for t in ins:
            if not t.is_floating_point():
                continue
            if id(t) in mutated_ids:
                k = "nan" if pre_bad.get(id(t)) else "finite"  # its value before the op
            else:
                k = finite_kind(t)
            checked.append((t, k))
        role, klass, origins = self.origins.classify(
            index, info.name, checked, out_kind, _arg_kind(call)
        )
        for t, k in zip(floats, kinds):
            self.origins.set_output(t, origins if k != "finite" else None)
        nf = NonFinite(role, klass, origins, out_kind)
        main = floats[0]
        nf.output = {
            "shape": list(main.shape),
            "dtype": str(main.dtype)[6:],
            "device": str(main.device),
        }
        if len(self.nonfinite) < MAX_DETAILED or role == "producer":
            nf.inputs = [self._input_info(t) for t in ins]
            nf.executed_at = self.locs.here(sys._getframe(4))[0]
        self.nonfinite[index] = nf
        return (
            OpStatus.EXEMPT
            if role == "exempt"
            else OpStatus.PRODUCER
            if role == "producer"
            else OpStatus.PROPAGATOR
        ).code

    def _input_info(self, t: torch.Tensor) -> dict:
        d = {"shape": list(t.shape), "dtype": str(t.dtype)[6:], "device": str(t.device)}
        if t.numel() <= 1 << 24:
            row, _ = tensor_stats(t, hist=False)
            d["stats"] = dict(
                zip(
                    (
                        "min",
                        "max",
                        "mean",
                        "std",
                        "absmax",
                        "nan",
                        "posinf",
                        "neginf",
                        "zeros",
                        "numel",
                    ),
                    row,
                )
            )
        return d

    def _record_raise(self, index, info, exc, ins, phase, mod, loc, stack, node_idx) -> None:
        inputs = [self._input_info(t) for t in ins]
        executed = self.locs.here(sys._getframe(3))[0]
        self.raised.append((index, exc, inputs, executed))
        self._append(
            index,
            info,
            phase,
            mod,
            loc,
            stack,
            node_idx,
            3,
            self._shapes(ins),
            -1,
            (*NAN_ROW, 0.0),
            _NO_HIST,
            0,
        )
