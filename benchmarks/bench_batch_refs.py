"""Batches by reference vs by value: bytes per step in the file and the training loop's time
per step, for the three workloads fed by a DataLoader over a map-style dataset.

Side by side in one process, alternating variants round by round: "bare" (the loop without a
Recorder), "by value" (``Recorder(loader=..., by_reference=False)``: each batch's bytes) and "by
reference" (``Recorder(loader=...)``: the sampler's indices and a SHA-256 of the batch). Each
variant trains its own copy of the model; the time is the loop's wall time per step on the
training thread (fetch, collate, ``rec.step``), median over rounds. Bytes per step are the
``/steps`` payloads the file holds (``nbytes``), averaged over the kept steps.

Run:  .venv/bin/python benchmarks/bench_batch_refs.py [--rounds 5 --steps 40] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import WORKLOADS, step  # noqa: E402

import replay  # noqa: E402


class Samples(Dataset):
    """``n`` samples shaped like one row of a workload's batch (fixed, seeded)."""

    def __init__(self, batch, n: int = 512) -> None:
        g = torch.Generator().manual_seed(0)
        x, y = batch
        if x.dtype == torch.int64:  # GPT: token sequences
            self.x = torch.randint(0, 256, (n, *x.shape[1:]), generator=g)
            self.y = torch.randint(0, 256, (n, *y.shape[1:]), generator=g)
        else:
            self.x = torch.randn((n, *x.shape[1:]), generator=g)
            self.y = torch.randint(0, 10, (n, *y.shape[1:]), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _bytes_per_step(path: str) -> float:
    with h5py.File(path, "r", swmr=True) as f:
        marks = f["steps/step"][:]
        return float(f["steps/nbytes"][:][marks >= 0].mean())


def _run(variant: str, name: str, steps: int, directory: str, r: int) -> tuple[float, float]:
    """Seconds per step of the loop, bytes per step in the file (NaN for bare)."""
    model, batch = WORKLOADS[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = DataLoader(
        Samples(batch), batch_size=len(batch[0]), shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(r),
    )  # fmt: skip
    batches = None  # iterated once the Recorder sits in the loader (as `for batch in loader`)

    def next_batch():
        nonlocal batches
        try:
            if batches is None:
                raise StopIteration
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    def train(batch):
        return step(model, opt, batch)

    if variant == "bare":
        train(next_batch())  # warm-up, as the recorder's first step
        t0 = time.perf_counter()
        for _ in range(steps):
            train(next_batch())
        return (time.perf_counter() - t0) / steps, float("nan")
    path = os.path.join(directory, f"{variant}-{r}.h5")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = replay.Recorder(
            path, objects={"model": model, "optimizer": opt}, step_fn=train, loader=loader,
            by_reference=variant == "reference", self_check=False,
        )  # fmt: skip
        with rec:
            rec.step(next_batch())  # the first step: the file is made, the reference checked
            t0 = time.perf_counter()
            for _ in range(steps):
                rec.step(next_batch())
            elapsed = time.perf_counter() - t0
    per_step = _bytes_per_step(path)
    os.remove(path)
    return elapsed / steps, per_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    variants = ("bare", "value", "reference")
    print(
        f"# batches by reference vs by value ({args.rounds} rounds x {args.steps} steps, "
        f"{args.threads} torch thread(s); median per step)\n"
    )
    print("| workload | batch | bytes/step by value | by reference | ms/step bare | by value "
          "| by reference | reference / value |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for name in WORKLOADS:
            times: dict[str, list[float]] = {v: [] for v in variants}
            sizes: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in variants if r % 2 == 0 else variants[::-1]:
                    s, b = _run(v, name, args.steps, d, r)
                    times[v].append(s)
                    sizes[v].append(b)
            _, batch = WORKLOADS[name]()
            nbytes = sum(t.numel() * t.element_size() for t in batch)
            med = {v: statistics.median(times[v]) * 1e3 for v in variants}
            print(
                f"| {name} | {nbytes / 1024:.0f} KiB | {np.mean(sizes['value']) / 1024:.1f} KiB "
                f"| {np.mean(sizes['reference']) / 1024:.1f} KiB | {med['bare']:.2f} "
                f"| {med['value']:.2f} | {med['reference']:.2f} "
                f"| {med['reference'] / med['value']:.3f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
