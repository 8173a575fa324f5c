"""The recorder's cost under 2-rank DDP (gloo, CPU), as a ratio to bare DDP, measured side by side.

    PYTHONPATH=. python benchmarks/bench_ddp.py [--rounds 7] [--steps 40]

Each rank trains identical MLPs wrapped in DistributedDataParallel, alternating every round:
bare DDP; a second bare DDP ("bare, again": how far two identical variants drift on this
machine); bare DDP with torch's own Python all-reduce comm hook (what any Python hook costs);
the recorder's DDP side alone (its comm hook measuring local gradients and carrying the stop's
votes, read every step: no recorder); DDP under ``replay.Recorder`` with the rank-consistent stop (the comm-hook probe, the stop's
votes riding DDP's last bucket); and the recorder with ``raise_on_nonfinite=False`` (probe, no
votes). Rank 0 prints a markdown table: median ms/step, the median over rounds of the per-round
ratio to bare DDP, and the c10d collectives one step of each variant issues (profiler count).
It also times one tiny all-reduce alone: what the stop cost per step before it rode DDP's.
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import replay  # noqa: E402
from replay.ranks.ddp_hook import LocalGradProbe  # noqa: E402
from replay.ranks.votes import BucketVotes  # noqa: E402

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
    names = (
        "bare DDP",
        "bare, again",
        "Python comm hook",
        "probe + votes alone",
        "recorder",
        "recorder, no stop",
    )
    for name in names:
        model, opt = build()
        ddp = DistributedDataParallel(model)
        if name == "Python comm hook":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        if name == "probe + votes alone":  # the recorder's DDP side, without the recorder
            probe = LocalGradProbe(
                ddp, list(model.parameters()), rank=rank, world_size=2, votes=True
            )
            assert probe.install() is None
            votes = BucketVotes(probe, 2, torch.device("cpu"))

            def probed(
                b: Any, ddp: Any = ddp, opt: Any = opt, p: Any = probe, v: Any = votes
            ) -> Any:
                loss = train_step(ddp, opt, b)
                v.post(0, float(loss.detach()), p.take())
                assert v.result() is None
                return loss

            variants[name] = probed
            continue
        if not name.startswith("recorder"):
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
    collectives = {}
    for name, fn in variants.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn(data[0])
        collectives[name] = sum(1 for e in prof.events() if e.name.startswith("c10d::"))
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
            "| variant | ms/step (median) | ratio to bare DDP (median of rounds) | ratio range "
            "| collectives per step |",
            "|---|---|---|---|---|",
        ]
        for name, ts in times.items():
            ratios = [t / b for t, b in zip(ts, bare)]
            lines.append(
                f"| {name} | {statistics.median(ts) * 1e3:.2f} | "
                f"{statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} | "
                f"{collectives[name]} |"
            )
        lines += [
            "",
            f"one tiny all-reduce alone (2 float32, MAX; the stop's own collective before it "
            f"rode DDP's): {flag_us:.0f} µs",
        ]
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
