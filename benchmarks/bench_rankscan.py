"""Finding the first (step, rank) over a thousand rank files: serial, threads and processes.

    PYTHONPATH=. python benchmarks/bench_rankscan.py [--ranks 1024] [--steps 40] [--dir DIR]

Generates two rank sets of ``--ranks`` files each: *health only* (``not_replayable``: health
rows, no snapshots) and *health + snapshots* (a snapshot every 10 steps, each step's batch).
Rank 0 is recorded by ``replay.Recorder`` (its ``rank=``/``world_size=`` override) from a tiny
MLP's training loop; the other ranks are written by the real store writer from its contents
(``_generate`` says why). One rank (60% of the way) goes non-finite at step ``BAD_STEP``,
another a few steps later, so the answer is one (step, rank). Then times
``replay.ranks.scan.scan_rank_set`` on each set, alternating variants: one process reading
every file, a thread pool, and the process pool the scan uses (one worker per core). Prints a
markdown table (median seconds over ``--rounds``) and checks that the scan's worker processes
never imported torch. ``--dir`` keeps the generated files (reused on the next run).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BAD_STEP, LATE_STEP = 27, 31  # a later rank also goes bad, later: not the answer


def bad_ranks(ranks: int) -> tuple[int, int]:
    """The rank that goes bad first (about 60% of the way) and the one that goes bad later."""
    return ranks * 3 // 5, ranks // 10


def _template(path: str, ranks: int, steps: int, snapshots: bool) -> None:
    """Rank 0 of the set, recorded by the real recorder from a real training loop."""
    import torch

    import replay

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def step(batch: Any) -> Any:
        x, y = batch
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    kw: dict[str, Any] = (
        {"snapshot_every": 10, "keep_snapshots": 2}
        if snapshots
        else {"not_replayable": "health only (bench_rankscan)"}
    )
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=step,
        rank=0,
        world_size=ranks,
        raise_on_nonfinite=False,
        self_check=False,
        handle_signals=False,
        keep_health=1000,
        **kw,
    ) as rec:
        g = torch.Generator().manual_seed(0)
        for _ in range(steps):
            rec.step((torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)))


def _generate(base: str, ranks: int, steps: int, snapshots: bool) -> None:
    """Rank 0 recorded for real (``_template``), then every other rank written by the real store
    writer (``StoreWriter``: the layout, checksums and status the recorder's writer process
    writes) with rank 0's metadata, rings and health under its own rank; two ranks' rows go
    non-finite. A recorder per rank costs a writer process and a training loop each: 2,048 of
    them took most of an hour on this machine."""
    import h5py
    import numpy as np

    from replay.ranks.names import rank_path
    from replay.store.contracts import HealthFrame, SnapshotFrame, StepFrame
    from replay.store.layout import HEALTH_COLUMNS
    from replay.store.reader import open_recording
    from replay.store.writer import RingSpec, StoreWriter

    first = rank_path(base, 0)
    _template(base, ranks, steps, snapshots)
    with open_recording(first) as rec:
        meta, sources, run_id, h = rec.meta, rec.sources, rec.run_id, rec.health()
    col = {c: i for i, c in enumerate(HEALTH_COLUMNS)}
    rows = np.stack([h[c] for c in HEALTH_COLUMNS], axis=1)
    with h5py.File(first, "r", swmr=True) as f:
        rings = {}
        for ring in ("steps", "snapshots"):
            g = f[ring]
            arena = g["arena"]
            spec = RingSpec(len(g["step"]), arena.chunks[1], arena.shape[1])
            frames = [
                (int(t), slot, arena[slot, : int(n)], int(m))
                for slot, (t, n, m) in enumerate(zip(g["step"][()], g["nbytes"][()], g["mlen"][()]))
                if t >= 0
            ]
            rings[ring] = (spec, frames)
        health_slots = len(f["health/step"])
    bad, late = bad_ranks(ranks)
    for r in range(1, ranks):
        m = {**meta, "distributed": {**meta["distributed"], "rank": r}}
        w = StoreWriter(
            rank_path(base, r),
            run_id=run_id,
            meta=m,
            sources=sources,
            steps=rings["steps"][0],
            snapshots=rings["snapshots"][0],
            health_slots=health_slots,
        )
        mine = rows.copy()
        for who, at in ((bad, BAD_STEP), (late, LATE_STEP)):
            if r == who:
                after = h["step"] >= at
                mine[after, col["loss"]] = np.nan
                for c in ("loss_nonfinite", "grad_nonfinite", "param_nonfinite"):
                    mine[after, col[c]] = 1.0
        w.commit(
            steps=[StepFrame(t, p, ml) for t, _, p, ml in rings["steps"][1]],
            snapshots=[SnapshotFrame(s, t, p, ml) for t, s, p, ml in rings["snapshots"][1]],
            health=[HealthFrame(int(t), row) for t, row in zip(h["step"], mine)],
            last_step=int(h["step"][-1]),
        )
        w.close()


def _ensure(root: str, name: str, ranks: int, steps: int, snapshots: bool) -> str:
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, "run.h5")
    have = [f for f in os.listdir(d) if f.startswith("run.rank") and f.endswith(".h5")]
    if len(have) != ranks:
        for f in have:
            os.unlink(os.path.join(d, f))
        t0 = time.perf_counter()
        _generate(base, ranks, steps, snapshots)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(
            f"generated {ranks} rank files ({name}) in {time.perf_counter() - t0:.0f} s, "
            f"{size / ranks / 1024:.0f} KiB each",
            file=sys.stderr,
        )
    return base


def _threads(files: list[str]) -> tuple[float, Any]:
    """Every file read by a thread pool, in a child process: h5py objects freed across threads
    crashed libhdf5 (a segfault) in one run of 1,024 files, which must not end the benchmark.
    Returns the seconds the child measured and what it found (``None`` when it crashed)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # (a ProcessPoolExecutor, not a Pool: a Pool never tells that its worker died and waited
    # out its 600 s time limit after a segfault)
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        try:
            return pool.submit(_threads_here, files).result(timeout=600)
        except Exception:  # noqa: BLE001 - the crash is the result
            return math.nan, None


