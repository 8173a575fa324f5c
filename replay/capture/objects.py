"""The record/replay contract: the named objects of a run and how the step function is called.

Two shapes of ``build_fn`` are understood, and the recorder and the replay engine both go
through this module, so a step is called the same way in both:

* **positional** (the first contract, kept working): ``build_fn()`` returns
  ``(model, optimizer[, scheduler[, scaler]])`` and the step is called as
  ``step_fn(model, optimizer, batch, **values)``.
* **named**: ``build_fn()`` returns a dict of named objects (``model`` required; ``optimizer``,
  ``scheduler``, ``scaler`` recognised by name; any other object with ``state_dict`` and
  ``load_state_dict``, such as EMA weights, kept in every snapshot too). The step function
  receives them by parameter name, with ``batch`` and the per-step ``values`` the loop passes to
  ``rec.step(batch, lr=lr, it=it)``::

      def train_step(model, optimizer, scaler, batch, lr):  # any subset, in any order

``values`` are recorded with each step and handed back on replay: they are how a value computed
outside the step (a learning rate set by the loop, a curriculum knob, the iteration number)
reaches a replayed step.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import EntryPointError
from .frameworks import state_view

__all__ = [
    "inner_optimizer",
    "apply_layout",
    "run_params",
    "param_layout",
    "ROLES",
    "RunObjects",
    "StepCall",
    "objects_from_build",
    "optimizers",
    "saves_state",
    "other_models",
    "gather_state",
    "load_state",
    "state_of",
    "load_into",
]

# Objects known by name: the recorder measures and records their hyper-parameters (optimizer),
# scale (scaler) and keeps their state under these keys in every snapshot.
ROLES = ("model", "optimizer", "scheduler", "scaler")


def inner_optimizer(optimizer: Any) -> Any:
    """The innermost ``torch.optim.Optimizer`` of a framework's wrapper (accelerate's
    ``.optimizer``, Lightning's ``._optimizer``), the optimizer itself otherwise."""
    for _ in range(8):
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer):
            inner = getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            return optimizer
        optimizer = inner
    return optimizer


