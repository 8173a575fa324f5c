"""FSDP2 (``torch.distributed.fsdp.fully_shard``): each rank keeps its own shard, no gather.

A model sharded with ``fully_shard`` holds its parameters (and the optimizer its moments, and
the backward its gradients) as ``DTensor``s: each rank owns one slice (``to_local()``). The
recorder keeps exactly that slice: a snapshot's DTensors become their local tensors (a view, no
copy and no collective), and the snapshot lists where they were (``dtensors``: path, global
shape, stride and placements, docs/format.md) so that a replay puts each slice back into a
DTensor of the same layout. Nothing is ever gathered to one rank.

The per-step numbers (gradient norm, parameter fingerprint, absmax) are taken over the local
shards too: a DTensor norm would be a collective, and the recorder decides some of them from
this rank's own values (a NaN loss fingerprints the parameters), so the ranks could disagree on
whether to join it. Under FSDP2 the gradients are already reduce-scattered when they are
measured, so the full norm of a step is ``sqrt(sum over ranks of grad_norm**2)``.

``layout(model)`` says how a model was sharded (``meta.distributed.fsdp``) and
``shard_like(model, layout)`` shards a freshly built model the same way on replay.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..errors import ReplayError
from ..store.tree import leaves, map_tree

__all__ = [
    "is_dtensor",
    "local",
    "layout",
    "localize",
    "globalize",
    "shard_like",
    "rebind_optimizer",
]


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (without importing ``torch.distributed.tensor``: until
    something imported it, no DTensor exists)."""
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a DTensor (a view, no collective); any other tensor as it is."""
    if is_dtensor(t):
        out: torch.Tensor = t.to_local()  # type: ignore[attr-defined]
        return out
    return t


def any_dtensor(tensors: Iterable[Any]) -> bool:
    return "torch.distributed.tensor" in sys.modules and any(is_dtensor(t) for t in tensors)


def _placement_json(p: Any) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    if type(p) is Shard:
        return ["shard", int(p.dim)]
    if type(p) is Replicate:
        return ["replicate"]
    raise ValueError(
        f"a DTensor placed as {p!r} (only Shard and Replicate are recorded: fully_shard's, or "
        "HSDP's on a 2-D mesh)"
    )


def localize(tree: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``tree`` with each DTensor replaced by its local tensor, and the list of what they were:
    ``{"path": [key, ...], "shape": global shape, "stride": global stride, "placements":
    [["shard", dim] | ["replicate"], ...]}``."""
    if "torch.distributed.tensor" not in sys.modules:
        return tree, []
    specs: list[dict[str, Any]] = [
        {
            "path": [k for _, k in keys],
            "shape": list(leaf.shape),
            "stride": list(leaf.stride()),
            "placements": [_placement_json(p) for p in leaf.placements],
        }
        for keys, leaf in leaves(tree)
        if is_dtensor(leaf)
    ]
    return (map_tree(local, tree) if specs else tree), specs


def _get(tree: Any, key: Any) -> tuple[Any, Any]:
    """``tree[key]`` with the key as the tree holds it (the store gives int keys back as str)."""
    if isinstance(tree, dict):
        if key in tree:
            return key, tree[key]
        for k in (
            str(key),
            int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else None,
        ):
            if k is not None and k in tree:
                return k, tree[k]
    if isinstance(tree, list) and isinstance(key, int) and key < len(tree):
        return key, tree[key]
    raise KeyError(f"{key!r}")


def globalize(tree: Any, specs: list[dict[str, Any]], mesh: Any) -> Any:
    """Put DTensors back at the paths ``specs`` name (paths relative to ``tree``), each built
    from its local tensor on ``mesh`` (no collective). Changes ``tree`` in place; returns it."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    for spec in specs:
        path = spec["path"]
        parent = tree
        for key in path[:-1]:
            _, parent = _get(parent, key)
        k, t = _get(parent, path[-1])
        parent[k] = DTensor.from_local(
            t,
            mesh,
            [Shard(int(p[1])) if p[0] == "shard" else Replicate() for p in spec["placements"]],
            run_check=False,
            shape=torch.Size(spec["shape"]),
            stride=tuple(spec["stride"]),
        )
    return tree


def mesh_of(model: torch.nn.Module) -> Any:
    """The device mesh of the model's first DTensor parameter (``None``: not sharded)."""
    for p in model.parameters():
        if is_dtensor(p):
            return p.device_mesh  # type: ignore[attr-defined]
    return None


