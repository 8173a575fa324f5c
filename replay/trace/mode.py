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
  the forward creation site;
- closure: which call of the closure handed to ``optimizer.step(closure)`` (LBFGS calls it many
  times in one step) the op ran in, counted from 0; -1 outside any closure call. The optimizer's
  step pre-hook hands ``step`` a wrapped closure that counts its calls.

Where a non-finite value is *noticed* besides the sinks ``step.py`` checks (``Noticed``): a
backward started from it (each closure call's loss), a Python number read off it (``.item()``,
``float()``: LBFGS compares losses that way), an op that raised on it. The verdict looks for the
first producer over all of them, not only over the first sink. Custom ``torch.autograd.Function``\\ s are tagged at ``.apply``
  (``Function.apply`` is wrapped while tracing and restored afterwards).

A warning that torch raises from inside an op (``TORCH_WARN``: ``std()`` of one value) names
the innermost Python frame, which is the tracer's own while it runs the op: while tracing, such
a warning is shown at the user's line that ran the op instead (``Tracer._attribute_warnings``).

NB: not reentrant; one ``Tracer`` per traced step. Statistics are computed with ``self.off``
set, so the tensors they touch are neither traced nor tagged.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, NamedTuple, TypedDict

import numpy as np
import torch
from torch._ops import OpOverload
from torch.autograd.graph import Node
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from replay.store.contracts import OpStatus, Phase
from replay.trace.memory import MemoryTracker
from replay.trace.origins import Origins, Storages, storage_key
from replay.trace.source import Interner, Locations
from replay.trace.spool import NonFiniteTable, OpSpool
from replay.trace.staged import STAGE_MAX, Stage, copy_small, quick_finite
from replay.trace.stats import (
    N_BINS,
    NO_STATS,
    Stats,
    finite_kind,
    kind_of_row,
    np_stats,
    quiet_numpy,
    tensor_stats,
)

__all__ = [
    "Tracer",
    "OpSite",
    "NonFinite",
    "RaisedOp",
    "Activation",
    "TensorInfo",
    "InputInfo",
    "Tag",
    "Noticed",
    "FORWARD",
    "BACKWARD",
    "OPTIMIZER",
    "OTHER",
    "TAG",
]

# The phase column holds the codes of store.contracts.Phase (the forensics file's encoding), the
# status column those of OpStatus.
FORWARD, BACKWARD, OPTIMIZER, OTHER = (p.code for p in Phase)
_FINITE, _PRODUCER, _PROPAGATOR, _RAISED, _EXEMPT = (s.code for s in OpStatus)
TAG = "replay.trace"  # key of our Tag in grad_fn.metadata
#: What ``Tracer.tag`` stores under ``TAG`` in an autograd node's metadata: the forward op's
#: ``(module, location, stack, function)``; function: a custom ``autograd.Function``'s name.
Tag = tuple[int, int, int, str | None]
PROGRESS_ROWS = 1 << 12  # ops between two progress calls (and checks of the spool's buffer)
MAX_DETAILED = 64  # non-finite ops whose inputs get full statistics
SINGLE_THREAD_NUMEL = 1 << 20
_NO_HIST = np.zeros(N_BINS, dtype=np.float32)
# ``on_op`` is called by ``_DispatchMode.__torch_dispatch__``, which the code running the op
# called: in ``on_op``, ``sys._getframe(_OP_CALLER)`` is that code's frame, where the op ran.
# Only ``on_op`` reads it, and only when it needs it (a frame object is made on demand).
_OP_CALLER = 2
#: Ops whose output holds exactly the values of their first input, in another shape or order
#: (the same multiset when the sizes agree): statistics of one are those of the other.
ALIAS_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "t", "transpose", "permute", "view", "_unsafe_view", "reshape", "_reshape_alias",
        "detach", "alias", "squeeze", "unsqueeze", "flatten", "unflatten", "numpy_T", "mT",
        "matrix_H", "view_as", "reshape_as", "movedim", "swapaxes", "swapdims", "lift_fresh",
    )
)  # fmt: skip
_ShapeKey = tuple[tuple[torch.dtype, torch.Size, int], ...]  # int: get_device(), -1 the CPU


@dataclass
class _OpInfo:
    name: str
    index: int
    mutated: tuple[int, ...]  # positions of arguments the op writes to
    mutated_kw: tuple[str, ...]
    alias: bool = False  # in ALIAS_OPS: its output holds its first input's values, re-viewed


@dataclass(slots=True)
class OpSite:
    """Where and when one op ran, decided before it runs: one value per op, handed to what
    records it. ``module``, ``location``, ``stack`` and ``node`` index the string tables (-1:
    none); a backward op's location and stack are those of the forward op that made its node.
    """

    index: int  # the op's row in the table
    op: _OpInfo
    phase: int  # a Phase code
    module: int
    location: int
    stack: int
    node: int  # the autograd node running it (backward ops), else -1


