"""What a step changes that no snapshot holds: the stateful objects its code reaches through
globals and closures, outside the objects the Recorder was given.

When a replay from a snapshot differs from the recording while two replays agree, the step read
state kept outside the recorded objects (a mean teacher's EMA weights, a running statistic in a
global tensor, a cache). Saying so is not enough: the user has to find it. Here the step
function's code is read for the names it loads from its module's globals and its closure
cells (following the user's own functions it calls, a few calls deep); every module,
optimizer, scheduler, tensor, number, numpy array or random generator of its own (an RL
environment's) among them (or one attribute down, ``ema.module``, ``env.np_random``) that
the Recorder does not hold is a candidate, and running the step once names those it changes. Those
are state the run carries from step to step that a snapshot loses.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import inspect
import random
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .objects import RunObjects, saves_state, state_of

__all__ = ["Suspect", "candidates", "changed_by", "buffers", "unheld_state", "same_tensor"]

_DEPTH = 3  # the user's functions followed from the step function
_MAX = 64  # candidates kept (a module's globals can hold many)
_MAX_UNSAVED = 4096  # and attributes of the recorded modules (numbers: cheap to compare)
_SKIP_MODULES = ("torch", "numpy", "replay", "lightning", "pytorch_lightning", "transformers")
_WRAPPED = 3  # plain objects followed below the first attribute, for a generator only
_ARRAY_BYTES = 64 << 20  # arrays compared before and after the step, at most this large
_PYTHON_GLOBAL = random.getstate.__self__  # type: ignore[attr-defined]  # (a bound method)


@dataclass(frozen=True)
class Suspect:
    """``name``: how the step's code reaches it (``ema.module``); ``kind``: what it is (a
    module's class, ``optimizer``, ``tensor``); ``where``: the function whose code reads it."""

    name: str
    kind: str
    where: str
    # state a recorded module keeps outside its state_dict (a plain tensor or number attribute,
    # a non-persistent buffer): ``where`` is then the module's class
    unsaved: bool = False

    def describe(self) -> str:
        if self.unsaved:
            return f"{self.name} ({self.kind}, kept by {self.where} outside its state_dict)"
        return f"{self.name} ({self.kind}, read by {self.where})"


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _users(fn: Any) -> bool:
    """Whether ``fn`` is the user's own code (not a library's, whose state is not the run's)."""
    mod = getattr(fn, "__module__", None) or ""
    if mod.split(".")[0] in _SKIP_MODULES or mod in sys.stdlib_module_names:
        return False
    path = getattr(getattr(fn, "__code__", None), "co_filename", "") or ""
    return "site-packages" not in path and "dist-packages" not in path


def _stateful(obj: object) -> str | None:
    if isinstance(obj, torch.nn.Module):
        return type(obj).__name__
    if isinstance(obj, torch.optim.Optimizer):
        return f"optimizer {type(obj).__name__}"
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return f"scheduler {type(obj).__name__}"
    if isinstance(obj, torch.Tensor):
        return f"tensor {str(obj.dtype).removeprefix('torch.')}{list(obj.shape)}"
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return f"number {type(obj).__name__}"  # a counter the step keeps in a global
    # Generators replay does not keep (it keeps python's, numpy's global one and torch's): an
    # RL environment's own, seeded once per run as gymnasium's reset(seed=...) does
    if isinstance(obj, np.random.Generator):
        return "random generator numpy Generator"
    if isinstance(obj, np.random.RandomState) and obj is not np.random.mtrand._rand:
        return "random generator numpy RandomState"
    if isinstance(obj, random.Random) and obj is not _PYTHON_GLOBAL:
        return f"random generator {type(obj).__module__}.{type(obj).__qualname__}"
    if isinstance(obj, torch.Generator) and obj is not torch.default_generator:
        return "random generator torch.Generator"  # (noise drawn with generator=)
    if isinstance(obj, np.ndarray) and obj.nbytes <= _ARRAY_BYTES and not obj.dtype.hasobject:
        return f"array {obj.dtype}{list(obj.shape)}"  # an environment's state
    return None


Lookup = Callable[[], object]  # the object at a suspect's place now (``_GONE``: none)
_GONE = object()