def layout(model: torch.nn.Module) -> dict[str, Any] | None:
    """How ``model`` was sharded with ``fully_shard``, for ``meta.distributed.fsdp``; ``None``
    when it was not. ``modules``: the names of the modules ``fully_shard`` was applied to (the
    root is ``""``), in the order ``named_modules`` lists them; ``mesh``: the mesh's shape, dim
    names and device type; ``mp_policy``: ``{module name: its mixed-precision dtypes}`` for the
    modules that have any (``None``: full precision everywhere)."""
    if "torch.distributed.fsdp" not in sys.modules:
        return None
    from torch.distributed.fsdp import FSDPModule

    sharded = {n: m for n, m in model.named_modules() if isinstance(m, FSDPModule)}
    if not sharded:
        return None
    policies = {}
    for n, m in sharded.items():
        state = m._get_fsdp_state()
        mp = getattr(state, "_mp_policy", None)  # what fully_shard was given (torch 2.13)
        if mp is None:
            mp = getattr(getattr(state, "_fsdp_param_group", None), "mp_policy", None)
        if mp is None:
            continue
        dtypes = {
            k: None if getattr(mp, k) is None else str(getattr(mp, k)).removeprefix("torch.")
            for k in ("param_dtype", "reduce_dtype", "output_dtype")
        }
        if any(v is not None for v in dtypes.values()):
            policies[n] = {**dtypes, "cast_forward_inputs": bool(mp.cast_forward_inputs)}
    mesh = mesh_of(model)
    return {
        "kind": "fully_shard",
        "modules": list(sharded),
        "mesh": None
        if mesh is None
        else {
            "shape": list(mesh.shape),
            "dim_names": list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
            "device_type": mesh.device_type,
        },
        "mp_policy": policies or None,
    }


def shard_like(model: torch.nn.Module, spec: dict[str, Any], device: str) -> None:
    """Apply ``fully_shard`` to ``model`` as the recording says (``layout``'s output): the
    inner modules first, the root last, on a mesh of the recorded shape."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    m = spec.get("mesh") or {}
    world = torch.distributed.get_world_size()
    shape = tuple(m.get("shape") or (world,))
    names = m.get("dim_names")
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=tuple(names) if names else None)
    policies = spec.get("mp_policy") or {}

    def options(name: str) -> dict[str, Any]:
        mp = policies.get(name)
        if not mp:
            return {"mesh": mesh}
        policy = MixedPrecisionPolicy(
            **{
                k: None if mp.get(k) is None else getattr(torch, mp[k])
                for k in ("param_dtype", "reduce_dtype", "output_dtype")
            },
            cast_forward_inputs=bool(mp.get("cast_forward_inputs", True)),
        )
        return {"mesh": mesh, "mp_policy": policy}

    modules = dict(model.named_modules())
    missing = [n for n in spec["modules"] if n not in modules]
    if missing:
        raise ReplayError(
            f"the recording sharded module(s) {missing} with fully_shard, and the model "
            "build_fn made has none of that name: the model changed since the recording"
        )
    # Deepest first: fully_shard on a parent leaves its sharded children's parameters to them.
    for n in sorted(spec["modules"], key=lambda n: -(n.count(".") + bool(n))):
        fully_shard(modules[n], **options(n))


def rebind_optimizer(
    optimizer: torch.optim.Optimizer, before: Mapping[str, torch.Tensor], model: torch.nn.Module
) -> None:
    """``fully_shard`` replaces the model's parameters with new DTensor ones: point the
    optimizer ``build_fn`` made over the old ones at the new ones, by parameter name (its
    state is empty then, or loaded from the snapshot after)."""
    after = dict(model.named_parameters())
    new = {id(p): after[n] for n, p in before.items() if n in after}
    for group in optimizer.param_groups:
        group["params"] = [new.get(id(p), p) for p in group["params"]]
    optimizer.state.clear()
