"""A tiny DDP training run for tests/integration/test_distributed.py (gloo, CPU).

``build``/``train_step`` are the recorded entry points: module level, plain model (the worker
wraps it in DistributedDataParallel), so a single process replays any rank with them.
"""

from __future__ import annotations

import datetime
import json
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
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


def train_step_offset(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> Any:
    """As ``train_step``, plus a constant from the batch added to the loss it returns: a NaN
    there makes the loss non-finite while the gradients stay finite."""
    x, y, offset = batch
    return train_step(model, optimizer, (x, y)) + offset


SCALER: Any = None  # the worker's GradScaler, for train_step_amp


def train_step_amp(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> Any:
    """As ``train_step``, through a GradScaler: steps with inf/NaN gradients are skipped."""
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    SCALER.scale(loss).backward()
    SCALER.step(optimizer)
    SCALER.update()
    return loss.detach()


def count_collectives(fn: Any) -> int:
    """How many c10d collectives ``fn()`` issues (the profiler records one ``c10d::`` event for
    each, whether DDP's reducer or Python calls it)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("c10d::"))


def bare_collectives(rank: int) -> int:
    """The collectives of one step of bare DDP (after the bucket rebuild of the first step)."""
    model, opt = build()
    ddp = DistributedDataParallel(model)
    for s in range(2):
        train_step(ddp, opt, batch_for(rank, s))
    return count_collectives(lambda: train_step(ddp, opt, batch_for(rank, 2)))


def batch_for(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def run(rank: int, cfg: dict[str, Any], ddp: Any, opt: Any, result: dict[str, Any]) -> None:
    """Record ``cfg["steps"]`` steps of ``ddp``; ``result`` gets what happened."""
    global SCALER
    offset = cfg.get("loss_offset_rank") is not None
    count = cfg.get("count_steps", ())
    step_fn = train_step_offset if offset else train_step
    if cfg.get("amp"):
        SCALER, step_fn = torch.amp.GradScaler("cpu", init_scale=2.0**8), train_step_amp
    with replay.Recorder(
        cfg["path"],
        model=ddp,
        optimizer=opt,
        scaler=SCALER,
        step_fn=step_fn,
        build_fn=build,
        snapshot_every=cfg.get("snapshot_every", 2),
    ) as rec:
        result["file"] = rec.path
        for s in range(cfg["steps"]):
            x, y = batch_for(rank, s)
            if rank == cfg.get("nan_rank") and s == cfg.get("nan_step"):
                x[3, 5] = cfg.get("bad_value", float("nan"))
            if rank == cfg.get("inf_rank") and s == cfg.get("inf_step"):
                x[2, 7] = float("inf")  # tanh saturates: the loss stays finite, grads go NaN
            if rank == cfg.get("raise_rank") and s == cfg.get("raise_step"):
                x = x[:, :7]  # a shape error inside forward, on this rank only
            batch: Any = (x, y)
            if offset:
                bad = rank == cfg["loss_offset_rank"] and s == cfg["loss_offset_step"]
                batch = (x, y, torch.tensor(float("nan") if bad else 0.0))
            result["last_step"] = s
            if s in count:
                result["collectives"][str(s)] = count_collectives(lambda b=batch: rec.step(b))
            else:
                rec.step(batch)
        result["finished"] = True


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
    result: dict[str, Any] = {"rank": rank, "finished": False, "collectives": {}}
    count = cfg.get("count_steps", ())
    if count:
        result["bare_collectives"] = bare_collectives(rank)
    model, opt = build()
    ddp = DistributedDataParallel(model)
    if cfg.get("user_hook"):  # the user's own comm hook keeps the recorder's probe out
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            run(rank, cfg, ddp, opt, result)
        except replay.NonFiniteLossError as e:
            result.update(error="NonFiniteLossError", step=e.step, ranks=list(e.ranks or ()))
            result.update(stopped_at=e.stopped_at)
            result["message"] = str(e)
        except Exception as e:  # noqa: BLE001 - the test asserts on what each rank saw
            result.update(error=type(e).__name__, message=str(e).splitlines()[0])
    result["warnings"] = [
        str(w.message) for w in seen if issubclass(w.category, replay.RecorderWarning)
    ]
    with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    if result.get("error") in (None, "NonFiniteLossError"):
        dist.destroy_process_group()