def saves_state(obj: Any) -> bool:
    """Whether ``obj`` has a ``state_dict`` and a ``load_state_dict`` (snapshots keep it)."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


@dataclass
class RunObjects:
    """The stateful objects of a run, by name, and the shape ``build_fn`` gave them."""

    named: dict[str, Any]
    style: str = "positional"  # or "named"
    # the named objects beyond the four roles whose state snapshots keep (EMA weights, ...)
    extras: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for k, v in self.named.items():
            if k in ROLES or v is None:
                continue
            if saves_state(v):
                self.extras[k] = v
            elif (view := state_view(v)) is not None:  # an Accelerator's micro-batch counter
                self.extras[k] = view

    @property
    def model(self) -> torch.nn.Module:
        model: torch.nn.Module = self.named["model"]
        return model

    optimizer = property(lambda self: self.named.get("optimizer"))
    scheduler = property(lambda self: self.named.get("scheduler"))
    scaler = property(lambda self: self.named.get("scaler"))

    def trained_params(self) -> list[torch.Tensor]:
        """What the step updates: the optimizer's parameters, or the model's trainable ones
        for a loop that updates them itself. The gradient norm is measured over these."""
        opt = self.optimizer
        if opt is not None:
            return [p for g in opt.param_groups for p in g["params"]]
        return [p for p in self.model.parameters() if p.requires_grad]

    def present(self) -> list[str]:
        """The names that hold an object (a positional build may give ``None`` as scheduler)."""
        return [k for k, v in self.named.items() if v is not None]

    def describe(self) -> dict[str, Any]:
        """For ``meta/run.objects``: the contract's shape and every object's class."""
        return {
            "style": self.style,
            "names": self.present(),
            "classes": {
                k: None if v is None else f"{type(v).__module__}.{type(v).__qualname__}"
                for k, v in self.named.items()
            },
            "stateful": sorted(self.extras),
        }


def objects_from_build(out: Any, who: str = "build_fn", style: str | None = None) -> RunObjects:
    """Check what ``build_fn`` (or the Recorder's arguments) gave and name it.

    ``out`` is ``(model, optimizer[, scheduler[, scaler]])`` or a mapping with at least ``model``;
    ``style`` overrides the shape it implies (the Recorder's ``model=``/``optimizer=`` keywords
    are the positional contract).
    """
    if isinstance(out, Mapping):
        named = dict(out)
        bad = [k for k in named if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise EntryPointError(
                f"{who} returned a dict whose keys must be names (identifiers), got {bad[0]!r}"
            )
        kind = "named"
    elif isinstance(out, (tuple, list)) and 2 <= len(out) <= 4:
        named = dict(zip(ROLES, out))
        kind = "positional"
    else:
        raise EntryPointError(
            f"{who} must return (model, optimizer[, scheduler[, scaler]]) or a dict of named "
            f"objects such as {{'model': ..., 'optimizer': ..., 'scaler': ...}}, "
            f"got {type(out).__name__}"
        )
    model = named.get("model")
    if not isinstance(model, torch.nn.Module):
        raise EntryPointError(
            f"{who} must give a torch.nn.Module as 'model', got {type(model).__name__}"
        )
    opt = named.get("optimizer")
    if opt is not None and not isinstance(opt, torch.optim.Optimizer):
        raise EntryPointError(
            f"{who} gave {type(opt).__name__} as 'optimizer': pass a torch.optim.Optimizer, or "
            "None for a loop that updates the parameters itself"
        )
    return RunObjects(named, style if style is not None else kind)


class StepCall:
    """Calls ``step_fn`` as the contract says; the recorder and the engine both use it.

    Named style: each parameter of ``step_fn`` is bound by name to a run object, to ``batch``
    or to a per-step value; a ``**kwargs`` parameter takes the values no parameter names.
    Without a parameter named ``batch``, the first one not named after an object takes the
    batch (an RL step ``episode(seed)`` was refused for want of a ``batch``).
    Positional style: ``step_fn(model, optimizer, batch, **values)``, unless the function cannot
    take that (fewer than three positional parameters, or a first one named ``batch``: a closure
    ``step(batch)`` over the loop's own objects): then it is called by name as in the named
    style, its batch parameter being ``batch`` or, without one, its first (a GAN's
    ``train_step(real)``: was called with three arguments and raised TypeError in the user's
    loop). In both, a value no parameter takes is recorded but not passed (``it=it`` kept for
    the record).
    """

    def __init__(self, step_fn: Callable[..., Any], objects: RunObjects) -> None:
        self.step_fn = step_fn
        self.objects = objects
        self._takes: list[str] = []
        # parameters without a default that only a per-step value can fill (named style)
        self._wanted: list[str] = []
        self._batch = "batch"  # the parameter the batch goes to
        self._var_kw = False
        self._by_name = objects.style == "named"
        if self._by_name:
            self._plan(step_fn)
        else:
            try:
                params = list(inspect.signature(step_fn).parameters.values())
            except (TypeError, ValueError):  # unreadable: pass every value, as written
                self._var_kw = True
            else:
                slots = _slots(params)
                named_batch = any(p.name == "batch" for p in params)
                # Not callable step_fn(model, optimizer, batch): it names its own objects (a
                # closure, a bound method), its batch first or among fewer than three
                # positional parameters (not a keyword-only one)
                kw_batch = named_batch and all(p.name != "batch" for p in slots)
                if slots and (slots[0].name == "batch" or (len(slots) < 3 and not kw_batch)):
                    if not named_batch:
                        self._batch = slots[0].name  # step(real), step(data, scale=2.0)
                    self._by_name = True
                    self._plan(step_fn)
                    return
                self._var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
                self._takes = [p.name for p in params if p.kind is not p.VAR_KEYWORD]
                try:
                    # (per-step values fill the rest by name: train_step(model, optimizer,
                    # batch, it) with rec.step(batch, it=it))
                    inspect.signature(step_fn).bind_partial(None, None, None)
                except TypeError:
                    name = getattr(step_fn, "__qualname__", "step_fn")
                    raise EntryPointError(
                        f"step_fn {name}{inspect.signature(step_fn)} takes no batch: it is called "
                        "step_fn(batch) (a parameter named 'batch', or its only one) or "
                        "step_fn(model, optimizer, batch)"
                    ) from None

    def _plan(self, fn: Callable[..., Any]) -> None:
        name = getattr(fn, "__qualname__", "step_fn")
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            raise EntryPointError(
                f"step_fn {name}: its signature cannot be read, so its parameters cannot be "
                "matched with the run's objects by name"
            ) from None
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                self._var_kw = True
            elif p.kind is p.VAR_POSITIONAL:
                continue
            elif p.kind is p.POSITIONAL_ONLY:
                raise EntryPointError(
                    f"step_fn {name}: parameter {p.name!r} is positional-only; with named "
                    "objects every parameter is passed by name"
                )
            else:
                self._takes.append(p.name)
        if self._batch not in self._takes:
            # No parameter named 'batch': the batch goes to the first one not named after an
            # object (an RL step's episode(seed), a step(model, optimizer, data)).
            free = [n for n in self._takes if n not in self.objects.named]
            if free:
                self._batch = free[0]
            elif not self._var_kw:
                raise EntryPointError(
                    f"step_fn {name}{sig} takes no batch: with named objects "
                    f"({', '.join(self.objects.named)}), step_fn receives them by parameter "
                    "name, and the batch in a parameter named 'batch' (or its first other one)"
                )
        self._wanted = [
            p.name
            for p in sig.parameters.values()
            if p.name in self._takes
            and p.default is p.empty
            and p.name != self._batch
            and p.name not in self.objects.named
        ]

    def _unfilled(self, values: Mapping[str, Any] | None) -> None:
        """Raise, naming what to do, when a parameter only a per-step value fills has none (a
        GAN's ``step(D, G, ...)`` with its discriminator given as ``model``)."""
        missing = [n for n in self._wanted if values is None or n not in values]
        if missing:
            fn = getattr(self.step_fn, "__qualname__", "step_fn")
            n = missing[0]
            raise TypeError(
                f"{fn}() parameter {n!r} is given nothing: it names no object the Recorder "
                f"holds ({', '.join(self.objects.present())}), it is not the batch "
                f"({self._batch!r}), and rec.step passed no {n}=; name the object {n!r} in "
                f"objects= (objects={{..., {n!r}: ...}}) or pass rec.step(batch, {n}=...)"
            )

    def takes(self, name: str) -> bool:
        """Whether a per-step value of this name reaches the step function."""
        if self.objects.style == "named" and name in self.objects.named:
            return False  # (an object of that name is passed instead)
        return self._var_kw or name in self._takes

    def with_objects(self, **replace: Any) -> StepCall:
        """The same call with some objects replaced (the tracer passes the eager module of a
        compiled model)."""
        other = copy.copy(self)
        other.objects = RunObjects({**self.objects.named, **replace}, self.objects.style)
        return other

    def with_step(self, step_fn: Callable[..., Any]) -> StepCall:
        """The same call of another function of the same code (a closure made again each
        epoch, or each batch): its parameters are the same, so is the plan."""
        other = copy.copy(self)
        other.step_fn = step_fn
        return other

    def __call__(self, batch: Any, values: Mapping[str, Any] | None = None) -> Any:
        objs = self.objects
        if not self._by_name:
            given = {k: v for k, v in (values or {}).items() if self._var_kw or k in self._takes}
            return self.step_fn(objs.model, objs.optimizer, batch, **given)
        if self._wanted:
            self._unfilled(values)
        kw: dict[str, Any] = {}
        for n in self._takes:
            if n == self._batch:
                kw[n] = batch
            elif n in objs.named:
                kw[n] = objs.named[n]
            elif values is not None and n in values:
                kw[n] = values[n]
        if self._var_kw and values:
            for k, v in values.items():
                kw.setdefault(k, v)
        return self.step_fn(**kw)


def _slots(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """The parameters an argument can fill by position (none where ``*args`` takes any)."""
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return []
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _zero_shard(obj: Any) -> Any:
    """The optimizer over this rank's shard of a ``ZeroRedundancyOptimizer``, else ``None``."""
    cls = type(obj)
    if cls.__name__ == "ZeroRedundancyOptimizer" and cls.__module__.startswith("torch.distributed"):
        return obj.optim
    return None


def state_of(obj: Any) -> Any:
    """``obj.state_dict()``, what a snapshot keeps; a ``ZeroRedundancyOptimizer``'s raises unless
    every rank first gathered the whole state on one (a collective), so each rank keeps the shard
    it holds, in its own file, as under FSDP2 (recording stopped at the first snapshot)."""
    shard = _zero_shard(obj)
    return {"zero_shard": shard.state_dict()} if shard is not None else obj.state_dict()


def load_into(obj: Any, sd: Any, int_keys: Callable[[Any], Any] = lambda sd: sd) -> None:
    """``obj.load_state_dict(int_keys(sd))`` for what :func:`state_of` took (``int_keys``: an
    optimizer's state keys made ints again); a ZeRO shard's hyper-parameters go back into the
    optimizer's groups too (each rank's shard has one group per group)."""
    shard = _zero_shard(obj)
    if shard is None:
        obj.load_state_dict(int_keys(sd))
        return
    shard.load_state_dict(int_keys(sd["zero_shard"]))
    for group, mine in zip(obj.param_groups, shard.param_groups):
        group.update({k: v for k, v in mine.items() if k != "params"})


def gather_state(objects: RunObjects, model: torch.nn.Module | None = None) -> dict[str, Any]:
    """What a snapshot holds, as live references (the caller copies): every object's
    ``state_dict`` and the gradients that are not ``None`` (accumulation across ``rec.step``
    calls leaves some pending at a snapshot).

    ``model``: the module whose state is kept (the one inside a DDP wrapper).
    """
    model = model if model is not None else objects.model
    state: dict[str, Any] = {"model": model.state_dict()}
    for role in ROLES[1:]:
        obj = objects.named.get(role)
        if obj is not None:
            state[role] = state_of(obj)
    if objects.extras:
        state["objects"] = {k: state_of(v) for k, v in objects.extras.items()}
    state["layout"] = param_layout(objects, model)
    state["grads"] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    # The other models' pending gradients too (a GAN's netG): a replay from this state must
    # not see a previous replay's gradients there.
    if other := other_models(objects, model):
        state["object_grads"] = {
            name: {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
            for name, m in other.items()
        }
    return state


def _named_params(objects: RunObjects, model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Every parameter of the run's modules by a name that finds it again in a replay: the
    model's as ``model.<name>``, another named module's as ``<object name>.<name>``."""
    out: dict[str, torch.nn.Parameter] = {}
    seen: set[int] = set()
    for owner, m in [("model", model), *other_models(objects, model).items()]:
        for n, p in m.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out[f"{owner}.{n}"] = p
    return out


def run_params(objects: RunObjects, model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every parameter of the run's modules, in the order of a step's ``trainable`` flags."""
    return list(_named_params(objects, model).values())


def optimizers(objects: RunObjects) -> dict[str, torch.optim.Optimizer]:
    """Every optimizer among the run's objects by name (``optimizer`` first), unwrapped."""
    found = {"optimizer": objects.optimizer, **objects.extras}
    inner = {k: inner_optimizer(v) for k, v in found.items()}  # (None stays None)
    return {k: v for k, v in inner.items() if isinstance(v, torch.optim.Optimizer)}


def param_layout(objects: RunObjects, model: torch.nn.Module) -> dict[str, Any]:
    """What a ``state_dict`` leaves out of the run's parameters, and a run can change: which
    parameters each optimizer's groups hold, by name (``optimizer.add_param_group``: gradual
    unfreezing), and which parameters are frozen (``requires_grad`` off). A parameter no module
    of the run holds has no name (``None``): its group is then left as the replay built it."""
    named = _named_params(objects, model)
    names = {id(p): n for n, p in named.items()}
    groups = {
        k: [[names.get(id(p)) for p in g["params"]] for g in opt.param_groups]
        for k, opt in optimizers(objects).items()
    }
    frozen = [n for n, p in named.items() if not p.requires_grad]
    return {"params": list(named), "groups": groups, "frozen": frozen}


def apply_layout(objects: RunObjects, model: torch.nn.Module, layout: Any) -> None:
    """Put the parameters back as ``param_layout`` found them: frozen or not, and in the
    optimizers' groups (a group a later ``add_param_group`` made is made again; one made after
    this snapshot goes). A snapshot without a layout (older files) leaves them as they are."""
    if not isinstance(layout, dict):
        return
    named = _named_params(objects, model)
    if layout.get("params") != list(named):
        return  # another model than the recorded one, or named otherwise: nothing to match by
    frozen = layout.get("frozen")
    if isinstance(frozen, list) and all(isinstance(n, str) for n in frozen):
        off = set(frozen)
        for n, p in named.items():
            if p.requires_grad == (n in off):
                p.requires_grad_(n not in off)
    kept = layout.get("groups")
    if not isinstance(kept, dict):
        return
    for k, opt in optimizers(objects).items():
        groups = kept.get(k)
        if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
            continue
        now = {id(p): n for n, p in named.items()}
        if [[now.get(id(p)) for p in g["params"]] for g in opt.param_groups] == groups:
            continue
        if not groups or not all(isinstance(n, str) and n in named for g in groups for n in g):
            continue  # (a parameter it cannot name: load_state_dict says what does not fit)
        base = {k2: v for k2, v in opt.param_groups[0].items() if k2 != "params"}
        opt.param_groups = [
            {
                **(opt.param_groups[i] if i < len(opt.param_groups) else base),
                "params": [named[n] for n in names],
            }
            for i, names in enumerate(groups)
        ]


def other_models(objects: RunObjects, model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The run's named modules other than ``model`` (a GAN's netG), in the order named."""
    return {
        k: v for k, v in objects.extras.items() if isinstance(v, torch.nn.Module) and v is not model
    }


def load_state(
    objects: RunObjects,
    state: Mapping[str, Any],
    convert: Callable[[str, Any], Any],
    *,
    int_keys: Callable[[Any], Any] = lambda sd: sd,
) -> None:
    """Load a snapshot or in-memory state into the live objects.

    ``convert(key, subtree)`` turns each kept subtree into live values (the store's leaves into
    tensors on the replay device, or a copy of an in-memory state that must stay pristine). Gradients are set exactly as kept:
    a parameter without a kept gradient gets ``None``, so nothing of a previous replay leaks in.
    """
    model = objects.model
    model.load_state_dict(convert("model", state["model"]))
    apply_layout(objects, model, state.get("layout"))
    for role in ROLES[1:]:
        obj = objects.named.get(role)
        if obj is not None and state.get(role) is not None:
            sd = convert(role, state[role])
            load_into(obj, sd, int_keys if role == "optimizer" else lambda sd: sd)
    kept = state.get("objects") or {}
    for name, obj in objects.extras.items():
        if name in kept:
            load_into(obj, convert("objects", kept[name]))
    owners = [(model, convert("grads", state.get("grads") or {}))]
    kept_grads = state.get("object_grads") or {}
    other = convert("object_grads", kept_grads) if kept_grads else {}
    owners += [(m, other.get(name) or {}) for name, m in other_models(objects, model).items()]
    seen: set[int] = set()  # a parameter shared with the model keeps the model's gradient
    with torch.no_grad():
        for m, grads in owners:
            for n, p in m.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    g = grads.get(n)
                    p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