def _item(base: Lookup, key: object) -> Lookup:
    def get() -> object:
        try:
            return base()[key]  # type: ignore[index]  # a list, tuple or dict (checked before)
        except (LookupError, TypeError):
            return _GONE

    return get


def _attr(base: Lookup, name: str) -> Lookup:
    return lambda: getattr(base(), name, _GONE)


def _buffer(obj: object) -> str | None:
    """A collection the loop may fill between steps for the step to draw from: an RL replay
    memory's ``deque`` (any size), or a list or dict that is empty here."""
    if isinstance(obj, collections.deque):
        n = len(obj)
        return f"deque of {n} item{'s' * (n != 1)}" if n else "deque, empty here"
    if type(obj) in (list, dict) and not obj:
        return f"{type(obj).__name__}, empty here"
    return None


def _parts(
    name: str, obj: object, get: Lookup, stateful: Callable[[object], str | None] = _stateful
) -> Iterator[tuple[str, str, object, Lookup]]:
    """``(name, kind, object, lookup)`` of the stateful things ``obj`` is or holds one level
    down; ``lookup`` finds what is at that place again (a global the step rebinds)."""
    kind = stateful(obj)
    if kind is not None:
        yield name, kind, obj, get
        return
    if isinstance(obj, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
        return
    if stateful is not _stateful and _stateful(obj) is not None:
        return  # (a module's or an optimizer's own collections are not the loop's)
    items: list[tuple[str, object, Lookup]] = []
    if isinstance(obj, (list, tuple)):
        items = [(f"{name}[{i}]", v, _item(get, i)) for i, v in enumerate(obj[:16])]
    elif isinstance(obj, dict):
        items = [
            (f"{name}[{k!r}]", v, _item(get, k))
            for k, v in list(obj.items())[:16]
            if isinstance(k, str)
        ]
    elif isinstance(getattr(obj, "__dict__", None), dict):
        items = [(f"{name}.{k}", v, _attr(get, k)) for k, v in list(vars(obj).items())[:32]]
    for label, v, at in items:
        kind = stateful(v)
        if kind is not None:
            yield label, kind, v, at
        elif _plain_object(v) and stateful is _stateful:
            yield from _generators(label, v, at, _WRAPPED)


def _plain_object(obj: object) -> bool:
    return isinstance(getattr(obj, "__dict__", None), dict) and not isinstance(
        obj, (types.ModuleType, type, types.FunctionType, types.MethodType, torch.nn.Module)
    )


def _generators(
    name: str, obj: object, get: Lookup, depth: int
) -> Iterator[tuple[str, str, object, Lookup]]:
    """The random generators further down plain objects' attributes: an environment wrapped
    several times keeps its own (gymnasium's ``TimeLimit(OrderEnforcing(CartPoleEnv))``:
    ``env.env.env._np_random``). Only generators: the rest, that deep, is rarely the run's."""
    for k, v in list(vars(obj).items())[:32]:
        label, at = f"{name}.{k}", _attr(get, k)
        kind = _stateful(v)
        if kind is not None:
            if kind.startswith("random generator"):
                yield label, kind, v, at
        elif depth > 0 and _plain_object(v):
            yield from _generators(label, v, at, depth - 1)


def _cell(cell: types.CellType) -> Lookup:
    def get() -> object:
        try:
            return cell.cell_contents
        except ValueError:  # an empty cell
            return _GONE

    return get


def buffers(step_fn: Callable[..., Any], objects: RunObjects) -> list[Suspect]:
    """The collections ``step_fn``'s code reads that a training loop may fill between steps
    (``_buffer``: a replay memory's deque, an empty list or dict), outside ``objects``. A step
    that samples its minibatch from one (PyTorch's DQN tutorial: ``memory.sample(BATCH_SIZE)``
    in ``optimize_model``) cannot be replayed from a snapshot, which does not hold it."""
    return [s for s, _ in candidates(step_fn, objects, _buffer)]


def _training_state(obj: object) -> str | None:
    """An object a snapshot must hold for a replay to start from it: a module with parameters
    or buffers (not a loss function), an optimizer, a scheduler, anything else that saves and
    loads a state (a GradScaler, an EMA helper)."""
    if isinstance(obj, torch.nn.Module):
        empty = next(obj.parameters(), None) is None and next(obj.buffers(), None) is None
        return None if empty else type(obj).__name__
    if isinstance(obj, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)):
        return _stateful(obj)
    if isinstance(obj, (type, types.ModuleType)):
        return None
    return type(obj).__name__ if saves_state(obj) else None


