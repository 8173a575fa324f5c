"""A loop that trains until the background self-check has said its word (at most 300 s), so a
test sees whether the verdict came while training went on. Shapes: `--workers N` (a DataLoader
with N worker processes), `--amp` (bf16 autocast), `--global-lr` (the step reads a global the
loop changes: not replayable), `--prefetch` (the step trains on the batch the previous step
prefetched into a global, and fetches the next: nanoGPT's loop; replays carried on from the
first step, not from a later snapshot), `--budget B` (the self-check's state budget, bytes),
`--later` (snapshots every 10 steps, and the loop trains on until the later check, from the
snapshot of step 30, has said its word too), `--stop-at N` (a short run: N steps, whatever the
check has said), `--nan-at N` (the loss is NaN at step N: the run fails there)."""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import replay

LR_SCALE = 1.0  # changed by the loop: replay cannot see it
NEXT = None  # --prefetch: the batch the previous step fetched


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--global-lr", action="store_true")
    p.add_argument("--prefetch", action="store_true")
    p.add_argument("--budget", type=int, default=2 << 30)
    p.add_argument("--later", action="store_true")
    p.add_argument("--stop-at", type=int, default=None)
    p.add_argument("--nan-at", type=int, default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    loader = DataLoader(
        data,
        batch_size=16,
        shuffle=True,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(1),
    )

    def step(batch):
        global NEXT
        if args.prefetch:
            batch, NEXT = NEXT, (torch.randn(16, 16), torch.randint(0, 4, (16,)))
        x, y = batch
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
            loss = F.cross_entropy(model(x), y) * LR_SCALE
        if t == args.nan_at:
            loss = loss * float("nan")
        loss.backward()
        optimizer.step()
        return loss

    global NEXT
    NEXT = (torch.randn(16, 16), torch.randint(0, 4, (16,)))
    verdict = os.path.join(os.getcwd(), "run.selfcheck.json")
    deadline = time.monotonic() + 300
    t = 0
    with replay.Recorder(
        "run.h5",
        model=model,
        optimizer=optimizer,
        step_fn=step,
        self_check_budget=args.budget,
        # without --later, no later check within the run (its snapshot would be at step 30,000)
        # and no ring that moves on: the run ends at the first verdict and nothing outlives it
        snapshot_every=10 if args.later else 10_000,
    ) as rec:
        while time.monotonic() < deadline and t != args.stop_at:
            for batch in loader:
                rec.step(batch)
                t += 1
                if t == args.stop_at:
                    break
                if args.global_lr:
                    global LR_SCALE
                    LR_SCALE *= 0.9
                time.sleep(0.01)
            try:
                with open(verdict) as fh:
                    said = json.load(fh)
                # (--later: a first check that started after the ring moved past step 30, on
                # a loaded machine, was of a snapshot taken once training was under way too)
                first = (said.get("steps") or [0])[0]
                if said["status"] != "running" and not (
                    args.later and said["status"] == "ok" and not said.get("earlier") and first < 30
                ):
                    break
            except (OSError, ValueError):
                pass
    print(f"training ended at step {t}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