class TensorInfo(TypedDict):
    """A tensor named in the verdict: ``{"shape", "dtype" (float32), "device"}``."""

    shape: list[int]
    dtype: str
    device: str


class InputInfo(TensorInfo, total=False):
    """A failing op's input, with its statistics (``STATS_COLUMNS``) unless it is too large."""

    stats: dict[str, float]


class Activation(NamedTuple):
    """A module's output in the traced step (its first floating tensor): the ``act_*`` columns
    of the module table."""

    mean: float
    std: float
    absmax: float
    zero_frac: float
    nonfinite: float  # NaN, +inf and -inf values


@dataclass(slots=True)
class NonFinite:
    """What the tracer knows about an op whose output was not finite."""

    role: str  # producer | converter | propagator | exempt (see origins.py)
    klass: str
    origins: frozenset[int]
    out_kind: str
    output: TensorInfo | None  # its first floating output (None unless ``detailed``)
    # Filled for the first MAX_DETAILED of them, and for every producer (``detailed``): the
    # inputs with their statistics, and the location of the code that ran the op.
    inputs: list[InputInfo] = field(default_factory=list)
    executed_at: int = -1
    detailed: bool = False


@dataclass(frozen=True)
class Noticed:
    """A non-finite value that something in the step looked at: ``what`` ("the loss of a
    backward", "a Python number read by .item()"), ``index``: the op row at which it was seen
    (the next op's, for a backward's root), ``origins``: where its values came from."""

    what: str
    index: int
    origins: frozenset[int]


@dataclass
class RaisedOp:
    """An op that raised: its row, the exception (set to None once the verdict is built: its
    traceback holds the step's frames), its inputs and the location of the code that ran it."""

    index: int
    exc: BaseException | None
    inputs: list[InputInfo]
    executed_at: int
    bad_origins: frozenset[int] = frozenset()  # origins of its non-finite inputs, if any


def _tensors(x: object) -> list[torch.Tensor]:
    """The tensors in an op's arguments or results: nested tuples, lists and dicts walked by
    hand (pytree's general flattening cost more than many small ops themselves)."""
    out: list[torch.Tensor] = []
    _collect(x, out)
    return out


def _collect(x: object, out: list[torch.Tensor]) -> None:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (tuple, list)):
        for y in x:
            if isinstance(y, torch.Tensor):
                out.append(y)
            elif isinstance(y, (tuple, list, dict)):
                _collect(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _collect(y, out)


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


def _kind(t: torch.Tensor) -> str:
    """``finite_kind``, with one sum over a small tensor's copy when that says finite."""
    a = copy_small(t)
    return "finite" if a is not None and quick_finite(a) else finite_kind(t)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype)[6:]}[{','.join(map(str, t.shape))}]@{t.device}"


def _metadata(node: Node) -> dict[str, Any]:
    """An autograd node's metadata dict, free for any tool to write to (torch's stubs declare
    the property a method)."""
    return node.metadata  # type: ignore[return-value]  # torch stubs


def _tensor_info(t: torch.Tensor) -> TensorInfo:
    return {"shape": list(t.shape), "dtype": str(t.dtype)[6:], "device": str(t.device)}


def _dispatch(
    self: _DispatchMode,
    func: OpOverload[..., object],
    types: Collection[type],
    args: tuple[object, ...] = (),
    kwargs: dict[str, object] | None = None,
) -> object:
    """Both modes' ``__torch_dispatch__``: every op to the tracer, but its own and profiler
    markers."""
    kwargs = kwargs or {}
    if self.tracer.off or func.namespace == "profiler":  # record_function markers
        return func(*args, **kwargs)
    return self.tracer.on_op(func, args, kwargs)


class _DispatchMode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch: untyped __init_subclass__
    """Called through dynamo's disable wrapper, which ``TorchDispatchMode.__init_subclass__``
    puts around a subclass's own ``__torch_dispatch__``."""

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch stubs
        self.tracer = tracer

    __torch_dispatch__ = _dispatch