def unheld_state(step_fn: Callable[..., Any], objects: RunObjects) -> list[tuple[Suspect, Lookup]]:
    """The models, optimizers, schedulers and other ``state_dict`` holders ``step_fn``'s code
    reaches (its closures, its globals, the user's functions it calls) that ``objects`` does not
    hold, each with a way to find it again: said while the run trains, since no snapshot can
    hold them (an EMA or a GradScaler the step updates, left out of ``objects=``;
    ``record/unheld.py``)."""
    return candidates(step_fn, objects, _training_state)


def candidates(
    step_fn: Callable[..., Any],
    objects: RunObjects,
    stateful: Callable[[object], str | None] = _stateful,
) -> list[tuple[Suspect, Lookup]]:
    """The stateful objects ``step_fn``'s code reaches that ``objects`` does not hold, each
    with a way to find what is at its place again (``stateful``: what counts, and its kind)."""
    held = _held(objects)
    out: dict[int, tuple[Suspect, Lookup]] = {}
    seen: set[int] = set()

    def visit(fn: Any, depth: int) -> None:
        if isinstance(fn, types.MethodType):
            owner = fn.__self__
            for label, kind, part, at in _parts("self", owner, lambda: owner, stateful):
                take(label, kind, part, at, fn.__func__.__qualname__)
            fn = fn.__func__
        fn = inspect.unwrap(fn) if callable(fn) else fn
        if not isinstance(fn, types.FunctionType) or id(fn) in seen or len(out) >= _MAX:
            return
        seen.add(id(fn))
        where = fn.__qualname__
        g = fn.__globals__
        values: list[tuple[str, object, Lookup]] = [
            (n, g[n], functools.partial(g.get, n, _GONE))
            for n in sorted(_code_names(fn.__code__))
            if n in g
        ]
        for n, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            v = _cell(cell)()
            if v is not _GONE:
                values.append((n, v, _cell(cell)))
        for n, v, get in values:
            if isinstance(v, (types.FunctionType, types.MethodType)):
                if depth > 0 and _users(v):
                    visit(v, depth - 1)
                continue
            for label, kind, part, at in _parts(n, v, get, stateful):
                take(label, kind, part, at, where)

    def take(label: str, kind: str, obj: object, at: Lookup, where: str) -> None:
        if id(obj) in held or id(obj) in out:
            return
        # A wrapper of a recorded model (DDP, torch.compile's OptimizedModule) shares its
        # state: not state of its own
        if isinstance(obj, torch.nn.Module) and any(
            id(t) in held for t in (*obj.parameters(), *obj.buffers())
        ):
            return
        out[id(obj)] = (Suspect(label, kind, where), at)

    visit(step_fn, _DEPTH)
    found = list(out.values())
    if stateful is _stateful:
        for label, kind, obj, at, owner in _unsaved(objects):
            # (by name: two attributes may hold the same small int object)
            if id(obj) not in out and len(found) < _MAX_UNSAVED:
                found.append((Suspect(label, kind, owner, unsaved=True), at))
    return found


_MODULE_OWN = frozenset(vars(torch.nn.Module()))  # what every module keeps (hooks, training)


def _unsaved(objects: RunObjects) -> Iterator[tuple[str, str, object, Lookup, str]]:
    """``(name, kind, object, lookup, owner class)`` of the state the recorded modules keep
    outside their ``state_dict``, which snapshots are made of: a tensor or a number set as a
    plain attribute (a MoCo queue ``self.queue = ...`` and its pointer ``self.ptr``), a buffer
    registered with ``persistent=False``."""
    for role, root in objects.named.items():
        if not isinstance(root, torch.nn.Module):
            continue
        for path, m in root.named_modules():
            prefix = f"{role}.{path}" if path else role
            owner = type(m).__name__
            for k, v in list(vars(m).items())[:64]:
                if k in _MODULE_OWN or isinstance(v, (torch.nn.Parameter, bool)):
                    continue
                if isinstance(v, (torch.Tensor, int, float)):
                    kind = _stateful(v)
                    assert kind is not None
                    yield f"{prefix}.{k}", kind, v, _attr(_const(m), k), owner
            for k in sorted(m._non_persistent_buffers_set):
                b = m._buffers.get(k)
                if b is not None:
                    kind = f"non-persistent buffer {_stateful(b)}"
                    yield f"{prefix}.{k}", kind, b, _item(_const(m._buffers), k), owner