def _threads_here(files: list[str]) -> tuple[float, Any]:
    from replay.ranks.first_bad import first_bad_rank
    from replay.ranks.scan import scan_file

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0)) * 2) as pool:
        found = list(pool.map(scan_file, files))
    first = first_bad_rank({f.rank: f.evidence for f in found if f.evidence is not None})
    return time.perf_counter() - t0, first


def _no_torch_in_workers() -> bool:
    """Whether a scan worker process (forkserver, as the scan starts them) imported torch."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from replay.ranks import scan

    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return not pool.submit(_imports_torch_after, scan.__name__).result()


def _imports_torch_after(module: str) -> bool:
    import importlib

    importlib.import_module(module)
    return "torch" in sys.modules


def _cell(seconds: list[float]) -> str:
    ok = [t for t in seconds if not math.isnan(t)]
    crashed = len(seconds) - len(ok)
    text = f"{statistics.median(ok):.2f} s" if ok else "-"
    return text + (f" ({crashed} of {len(seconds)} crashed)" if crashed else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="keep the generated rank files here")
    args = ap.parse_args()
    os.environ.setdefault("REPLAY_SELF_CHECK", "0")
    root = args.dir or tempfile.mkdtemp(prefix="bench-rankscan-")
    sets = {
        "health only": _ensure(root, "health", args.ranks, args.steps, False),
        "health + snapshots": _ensure(root, "snapshots", args.ranks, args.steps, True),
    }
    from replay.ranks.names import resolve_rank_files
    from replay.ranks.scan import scan_rank_set

    cores = len(os.sched_getaffinity(0))

    cpu: dict[str, list[float]] = {}  # the one-process variant's CPU seconds, by set

    def serial(base: str) -> tuple[float, Any]:
        t0, c0 = time.perf_counter(), time.process_time()
        found = scan_rank_set(base, workers=1).first_bad
        cpu.setdefault(base, []).append(time.process_time() - c0)
        return time.perf_counter() - t0, found

    def pooled(base: str) -> tuple[float, Any]:
        t0 = time.perf_counter()
        found = scan_rank_set(base).first_bad  # one worker process per core
        return time.perf_counter() - t0, found

    variants = {
        "one process": serial,
        f"threads ({cores * 2})": lambda base: _threads(resolve_rank_files(base) or []),
        f"processes ({cores})": pooled,
    }
    times: dict[tuple[str, str], list[float]] = {}
    want = (BAD_STEP, (bad_ranks(args.ranks)[0],))
    for _ in range(args.rounds):
        for set_name, base in sets.items():
            for v, fn in variants.items():
                seconds, found = fn(base)
                times.setdefault((set_name, v), []).append(seconds)
                if found is None and math.isnan(seconds):
                    print(f"{v} on {set_name}: crashed", file=sys.stderr)
                elif found is None or (found.step, found.ranks) != want:
                    raise SystemExit(f"{v} on {set_name}: found {found}, expected {want}")
    print(f"{args.ranks} rank files, {args.steps} steps each, {cores} cores; median of "
          f"{args.rounds} rounds (files in the page cache)\n")  # fmt: skip
    print("| rank set | " + " | ".join(variants) + " |")
    print("|---|" + "---:|" * len(variants))
    for set_name in sets:
        cells = [_cell(times[(set_name, v)]) for v in variants]
        print(f"| {set_name} | " + " | ".join(cells) + " |")
    for set_name, base in sets.items():
        ms = 1e3 * statistics.median(cpu[base]) / args.ranks
        print(f"\n{set_name}: {ms:.1f} ms of CPU per file read in one process", end="")
    print(f"\n\nscan workers import torch: {'no' if _no_torch_in_workers() else 'YES'}")
    print(f"first bad: step {BAD_STEP} on rank {want[1][0]} (found by every variant that ran)")


if __name__ == "__main__":
    main()