class _DirectDispatchMode(_DispatchMode):  # type: ignore[no-untyped-call]  # as above
    """The same mode, its ``__torch_dispatch__`` called as it is instead of through dynamo's
    disable wrapper (about 6 us an op on the LSTMCell x LBFGS step, idle). Not where
    compiled code may run: a re-entered compiled model's trace then named no op."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    __torch_dispatch__ = _dispatch


def _compiled_frames() -> int:
    """How many frames dynamo has compiled in this process (0 before it was imported)."""
    dynamo = sys.modules.get("torch._dynamo")
    return int(dynamo.utils.counters.get("frames", {}).get("total", 0)) if dynamo else 0


def _dispatch_mode(tracer: Tracer) -> _DispatchMode:
    """The unwrapped mode unless compiled code may run in the step: dynamo compiled a frame
    before, or a watched module is compiled. (Not "dynamo imported": every optimizer's
    constructor imports it.) A step that first compiles inside the trace gets the unwrapped
    mode, which misses the compiled ops: ``Tracer.compiled_during`` says so, and the step is
    traced again with the wrapped one."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        optimized = dynamo.eval_frame.OptimizedModule
        objects = [tracer.model, *(obj for _, obj in tracer.others)]
        if _compiled_frames() or any(isinstance(o, optimized) for o in objects):
            return _DispatchMode(tracer)
    return _DirectDispatchMode(tracer)


