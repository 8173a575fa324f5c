"""The recorder's cost under 2-rank DDP (gloo, CPU), as a ratio to bare DDP, measured side by side.

    PYTHONPATH=. python benchmarks/bench_ddp.py [--rounds 7] [--steps 40]

Each rank trains three identical MLPs wrapped in DistributedDataParallel, alternating every round:
bare DDP; DDP under ``replay.Recorder`` with the rank-consistent stop (comm-hook probe plus one
tiny all-reduce per step); and the recorder with ``raise_on_nonfinite=False`` (probe, no stop
collective). It also times the stop's all-reduce alone. Rank 0 prints a markdown table: median
ms/step, and the median over rounds of the per-round ratio to bare DDP.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import replay  # noqa: E402

BATCH, D_IN, HIDDEN, D_OUT = 64, 256, 512, 10


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(D_IN, HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, D_OUT),
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> Any:
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def _worker(rank: int, port: int, rounds: int, steps: int, tmp: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    g = torch.Generator().manual_seed(rank)
    data = [
        (torch.randn(BATCH, D_IN, generator=g), torch.randint(0, D_OUT, (BATCH,), generator=g))
        for _ in range(steps)
    ]
    variants: dict[str, Any] = {}
    for name in ("bare DDP", "recorder", "recorder, no stop"):
        model, opt = build()
        ddp = DistributedDataParallel(model)
        if name == "bare DDP":
            variants[name] = lambda b, ddp=ddp, opt=opt: train_step(ddp, opt, b)
            continue
        rec = replay.Recorder(
            os.path.join(tmp, f"{name.replace(' ', '_').replace(',', '')}.h5"),
            model=ddp,
            optimizer=opt,
            step_fn=train_step,
            build_fn=build,
            raise_on_nonfinite=name == "recorder",
            handle_signals=False,
        )
        variants[name] = rec.step
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds + 1):  # round 0 warms up (bucket rebuild, file creation)
        order = list(variants) if r % 2 else list(reversed(variants))
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            for b in data:
                variants[name](b)
            dt = (time.perf_counter() - t0) / steps
            if r:
                times[name].append(dt)
    flag = torch.zeros(2)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(200):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    flag_us = (time.perf_counter() - t0) / 200 * 1e6
    for fn in variants.values():
        rec = getattr(fn, "__self__", None)
        if rec is not None:
            rec.close()
    if rank == 0:
        bare = times["bare DDP"]
        lines = [
            f"2 ranks, gloo, CPU, 1 thread each; MLP {D_IN}-{HIDDEN}-{HIDDEN}-{D_OUT}, batch "
            f"{BATCH}, AdamW; {rounds} rounds x {steps} steps, alternating",
            "",
            "| variant | ms/step (median) | ratio to bare DDP (median of rounds) | ratio range |",
            "|---|---|---|---|",
        ]
        for name, ts in times.items():
            ratios = [t / b for t, b in zip(ts, bare)]
            lines.append(
                f"| {name} | {statistics.median(ts) * 1e3:.2f} | "
                f"{statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} |"
            )
        lines += ["", f"stop all-reduce alone (2 float32, MAX): {flag_us:.0f} µs per step"]
        with open(out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "table.md")
        mp.spawn(_worker, args=(port, args.rounds, args.steps, tmp, out), nprocs=2)
        with open(out) as fh:
            print(fh.read(), end="")


if __name__ == "__main__":
    main()
