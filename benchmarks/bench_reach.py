"""The recording's size for a long run of the benchmark GPT, with default settings (reach
10,000: snapshots every 50 steps for the last 150, every 500 for the last 5,000, every 5,000
beyond, and every step's batch back to the oldest).

Why a short run says it: every per-step stream of the format is a ring of preallocated slots
(docs/format.md), so the file of an ``N``-step run is its fixed part (metadata, markers, chunk
indices) plus ``min(N, step_slots)`` step records, the snapshots the rule has kept at once so
far (at most ``snapshot_slots``), and ``min(N, keep_health)`` health rows, each allocated in the
dataset's chunks. This script records ``--steps`` steps of the real workload (fresh batches
every step, as training draws them), measures each part's bytes per slot in that file
(``get_storage_size`` of each dataset), checks that the parts add up to the file's size, and
states the size for longer runs from those per-slot figures and the rings' sizes.

Run:  .venv/bin/python benchmarks/bench_reach.py [--steps 120]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import warnings

import h5py
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import WORKLOADS, step  # noqa: E402

import replay  # noqa: E402
from replay.store.retention import SnapshotSlots  # noqa: E402

NAME = "GPT (2 blocks)"


def record(path: str, steps: int) -> None:
    model, batch = WORKLOADS[NAME]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)

    def train(batch):
        return step(model, opt, batch)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with replay.Recorder(
            path, objects={"model": model, "optimizer": opt}, step_fn=train, self_check=False
        ) as rec:
            for _ in range(steps):
                idx = torch.randint(0, 256, batch[0].shape[:1] + (65,), generator=g)
                rec.step((idx[:, :-1], idx[:, 1:]))


def _chunks(n: int, rows: int) -> int:
    return math.ceil(n / rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.h5")
        record(path, args.steps)
        size = os.path.getsize(path)
        with h5py.File(path, "r") as f:
            reach = __import__("json").loads(f["meta/run"][:].tobytes())["reach"]
            kept = int((f["steps/step"][:] >= 0).sum())
            snaps = int((f["snapshots/step"][:] >= 0).sum())
            steps_arena = f["steps/arena"].id.get_storage_size()
            snaps_arena = f["snapshots/arena"].id.get_storage_size()
            # what one slot holds once its ring is full: the largest record, in whole chunks
            # (the snapshot before step 0 has no optimizer moments yet: the later ones do)
            slot = {
                ring: max(
                    math.ceil(n / f[f"{ring}/arena"].chunks[1]) * f[f"{ring}/arena"].chunks[1]
                    for n, m in zip(f[f"{ring}/nbytes"][:], f[f"{ring}/step"][:])
                    if m >= 0
                )
                for ring in ("steps", "snapshots")
            }
            health = {k: f[f"health/{k}"] for k in ("step", "values", "crc")}
            h_chunk = {k: (ds.chunks[0], ds.id.get_storage_size()) for k, ds in health.items()}
            rows = int((f["health/step"][:] >= 0).sum())
            keep_health = int(f["health"].attrs["slots"])
    per_step, per_snap = slot["steps"], slot["snapshots"]
    # bytes of one health chunk of each dataset, from what this run allocated
    h_bytes = {k: stored / _chunks(rows, r) for k, (r, stored) in h_chunk.items()}
    health_now = sum(s for _, s in h_chunk.values())
    fixed = size - steps_arena - snaps_arena - health_now
    tiers = [tuple(t) for t in reach["tiers"]]
    print(f"# file size of the benchmark GPT, default settings ({args.steps} steps recorded)\n")
    print(
        f"measured: {size / 2**20:.2f} MiB = fixed {fixed / 2**20:.2f} MiB + {kept} step "
        f"records ({steps_arena / 2**20:.2f} MiB) + {snaps} snapshots "
        f"({snaps_arena / 2**20:.2f} MiB) + {rows} health rows ({health_now / 1024:.0f} KiB)"
    )
    print(
        f"one slot once full: a step record {per_step / 1024:.1f} KiB, a snapshot "
        f"{per_snap / 2**20:.2f} MiB (whole chunks of the largest record)"
    )
    print(
        f"rings: {reach['step_slots']:,} step slots, {reach['snapshot_slots']} snapshot slots, "
        f"{keep_health:,} health rows; reach {reach['reach']:,} steps\n"
    )
    print("| steps | step records | snapshots | health | file |")
    print("|---|---|---|---|---|")
    from replay.store.retention import ReachPlan

    p = ReachPlan(0, tuple(tiers), reach["step_slots"], reach["snapshot_slots"], reach["reach"])
    placer, t = SnapshotSlots(p), 0
    for n in (1_000, 10_000, 15_000, 100_000, 1_000_000):
        while t < n:
            placer.place(t)
            t += tiers[0][0]
        steps_b = min(n, reach["step_slots"]) * per_step
        snaps_b = placer.used * per_snap
        h = min(n, keep_health)
        health_b = sum(_chunks(h, r) * h_bytes[k] for k, (r, _) in h_chunk.items())
        total = fixed + steps_b + snaps_b + health_b
        print(
            f"| {n:,} | {steps_b / 2**20:.0f} MiB | {placer.used} x {per_snap / 2**20:.2f} MiB "
            f"| {health_b / 2**20:.1f} MiB | {total / 2**20:.0f} MiB |"
        )


if __name__ == "__main__":
    main()