class _FunctionMode(TorchFunctionMode):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: Collection[type],
        args: Sequence[object] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
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
        optimizer: torch.optim.Optimizer | None,
        batch_keys: Storages,
        present_keys: Storages,
        cuda: bool = False,
        mask_keys: Storages | None = None,
        others: Sequence[tuple[str, object]] = (),
        direct_dispatch: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        # the dispatch mode without dynamo's wrapper where nothing compiled may run (see
        # _dispatch_mode); ``compiled_during``: it was used and dynamo compiled in the step
        # anyway (the trace then misses ops: the caller traces the step again without it)
        self.direct_dispatch = direct_dispatch
        self.compiled_during = False
        self._frames_before = 0
        # The run's other models and optimizers by name (a GAN's netG and optG): their modules
        # are named ``netG.<module>``, their optimizer steps are watched like the optimizer's.
        self.others = list(others)
        self.off = False
        # plain tensors only (no DTensor or other subclass that needs torch functions to work):
        # the per-op bookkeeping runs with torch functions disabled, a few microseconds an op
        self.plain = all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in model.parameters())
        # the torch function running (set by _FunctionMode) and its (location, stack), once known
        self.fn_frame: FrameType | None = None
        self.fn_site: tuple[int, int] | None = None
        self.locs = Locations()
        self.op_names = Interner()
        self.modules = Interner()
        self.shapes = Interner()
        self.nodes = Interner()
        self.origins = Origins()
        self.origins.batch_keys = batch_keys
        self.origins.present_keys = present_keys
        self.origins.mask_keys = mask_keys or {}
        self.memory = MemoryTracker(cuda)
        # the op table, streamed to files as it grows (spool.py): a step of millions of ops
        # is traced in bounded memory
        self.cols = OpSpool()
        # statistics of small finite outputs, measured in batches (staged.py) and written
        # into their rows before the rows leave the spool's buffer
        self.stage = Stage(self._write_staged, self._copy_staged)
        # Staged values seen in each storage, by storage key and data pointer: (numel, version,
        # dtype, row). An op that only re-views those values (``ALIAS_OPS``: ``t()``
        # of a weight at every step of an unrolled RNN) gets that row's statistics. A mutation
        # bumps the version (and drops the entry: ``.data`` has a version of its own); a
        # storage let go (the memory tracker's count of its tensors fell to 0) drops it too,
        # before its address can be reused.
        self._values: dict[int, dict[int, tuple[int, int, torch.dtype, int]]] = {}
        self.memory.on_free = self._forget
        self.progress: Callable[[Tracer], None] | None = None  # told every PROGRESS_ROWS ops
        # every non-finite op, a few bytes each (spool.NonFiniteTable); full records for the
        # first MAX_DETAILED and every producer
        self.nonfinite = NonFiniteTable(
            lambda role, klass, origins: NonFinite(role, klass, origins, "", None)
        )
        self._origin_sets: dict[frozenset[int], frozenset[int]] = {}
        self.raised: list[RaisedOp] = []
        self.module_acts: dict[int, Activation] = {}  # module index -> its output
        self.noticed: list[Noticed] = []
        self.in_optimizer = False
        self.after_backward = False
        self.closure = -1  # the closure call running (see the module docstring), -1: none
        self.closure_calls = 0
        self.on_closure: Callable[[int], None] | None = None  # told each closure call's index
        self.on_optimizer_pre: Callable[[], None] | None = None  # set by the caller
        self._module_stack: list[int] = []
        # how many modules on the stack were entered while an autograd node ran: a forward run
        # again inside the backward (activation checkpointing recomputes its blocks there)
        self._recomputing = 0
        self._entered_in_backward: list[bool] = []
        self._outer_fn: list[tuple[FrameType | None, tuple[int, int] | None]] = []
        self._recompute_mode: _FunctionMode | None = None
        self._module_names: weakref.WeakKeyDictionary[torch.nn.Module, int] = (
            weakref.WeakKeyDictionary()
        )
        self._opinfo: dict[OpOverload[..., object], _OpInfo] = {}
        self._shape_key: dict[_ShapeKey, int] = {}
        self._handles: list[RemovableHandle] = []
        self._modes: list[_FunctionMode | _DispatchMode] = []
        self._apply: object = None  # Function.apply as it was, while it is patched
        self._backward: object = None  # torch.autograd.backward as it was, while patched
        self._showwarning: Callable[..., None] | None = None  # ours, while it is installed
        self._quiet = quiet_numpy()

    # ---------------------------------------------------------------- setup and teardown
    def __enter__(self) -> Tracer:
        named = list(self.model.named_modules())
        for prefix, obj in self.others:
            if isinstance(obj, torch.nn.Module):
                named += [(f"{prefix}.{n}" if n else prefix, m) for n, m in obj.named_modules()]
        for name, mod in named:
            if mod in self._module_names:
                continue  # (a module the model holds too keeps the model's name)
            self._module_names[mod] = self.modules(name)
            self._handles.append(mod.register_forward_pre_hook(self._pre_forward))
            self._handles.append(mod.register_forward_hook(self._post_forward, always_call=True))
        opts = [
            self.optimizer,
            *(o for _, o in self.others if isinstance(o, torch.optim.Optimizer)),
        ]
        for opt in opts:
            if opt is not None:
                self._handles.append(opt.register_step_pre_hook(self._pre_step))
                self._handles.append(opt.register_step_post_hook(self._post_step))
        self._patch_function_apply()
        self._patch_backward()
        self._attribute_warnings()
        self._quiet.__enter__()
        mode = _dispatch_mode(self) if self.direct_dispatch else _DispatchMode(self)
        self._frames_before = _compiled_frames() if type(mode) is _DirectDispatchMode else -1
        self._modes = [_FunctionMode(self), mode]
        for m in self._modes:
            m.__enter__()  # type: ignore[no-untyped-call]  # torch stubs
        # Whatever called the step runs in the frame that entered the tracer or outside it:
        # the `replay` command, click, a notebook. Stacks stop there.
        self.locs.outer = sys._getframe(1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.locs.outer = None
        if self._recompute_mode is not None:  # (a recomputed forward that never returned)
            self._recompute_mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            self._recompute_mode = None
        for m in reversed(self._modes):
            m.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # torch stubs
        if self._frames_before >= 0 and _compiled_frames() > self._frames_before:
            self.compiled_during = True
        self._modes = []
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._apply is not None:
            # restored with setattr, as it was patched: an assignment reads to mypy as
            # overriding a method
            setattr(torch.autograd.function.Function, "apply", self._apply)  # noqa: B010
            self._apply = None
        if self._backward is not None:
            setattr(torch.autograd, "backward", self._backward)  # noqa: B010
            self._backward = None
        if self._showwarning is not None:
            if warnings.showwarning is self._showwarning:  # (not if the step replaced it since)
                warnings.showwarning = self._showwarning.__wrapped__  # type: ignore[attr-defined]
            self._showwarning = None
        self.stage.flush()
        self._quiet.__exit__(None, None, None)
        self.memory.finish()
        self.memory.close()

    def _patch_function_apply(self) -> None:
        fn = torch.autograd.function.Function
        original: classmethod[Any, ..., Any] = fn.__dict__["apply"]
        self._apply = original
        tracer = self

        def apply(cls: type[torch.autograd.Function], /, *args: object, **kwargs: object) -> object:
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

        setattr(fn, "apply", classmethod(apply))  # noqa: B010  (see __exit__)

    def _patch_backward(self) -> None:
        """Note each backward's non-finite roots: a closure's loss that LBFGS only turns into a
        Python number is never returned, yet its backward made the gradients."""
        original = torch.autograd.backward
        self._backward = original
        tracer = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> None:
            if not tracer.off:
                roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or [])
                tracer.off = True
                try:
                    for t in roots:
                        if isinstance(t, torch.Tensor):
                            tracer.notice(t, "the root of a backward (a loss)")
                finally:
                    tracer.off = False
            original(tensors, *args, **kwargs)

        setattr(torch.autograd, "backward", backward)  # noqa: B010  (restored in __exit__)

    def _attribute_warnings(self) -> None:
        """Show a warning raised inside an op at the user's line that ran it, not at the
        tracer's frame that called the op (the innermost Python frame torch's C++ warnings
        name). Only the place shown changes: filters and "once" registries are as they were."""
        original = warnings.showwarning
        locs = self.locs

        def showwarning(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            if filename == __file__:
                f = locs.user_frame(sys._getframe(1))
                if f is not None:
                    filename, lineno, line = f.f_code.co_filename, f.f_lineno, None
            original(message, category, filename, lineno, file, line)

        showwarning.__wrapped__ = original  # type: ignore[attr-defined]
        self._showwarning = warnings.showwarning = showwarning

    def notice(self, t: torch.Tensor, what: str, index: int | None = None) -> None:
        """Record that the step looked at ``t`` (``Noticed``) if it holds NaN/Inf."""
        if not t.is_floating_point() or finite_kind(t) == "finite":
            return
        at = len(self.cols) if index is None else index
        if self.closure >= 0:
            what += f" in closure call {self.closure}"
        self.noticed.append(Noticed(what, at, self.origins.of(t)))

    # ---------------------------------------------------------------- hooks
    def _pre_forward(self, mod: torch.nn.Module, args: tuple[object, ...]) -> None:
        self._module_stack.append(self._module_names.get(mod, -1))
        in_backward = torch._C._current_autograd_node() is not None
        self._entered_in_backward.append(in_backward)
        if in_backward:
            # The torch function running is the one that started the backward (Tensor.backward):
            # inside the recomputed forward, torch functions are sites of their own again, and
            # tag the nodes they make (the backward of the recomputed graph runs those nodes).
            # The function mode is off for the whole backward (it is inside the handler of
            # that torch function): it is entered again for the recomputed forward.
            self._recomputing += 1
            self._outer_fn.append((self.fn_frame, self.fn_site))
            self.fn_frame = self.fn_site = None
            if self._recomputing == 1 and not self.off:
                self._recompute_mode = _FunctionMode(self)
                self._recompute_mode.__enter__()  # type: ignore[no-untyped-call]  # torch stubs
        else:
            self.after_backward = False

    def _post_forward(self, mod: torch.nn.Module, args: tuple[object, ...], out: object) -> None:
        if self._module_stack:
            self._module_stack.pop()
            if self._entered_in_backward.pop():
                self._recomputing -= 1
                self.fn_frame, self.fn_site = self._outer_fn.pop()
                if not self._recomputing and self._recompute_mode is not None:
                    self._recompute_mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
                    self._recompute_mode = None
        if self.off:
            return
        ts = [t for t in _tensors(out) if t.is_floating_point()]
        if not ts:
            return
        self.off = True
        try:
            with torch.no_grad():
                row, _ = tensor_stats(ts[0], hist=False)
        except Exception:  # noqa: BLE001 - one we cannot read: no activation; the step goes on
            return
        finally:
            self.off = False
        n = max(row.numel, 1.0)
        bad = row.nan + row.posinf + row.neginf
        self.module_acts[self._module_names.get(mod, -1)] = Activation(
            row.mean, row.std, row.absmax, row.zeros / n, bad
        )

    def _pre_step(
        self, opt: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> tuple[tuple[object, ...], dict[str, object]] | None:
        if self.on_optimizer_pre is not None and not self.in_optimizer:
            self.off = True
            try:
                self.on_optimizer_pre()
            finally:
                self.off = False
        self.in_optimizer = True
        # optimizer.step(closure): hand it a closure that counts its calls (args holds the
        # optimizer itself first)
        for i, a in enumerate(args):
            if callable(a) and not isinstance(a, torch.optim.Optimizer):
                return (*args[:i], self._counted(a), *args[i + 1 :]), kwargs
        closure = kwargs.get("closure")
        if callable(closure):
            return args, {**kwargs, "closure": self._counted(closure)}
        return None

    def _counted(self, closure: Callable[[], object]) -> Callable[[], object]:
        tracer = self

        def counted() -> object:
            outer = tracer.closure
            tracer.closure = tracer.closure_calls
            tracer.closure_calls += 1
            if tracer.on_closure is not None:
                tracer.on_closure(tracer.closure)
            try:
                return closure()
            finally:
                tracer.closure = outer

        return counted

    def _post_step(
        self, opt: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        self.in_optimizer = False

    # ---------------------------------------------------------------- attribution
    def _fn_site(self) -> tuple[int, int]:
        """``(location, stack)`` of the torch function running (``fn_frame``), found once per
        call: the ops it runs and the nodes it makes share it."""
        if self.fn_site is None:
            self.fn_site = self.locs.here(self.fn_frame)
        return self.fn_site

    def _backward_site(self) -> int:
        """The location of the torch function that started the backward a forward is being
        recomputed in (-1: none known)."""
        frame, site = self._outer_fn[0] if self._outer_fn else (None, None)
        if site is None and frame is not None:
            site = self.locs.here(frame)
            self._outer_fn[0] = (frame, site)
        return site[0] if site is not None else -1

    def tag(self, node: Node, frame: FrameType | None, function: str | None = None) -> None:
        """Tag ``node`` (and untagged nodes it leads to, e.g. a weight's ``t()``) with the
        current module and the forward site: ``frame``'s, or (None) the torch function's."""
        if TAG in _metadata(node):
            return
        loc, stack = self.locs.here(frame) if frame is not None else self._fn_site()
        mod = self._module_stack[-1] if self._module_stack else -1
        value: Tag = (mod, loc, stack, function)
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

    def _opinfo_of(self, func: OpOverload[..., object]) -> _OpInfo:
        info = self._opinfo.get(func)
        if info is None:
            schema = func._schema
            name = schema.name if "::" in schema.name else f"aten::{schema.name}"
            pos: list[int] = []
            kw: list[str] = []
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    if a.kwarg_only:
                        kw.append(a.name)
                    else:
                        pos.append(i)
            info = self._opinfo[func] = _OpInfo(
                name, self.op_names(name), tuple(pos), tuple(kw), name in ALIAS_OPS
            )
        return info

    def _shapes(self, ts: list[torch.Tensor]) -> int:
        key = tuple([(t.dtype, t.shape, t.get_device()) for t in ts])
        i = self._shape_key.get(key)
        if i is None:
            i = self._shape_key[key] = self.shapes(", ".join(_describe(t) for t in ts))
        return i

    # ---------------------------------------------------------------- the op
    def on_op(
        self, func: OpOverload[..., object], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> object:
        index = len(self.cols)
        info = self._opinfo_of(func)
        node: Node | None = torch._C._current_autograd_node()  # None outside backward
        if node is not None:
            self.after_backward = True
            tag: Tag | None = _metadata(node).get(TAG)
            if self._recomputing and self._entered_in_backward[-1]:
                # a module's forward run again by the backward (activation checkpointing):
                # where it runs, not where the node that runs it was made
                mod = self._module_stack[-1]
                if self.fn_frame is not None:
                    loc, stack = self._fn_site()
                else:
                    loc, stack = self.locs.here(sys._getframe(_OP_CALLER))
                if loc == self._backward_site():
                    # no user code in the recomputed forward (torch's own modules): the user
                    # frame found is the one that called backward; the node's forward site
                    # says more
                    if tag is not None:
                        loc, stack = tag[1], tag[2]
            else:
                if tag is not None:
                    mod, loc, stack, _ = tag
                else:
                    mod = loc = stack = -1
            site = OpSite(index, info, BACKWARD, mod, loc, stack, self.nodes(node.name()))
        else:
            # Inside optimizer.step with grad mode on is a closure's forward (Lightning runs the
            # last micro-batch's training_step in optimizer.step(closure)); the update itself
            # runs under no_grad.
            in_opt = self.in_optimizer and not self._module_stack and not torch.is_grad_enabled()
            phase = OPTIMIZER if in_opt else OTHER if self.after_backward else FORWARD
            mod = self._module_stack[-1] if self._module_stack else -1
            if self.fn_frame is not None:
                loc, stack = self._fn_site()
            else:
                loc, stack = self.locs.here(sys._getframe(_OP_CALLER))
            site = OpSite(index, info, phase, mod, loc, stack, -1)
        call = (args, kwargs)
        ins: list[torch.Tensor] = []
        _collect(args, ins)
        if kwargs:
            _collect(kwargs, ins)
        mutated: list[object] = []
        if info.mutated or info.mutated_kw:
            mutated = [args[i] for i in info.mutated if i < len(args)]
            mutated += [kwargs[k] for k in info.mutated_kw if k in kwargs]
            if self._values:
                for m in mutated:
                    if isinstance(m, torch.Tensor) and (k := storage_key(m)) is not None:
                        self._values.pop(k, None)
        pre_bad = (
            {id(t): self.origins.known_bad(t) for t in mutated if isinstance(t, torch.Tensor)}
            if self.origins.by_storage
            else {}
        )
        if info.name == "aten::_local_scalar_dense" and ins:
            self.off = True
            try:
                self.notice(ins[0], "a Python number read off it (.item(), float())", index)
            finally:
                self.off = False
        t0 = time.perf_counter_ns()
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            self.off = True
            try:
                self._record_raise(site, e, ins, sys._getframe(_OP_CALLER))
            finally:
                self.off = False
            raise
        elapsed = time.perf_counter_ns() - t0
        self.off = True
        try:
            outs = _tensors(out) or [t for t in mutated if isinstance(t, torch.Tensor)]
            if self.plain:  # Tensor methods below skip the function mode (not for subclasses)
                with torch._C.DisableTorchFunction():
                    detailed = self._record(site, call, ins, outs, mutated, pre_bad, elapsed)
            else:
                detailed = self._record(site, call, ins, outs, mutated, pre_bad, elapsed)
            if detailed is not None:  # a non-finite op described in full: where it ran, too
                detailed.executed_at = self.locs.here(sys._getframe(_OP_CALLER))[0]
        finally:
            self.off = False
        return out

    def _append(
        self,
        site: OpSite,
        status: int,
        inputs: int,
        outputs: int,
        row: Stats,
        hist: np.ndarray,
        elapsed: int,
        staged: np.ndarray | None = None,
        alias: int = -1,
    ) -> None:
        """One row of the op table: ``inputs``/``outputs`` index the shapes table (-1: none).
        ``staged``: the finite values of its output, measured later in a batch; ``alias``: a
        staged row holding the same values (``row`` and ``hist`` are placeholders until then)."""
        spool = self.cols
        c = spool.buf
        c["phase"].append(site.phase)
        c["name"].append(site.op.index)
        c["module"].append(site.module)
        c["source"].append(site.location)
        c["stack"].append(site.stack)
        c["node"].append(site.node)
        c["status"].append(status)
        c["inputs"].append(inputs)
        c["outputs"].append(outputs)
        c["time_ns"].append(elapsed)
        c["closure"].append(self.closure)
        c["stats"].append(row)
        c["hist"].append(hist)
        c["mem_bytes"].append(self.memory.after_op(site.index))
        if staged is not None:
            self.stage.add(site.index, staged)
        elif alias >= 0:
            self.stage.alias(site.index, alias)
        if not (site.index + 1) % PROGRESS_ROWS:
            if spool.full():
                self.stage.flush()  # the staged rows get their statistics before they go
                spool.flush()
            if self.progress is not None:
                self.progress(self)

    def _torch_stats(self, t: torch.Tensor) -> tuple[Stats, np.ndarray]:
        """``tensor_stats`` of a tensor numpy does not measure (large, on a GPU, not float).
        Small reductions are latency-bound: an OpenMP fork/join per reduction costs more than
        the work (and ms on a busy machine), so they run on one thread, restored after."""
        threads = torch.get_num_threads()
        single = threads > 1 and t.numel() < SINGLE_THREAD_NUMEL
        if single:
            torch.set_num_threads(1)
        try:
            return tensor_stats(t)
        finally:
            if single:
                torch.set_num_threads(threads)

    def _copy_staged(self, row: int, src: int) -> None:
        buf, first = self.cols.buf, self.cols.flushed
        buf["stats"][row - first] = self.cols.get("stats", src)
        buf["hist"][row - first] = self.cols.get("hist", src)

    def _remember(self, t: torch.Tensor, row: int) -> None:
        """``t``'s values are measured in row ``row`` (finite: staged, or measured at once) (``t`` is one the memory tracker
        counts: its storage's entry goes when the storage is let go)."""
        key = storage_key(t)
        if key is not None and self.memory.counts(key):
            at = self._values.get(key)
            if at is None:
                at = self._values[key] = {}
            at[t.data_ptr()] = (t.numel(), t._version, t.dtype, row)

    def _forget(self, key: int) -> None:
        self._values.pop(key, None)

    def _measured(self, t: torch.Tensor) -> int:
        """The row of finite values measured that ``t`` holds now, else -1."""
        key = storage_key(t)
        at = self._values.get(key) if key is not None else None
        v = at.get(t.data_ptr()) if at is not None else None
        if v is not None and v[0] == t.numel() and v[1] == t._version and v[2] == t.dtype:
            return v[3]
        return -1

    def _write_staged(self, rows: list[int], stats: np.ndarray, hists: np.ndarray) -> None:
        """The batch-measured statistics of staged rows, into the spool's buffer (they are
        still there: the stage is flushed before the spool)."""
        buf, first = self.cols.buf, self.cols.flushed
        st, hs = buf["stats"], buf["hist"]
        for j, r in enumerate(rows):
            st[r - first] = stats[j]
            hs[r - first] = hists[j]

    def _record(
        self,
        site: OpSite,
        call: tuple[tuple[object, ...], dict[str, object]],
        ins: list[torch.Tensor],
        outs: list[torch.Tensor],
        mutated: list[object],
        pre_bad: dict[int, bool],
        elapsed: int,
    ) -> NonFinite | None:
        """Measure the op's outputs and append its row; the op's ``NonFinite`` when it is to be
        described in full (``on_op`` adds where it ran), else None."""
        see, seen = self.memory.see, self.memory.seen
        for t in ins:
            if id(t) not in seen:
                see(t, site.index, site.op.name)
        for t in outs:
            if id(t) not in seen:
                see(t, site.index, site.op.name)
        floats = [t for t in outs if t.is_floating_point()]
        main = floats[0] if floats else (outs[0] if outs else None)
        staged: np.ndarray | None = None
        alias = -1
        a = None
        src: torch.Tensor | None = None
        if main is not None and site.op.alias and ins and len(floats) == 1:
            src = ins[0]
            if src.numel() == main.numel() and src.dtype == main.dtype:
                alias = self._measured(src)
            else:
                src = None
        if alias < 0 and main is not None:
            a = copy_small(main)
        if alias >= 0:  # the same values as a row measured before: its statistics
            row, hist, kinds = NO_STATS, _NO_HIST, ["finite"]
        elif a is not None and quick_finite(a):
            if a.size <= STAGE_MAX:
                staged, row, hist = a, NO_STATS, _NO_HIST  # measured later, in a batch
            else:  # enough values that numpy's per-call cost does not matter
                row, hist = np_stats(a, True)
            kinds = ["finite"]
            # A view's version counter is joined to its base's only after the op returns:
            # the values are remembered under the viewed input
            remembered = src if src is not None else main
            assert remembered is not None
            self._remember(remembered, site.index)
        elif a is not None:
            row, hist = np_stats(a, True)
            kinds = [kind_of_row(row)]
        elif main is not None:
            row, hist = self._torch_stats(main)
            kinds = [kind_of_row(row)] if floats else []
        else:
            row, hist, kinds = NO_STATS, _NO_HIST, []
        if len(floats) > 1:
            kinds += [_kind(t) for t in floats[1:]]
        status = _FINITE
        nf = None
        if any(k != "finite" for k in kinds):
            nf = self._nonfinite(site, call, ins, mutated, pre_bad, floats, kinds)
            status = (
                _EXEMPT
                if nf.role == "exempt"
                else _PRODUCER
                if nf.role == "producer"
                else _PROPAGATOR
            )
        elif self.origins.by_storage:
            for t in floats:
                self.origins.set_output(t, None)
        self._append(
            site, status, self._shapes(ins), self._shapes(outs), row, hist, elapsed, staged, alias
        )
        return nf if nf is not None and nf.detailed else None

    def _nonfinite(
        self,
        site: OpSite,
        call: tuple[tuple[object, ...], dict[str, object]],
        ins: list[torch.Tensor],
        mutated: list[object],
        pre_bad: dict[int, bool],
        floats: list[torch.Tensor],
        kinds: list[str],
    ) -> NonFinite:
        """Classify an op whose floating outputs ``floats`` (of ``kinds``) are not all finite,
        and record the origins its outputs carry (``origins.py``)."""
        out_kind = "nan" if "nan" in kinds else "inf" if "inf" in kinds else "neginf"
        mutated_ids = {id(t) for t in mutated}
        checked: list[tuple[torch.Tensor, str]] = []
        for t in ins:
            if not t.is_floating_point():
                continue
            if id(t) in mutated_ids:
                k = "nan" if pre_bad.get(id(t)) else "finite"  # its value before the op
            else:
                k = finite_kind(t)
            checked.append((t, k))
        role, klass, origins = self.origins.classify(
            site.index, site.op.name, checked, out_kind, _arg_kind(call)
        )
        # one object per distinct set: after a step turns NaN every op carries the same few
        origins = self._origin_sets.setdefault(origins, origins)
        for t, k in zip(floats, kinds):
            self.origins.set_output(t, origins if k != "finite" else None)
        nf = NonFinite(role, klass, origins, out_kind, None)
        if len(self.nonfinite) < MAX_DETAILED or role == "producer":
            nf.output = _tensor_info(floats[0])
            nf.inputs = [self._input_info(t) for t in ins]
            nf.detailed = True
        self.nonfinite.add(site.index, role, klass, origins, nf if nf.detailed else None)
        return nf

    def _input_info(self, t: torch.Tensor) -> InputInfo:
        d: InputInfo = {"shape": list(t.shape), "dtype": str(t.dtype)[6:], "device": str(t.device)}
        if t.numel() <= 1 << 24:
            row, _ = tensor_stats(t, hist=False)
            d["stats"] = row._asdict()
        return d

    def _record_raise(
        self, site: OpSite, exc: BaseException, ins: list[torch.Tensor], caller: FrameType
    ) -> None:
        """The row of an op that raised (``caller``: the frame of the code that ran it)."""
        inputs = [self._input_info(t) for t in ins]
        bad = [t for t in ins if t.is_floating_point() and finite_kind(t) != "finite"]
        origins: frozenset[int] = frozenset().union(*(self.origins.of(t) for t in bad))
        self.raised.append(RaisedOp(site.index, exc, inputs, self.locs.here(caller)[0], origins))
        self._append(site, _RAISED, self._shapes(ins), -1, NO_STATS, _NO_HIST, 0)