def _const(obj: object) -> Lookup:
    return lambda: obj


def _held(objects: RunObjects) -> set[int]:
    """``id`` of every object, module, parameter, buffer and state tensor the Recorder keeps."""
    ids: set[int] = set()
    for obj in objects.named.values():
        if obj is None:
            continue
        ids.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            ids.update(id(m) for m in obj.modules())
            ids.update(id(p) for p in obj.parameters())
            for m in obj.modules():  # a non-persistent buffer is in no snapshot
                unsaved = m._non_persistent_buffers_set
                ids.update(id(b) for k, b in m._buffers.items() if k not in unsaved)
        elif isinstance(obj, torch.optim.Optimizer):
            for p, st in obj.state.items():
                ids.add(id(p))
                ids.update(id(v) for v in st.values() if isinstance(v, torch.Tensor))
    for obj in objects.extras.values():
        ids.add(id(obj))
    return ids


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return [*obj.parameters(), *obj.buffers()]
    if isinstance(obj, torch.optim.Optimizer):
        return [v for st in obj.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return []


_State = tuple[list[int], list[int], list[torch.Tensor], str]


def _state(obj: object) -> _State:
    """What ``obj`` holds now: its tensors (which ones, their version counters, a copy of their
    values) and the rest as text (a scheduler's count). A write shows in the version counter
    even where the values stay (an EMA of weights already NaN), a new tensor in the ids."""
    text = ""
    if isinstance(obj, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)):
        sd = state_of(obj)
        text = repr(sd.get("param_groups") if isinstance(obj, torch.optim.Optimizer) else sd)
    elif isinstance(obj, np.random.Generator):
        text = repr(obj.bit_generator.state)
    elif isinstance(obj, np.random.RandomState):
        text = hashlib.blake2b(repr(obj.get_state()).encode()).hexdigest()
    elif isinstance(obj, random.Random):
        text = hashlib.blake2b(repr(obj.getstate()).encode()).hexdigest()
    elif isinstance(obj, torch.Generator):
        text = hashlib.blake2b(obj.get_state().numpy().tobytes()).hexdigest()
    elif isinstance(obj, np.ndarray):
        text = f"{obj.dtype}{obj.shape}:{hashlib.blake2b(obj.tobytes()).hexdigest()}"
    ts = _tensors(obj)
    return (
        [id(t) for t in ts],
        [t._version for t in ts],
        [t.detach().clone() for t in ts],
        text,
    )


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same shape, dtype and values (NaN where the other is NaN counts as the same)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    b = b.to(a.device)
    if a.is_floating_point() or a.is_complex():
        both_nan = torch.isnan(a) & torch.isnan(b)
        return bool(((a == b) | both_nan).all())
    return bool(torch.equal(a, b))


def _same(a: _State, b: _State) -> bool:
    if a[0] != b[0] or a[1] != b[1] or a[3] != b[3]:
        return False
    return all(same_tensor(x, y) for x, y in zip(a[2], b[2]))


def changed_by(run: Callable[[], object], found: list[tuple[Suspect, Lookup]]) -> list[Suspect]:
    """Those of ``found`` that ``run()`` (one step) writes to, or puts another object in
    place of (a global batch the step prefetches)."""
    if not found:
        return []
    with torch.no_grad():
        before = [(obj := at(), _state(obj)) for _, at in found]
    run()
    named = []
    with torch.no_grad():
        for (s, at), (obj, state) in zip(found, before):
            now = at()
            if s.kind.startswith("number"):
                if now != obj:
                    named.append(s)
            elif now is not obj or not _same(state, _state(now)):
                named.append(s)
    return named
