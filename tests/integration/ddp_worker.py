"""A tiny DDP training run for tests/integration/test_distributed.py (gloo, CPU).

``build``/``train_step`` are the recorded entry points: module level, plain model (the worker
wraps it in DistributedDataParallel), so a single process replays any rank with them.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import replay


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> Any:
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def batch_for(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def worker(rank: int, cfg: dict[str, Any]) -> None:
    """One rank: record ``cfg["steps"]`` steps; write what happened to ``out/rank<r>.json``."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{cfg['port']}",
        rank=rank,
        world_size=cfg["world_size"],
        timeout=datetime.timedelta(seconds=cfg.get("pg_timeout", 60)),
    )
    model, opt = build()
    ddp = DistributedDataParallel(model)
    result: dict[str, Any] = {"rank": rank, "finished": False}
    try:
        with replay.Recorder(
            cfg["path"],
            model=ddp,
            optimizer=opt,
            step_fn=train_step,
            build_fn=build,
            snapshot_every=cfg.get("snapshot_every", 2),
        ) as rec:
            result["file"] = rec.path
            for s in range(cfg["steps"]):
                x, y = batch_for(rank, s)
                if rank == cfg.get("nan_rank") and s == cfg.get("nan_step"):
                    x[3, 5] = float("nan")
                if rank == cfg.get("inf_rank") and s == cfg.get("inf_step"):
                    x[2, 7] = float("inf")  # tanh saturates: the loss stays finite, grads go NaN
                if rank == cfg.get("raise_rank") and s == cfg.get("raise_step"):
                    x = x[:, :7]  # a shape error inside forward, on this rank only
                rec.step((x, y))
            result["finished"] = True
    except replay.NonFiniteLossError as e:
        result.update(error="NonFiniteLossError", step=e.step, ranks=list(e.ranks or ()))
        result["message"] = str(e)
    except Exception as e:  # noqa: BLE001 - the test asserts on what each rank saw
        result.update(error=type(e).__name__, message=str(e).splitlines()[0])
    with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    if result.get("error") in (None, "NonFiniteLossError"):
        dist.destroy_process_group()
