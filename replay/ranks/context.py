"""Is this process one rank of a multi-process run? (torch side of the recorder)"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DistContext", "detect", "device_of", "shared_run_id", "unwrap"]


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    backend: str | None
    local_rank: int | None
    group: Any = None  # the initialised default process group, or None (overrides only)

    @property
    def collective(self) -> bool:
        """True when ranks can talk: the consistent stop and the gradient probe need it."""
        return self.group is not None

    def meta(self) -> dict[str, Any]:
        """What ``meta.distributed`` holds (docs/format.md)."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": self.backend,
            "local_rank": self.local_rank,
        }


def _local_rank() -> int | None:
    v = os.environ.get("LOCAL_RANK")
    return int(v) if v is not None and v.isascii() and v.isdigit() else None


def detect(rank: int | None = None, world_size: int | None = None) -> DistContext | None:
    """The distributed context of this process, ``None`` for a single process.

    Automatic under ``torch.distributed`` with more than one rank; ``rank``/``world_size`` override
    it (for launchers that run ranks without a process group: files are named and described per
    rank, but there is nobody to agree a stop with).
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        r = dist.get_rank() if rank is None else rank
        w = dist.get_world_size() if world_size is None else world_size
        if w > 1:
            # The group is used only when the overrides agree with it: a stop agreed with the
            # wrong ranks would deadlock.
            same = (r, w) == (dist.get_rank(), dist.get_world_size())
            group = dist.group.WORLD if same else None
            return DistContext(r, w, str(dist.get_backend()), _local_rank(), group)
        return None
    if rank is None and world_size is None:
        return None
    if rank is None or world_size is None:
        raise ValueError("give both rank= and world_size= (or neither, under torch.distributed)")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not in range(world_size={world_size})")
    return DistContext(rank, world_size, None, _local_rank(), None)


def device_of(group: Any) -> torch.device:
    """Where a rank's collectives' tensors live: the current GPU under NCCL, else the CPU."""
    if str(torch.distributed.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_PROCESS_RUN = uuid.uuid4()  # ranks recorded by one process (rank= overrides) agree on it


def shared_run_id(ctx: DistContext, mine: str, base: str) -> str:
    """One run id for every rank of the run (docs/trust.md: a rank set is one run). Rank 0's,
    broadcast over the process group as 16 bytes (no pickle); without a group, what the launcher
    says (``REPLAY_RUN_ID``, torchrun's ``TORCHELASTIC_RUN_ID``) or, for ranks one process
    records, that process's, with the base path. ``mine`` when none of these can be had."""
    if ctx.group is not None:
        try:
            device = device_of(ctx.group)
            raw = torch.tensor(list(bytes.fromhex(mine)), dtype=torch.uint8, device=device)
            torch.distributed.broadcast(raw, src=0, group=ctx.group)
            return bytes(raw.cpu().tolist()).hex()
        except (RuntimeError, ValueError):  # never fail training over an id: the set says so
            return mine
    for name in ("REPLAY_RUN_ID", "TORCHELASTIC_RUN_ID"):
        given = os.environ.get(name, "")
        if given and given != "none":
            return uuid.uuid5(uuid.NAMESPACE_URL, f"{given}\0{base}").hex
    return uuid.uuid5(_PROCESS_RUN, base).hex


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module inside a ``DistributedDataParallel`` wrapper, a ``torch.compile``
    ``OptimizedModule`` and Fabric's ``_FabricModule`` (the model itself otherwise).

    Snapshots hold its state dict, without DDP's ``module.`` or compile's ``_orig_mod.`` prefix,
    so that a replay loads them into the plain module; the step still runs through the wrapper.
    """
    from torch.nn.parallel import DistributedDataParallel

    for _ in range(4):  # compile(DDP(m)), DDP(compile(m)): a few layers at most
        if isinstance(model, DistributedDataParallel):
            model = model.module
            continue
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module) and type(model).__name__ == "OptimizedModule":
            model = inner
            continue
        inner = getattr(model, "_original_module", None)  # Lightning Fabric's setup()
        if isinstance(inner, torch.nn.Module) and type(model).__name__ == "_FabricModule":
            model = inner
            continue
        break
    return model
