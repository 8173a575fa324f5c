"""Does the writer keep up when training runs continuously? Its backlog at two nice levels.

bench_record.py alternates short blocks, so a writer that falls behind catches up in the gaps.
Here a bare run and a recorded run each train ``--steps`` steps without a pause, on 2 cores that
training keeps busy, and the table shows what the recorder owed: the most steps ever handed over
and not yet sent to the writer process (what a ``kill -9`` would lose; training waits once there
are ``max_pending_steps``, 64 by default, the oldest ``max_pending_seconds``, 1 s, ago), how
many times training waited, the backlog left at
the end and how long ``close()`` then takes to drain it. "recorded / bare" is the wall time of
the two runs, so it includes the writer's share of the cores only as far as it got that share,
and waiting for the writer when it did not.

Run:  .venv/bin/python benchmarks/bench_backlog.py [--steps 2000] [--nice 19 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_record import build, fresh_batches, recorder_for, use_workload  # noqa: E402
from workloads import WORKLOADS, step  # noqa: E402

SCALE = {"MLP": 1.0, "CNN": 0.5}  # the CNN step is about twice as long


def run(name: str, nice: int, steps: int, tmp: str) -> dict[str, float]:
    os.environ["REPLAY_WRITER_NICE"] = str(nice)  # read when the writers start
    use_workload(name)
    _, template = WORKLOADS[name]()
    batches = fresh_batches(template, 40)
    torch.manual_seed(0)
    model, opt = build()
    for b in batches[:5]:
        step(model, opt, b)
    t0 = time.perf_counter()
    for i in range(steps):
        step(model, opt, batches[i % 40])
    bare = time.perf_counter() - t0
    torch.manual_seed(0)
    model, opt = build()
    rec = recorder_for(os.path.join(tmp, f"{name}-{nice}.h5"), model, opt)
    for b in batches[:5]:
        rec.step(b)
    t0 = time.perf_counter()
    for i in range(steps):
        rec.step(batches[i % 40])
    recorded = time.perf_counter() - t0
    writer = rec.transport.writer
    backlog = (writer._submitted - writer._committed) / 2**20
    most, waited = writer.max_pending_seen, writer.throttled
    t0 = time.perf_counter()
    rec.close()
    return {
        "bare": bare,
        "recorded": recorded,
        "backlog": backlog,
        "most": most,
        "waited": waited,
        "drain": time.perf_counter() - t0,
        "reuse": rec.transport.pool.hits
        / max(1, rec.transport.pool.hits + rec.transport.pool.misses),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000, help="MLP steps (the CNN runs half)")
    p.add_argument("--nice", type=int, nargs="+", default=[19, 10], help="writer nice levels")
    args = p.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores; "
        "default Recorder settings (max_pending_steps 64, max_pending_seconds 1, "
        "max_pending_bytes 1 GiB)\n"
    )
    print(
        "| workload | writer nice | steps | bare | recorded | recorded / bare | "
        "most steps pending | training waited | backlog at the end | close() drains it in | "
        "batch buffers reused |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for name, scale in SCALE.items():
            n = int(args.steps * scale)
            for nice in args.nice:
                r = run(name, nice, n, tmp)
                print(
                    f"| {name} | {nice} | {n} | {r['bare']:.1f} s | {r['recorded']:.1f} s | "
                    f"{r['recorded'] / r['bare']:.2f}x | {r['most']} | {r['waited']} | "
                    f"{r['backlog']:.1f} MiB | "
                    f"{r['drain']:.2f} s | {r['reuse']:.0%} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
