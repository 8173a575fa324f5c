"""Rebuilding the training objects and moving their state in and out (torch)."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from ..capture.objects import RunObjects, gather_state, load_state, objects_from_build
from ..capture.sharded import globalize, is_dtensor, mesh_of
from ..capture.tensors import from_leaves
from ..errors import EntryPointError, ReplayError, first_line

__all__ = ["build_objects", "load_snapshot", "capture_state", "restore_state"]


def build_objects(
    build_fn: Callable[..., Any],
    device: str,
    recorded: dict[str, Any] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> RunObjects:
    """Call ``build_fn()``, check what it returned against the recording, move the model.

    ``recorded``: ``meta/run.objects`` (absent in recordings made before named objects).
    """
    name = getattr(build_fn, "__qualname__", "build_fn")
    try:
        out = build_fn(**(kwargs or {}))
    except Exception as e:  # noqa: BLE001 - build_fn failing: one line, exit 4
        raise EntryPointError(
            f"build_fn {name}() raised {type(e).__name__}: {e}; fix it or pass --entry"
        ) from None
    objs = objects_from_build(out, f"build_fn {name}()")
    if recorded:
        want, got = list(recorded.get("names") or []), objs.present()
        if recorded.get("style") != objs.style or sorted(want) != sorted(got):
            raise EntryPointError(
                f"build_fn {name}() returned {_shape(objs.style, got)}, the recording was made "
                f"with {_shape(recorded.get('style'), want)}: the code changed since the "
                "recording; pass --entry to name the functions that match it"
            )
    # Module.to moves parameters in place (same Parameter objects), so the optimizer still
    # holds the right tensors; the snapshot then overwrites their values.
    objs.model.to(device)
    return objs


def _shape(style: Any, names: list[str]) -> str:
    return f"a dict of {', '.join(names)}" if style == "named" else f"({', '.join(names)})"


def _int_keys(sd: dict[str, Any]) -> dict[str, Any]:
    """Optimizer state is keyed by parameter index; make sure the indices are ints again."""
    state = sd.get("state", {})
    if any(not isinstance(k, int) for k in state):
        return {**sd, "state": {int(k): v for k, v in state.items()}}
    return sd


def load_snapshot(objs: RunObjects, snap: dict[str, Any], leaf_device: str | None) -> None:
    """Load a snapshot read from the store (``TensorLeaf`` trees) into the live objects."""

    # The engine caches the snapshot it read, and on the CPU its tensors share memory with
    # that cache (torch.from_numpy). The model copies into its parameters, but
    # optimizer.load_state_dict keeps tensors that already fit, and a kept gradient is set as
    # it is: a replayed step then updated the cache in place, and loading the same snapshot
    # again (a second experiment, a probe, then the replay) restored a later state. Everything
    # but the model gets its own copy, as restore_state does.
    # FSDP2: the snapshot holds this rank's local shards; each goes back into a DTensor of the
    # recorded layout on the mesh the replay sharded the model on (capture/sharded.py).
    dtensors = snap.get("dtensors") or []
    mesh = mesh_of(objs.model) if dtensors else None
    if dtensors and mesh is None:
        raise ReplayError(
            f"the snapshot of step {snap.get('step')} holds this rank's FSDP2 (fully_shard) "
            "shards, which only a model sharded the same way can take: replay every rank "
            "together (without --rank N --alone)"
        )

    def convert(key: str, v: Any) -> Any:
        live = from_leaves(v, leaf_device)
        mine = [{**d, "path": d["path"][1:]} for d in dtensors if d["path"][0] == key]
        if mine:
            live = globalize(live, mine, mesh)
        return live if key == "model" else copy.deepcopy(live)

    try:
        load_state(objs, snap, convert, int_keys=_int_keys)
    except (RuntimeError, KeyError, ValueError, TypeError) as e:
        raise ReplayError(
            f"the snapshot of step {snap.get('step')} does not fit the objects the replay made "
            f"({first_line(e)}): did the model or the optimizer change since the recording?"
        ) from None


def _copy(src: Any, old: Any) -> Any:
    """A deep copy of ``src``; its tensors are written into ``old``'s where they fit.

    Bisect keeps the state before every replayed step; copying into the buffers of the
    checkpoint it evicts instead of allocating new ones (``copy.deepcopy``) took the cost from
    9 ms to about 1.5 ms a step on the 1.8M-parameter benchmark MLP: fresh memory page-faults.
    """
    if is_dtensor(src):
        # FSDP2: copy the local shard (deepcopy of a sharded parameter's DTensor fails: "invalid
        # python storage") and wrap it again, as it was; no collective.
        from torch.distributed.tensor import DTensor

        mine = src.to_local().detach()
        prev = old.to_local() if is_dtensor(old) else None
        kept = _copy(mine, prev) if prev is not None else mine.clone()
        out = DTensor.from_local(
            kept,
            src.device_mesh,
            src.placements,
            run_check=False,
            shape=src.shape,
            stride=src.stride(),
        )
        return out.requires_grad_(src.requires_grad) if src.requires_grad else out
    if isinstance(src, torch.Tensor):
        if (
            isinstance(old, torch.Tensor)
            and old.shape == src.shape
            and old.dtype == src.dtype
            and old.device == src.device
            and old.layout == src.layout == torch.strided
            and not src.requires_grad
        ):
            return old.copy_(src)
        return copy.deepcopy(src)
    if isinstance(src, dict) and type(src) in (dict, OrderedDict):
        prev = old if isinstance(old, dict) else {}
        return type(src)((k, _copy(v, prev.get(k))) for k, v in src.items())
    if type(src) in (list, tuple):
        olds = old if isinstance(old, (list, tuple)) and len(old) == len(src) else [None] * len(src)
        return type(src)(_copy(v, o) for v, o in zip(src, olds))
    return copy.deepcopy(src)


def capture_state(objs: RunObjects, reuse: dict[str, Any] | None = None) -> dict[str, Any]:
    """An in-memory copy of everything a step changes (besides RNG, restored per step).

    ``reuse``: a capture no longer needed, whose tensors are overwritten with this one's.
    """
    reuse = reuse or {}
    with torch.no_grad():
        return {k: _copy(v, reuse.get(k)) for k, v in gather_state(objs).items()}


def restore_state(objs: RunObjects, state: dict[str, Any]) -> None:
    # load_state_dict of schedulers adopts the dict's objects, and a restored gradient is
    # accumulated into in place: hand over copies, keep the checkpoint pristine. The model's
    # load_state_dict copies into the parameters by itself.
    # (_copy, not copy.deepcopy: it also copies FSDP2's DTensors)
    load_state(objs, state, lambda k, v: v if k == "model" else _copy(v, None))
