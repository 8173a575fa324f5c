"""A tiny FSDP2 training run for tests/integration/test_fsdp.py (gloo, CPU).

``build``/``train_step`` are the recorded entry points: ``build`` returns the plain model and
its optimizer, as for DDP; the loop shards the model with ``fully_shard`` (each Linear, then the
root) and makes its optimizer over the sharded parameters, and a multi-rank replay does the
same from ``meta.distributed.fsdp``.
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
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import replay


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    # 5 outputs over 2 ranks: the last Linear's shards are uneven (3 rows and 2).
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 5)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> Any:
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x).float(), y)
    loss.backward()
    optimizer.step()
    return loss


def train_step_accumulate(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any
) -> Any:
    """Gradients accumulate over two steps: an odd step leaves its (sharded) gradients pending,
    so the snapshot taken before the next step holds them."""
    x, y, update = batch
    loss = F.mse_loss(model(x).float(), y)
    loss.backward()
    if bool(update):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss


def batch_for(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 5, generator=g)


def shard(model: torch.nn.Module, bf16: bool = False) -> torch.optim.Optimizer:
    # bf16: compute in bfloat16, reduce gradients in float32, keep float32 shards.
    kw: dict[str, Any] = {}
    if bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


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
    result: dict[str, Any] = {"rank": rank, "finished": False}
    model, _ = build()
    opt = shard(model, bool(cfg.get("bf16")))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            with replay.Recorder(
                cfg["path"],
                model=model,
                optimizer=opt,
                step_fn=train_step_accumulate if cfg.get("accumulate") else train_step,
                build_fn=build,
                snapshot_every=cfg.get("snapshot_every", 2),
                keep_snapshots=cfg.get("keep_snapshots", 3),
                fingerprint_every=1,  # every step's parameter shards compared on replay
            ) as rec:
                result["file"] = rec.path
                for s in range(cfg["steps"]):
                    x, y = batch_for(rank, s)
                    if rank == cfg.get("nan_rank") and s == cfg.get("nan_step"):
                        x[3, 5] = float("nan")
                    result["last_step"] = s
                    if cfg.get("accumulate"):
                        rec.step((x, y, torch.tensor(s % 2 == 0)))
                    else:
                        rec.step((x, y))
            result["finished"] = True
        except replay.NonFiniteLossError as e:
            result.update(error="NonFiniteLossError", step=e.step, ranks=list(e.ranks or ()))
        except Exception as e:  # noqa: BLE001 - the test asserts on what each rank saw
            result.update(error=type(e).__name__, message=str(e).splitlines()[0])
    result["warnings"] = [
        str(w.message) for w in seen if issubclass(w.category, replay.RecorderWarning)
    ]
    result["local_shapes"] = {n: list(p.to_local().shape) for n, p in model.named_parameters()}
    if result["finished"] and not cfg.get("accumulate"):
        # The last step's full gradient norm, through DTensor ops (a collective every rank runs).
        norms = [torch.linalg.vector_norm(p.grad) for p in model.parameters()]
        full = torch.linalg.vector_norm(torch.stack([n.full_tensor() for n in norms]))
        result["full_grad_norm"] = float(full)
    with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()
