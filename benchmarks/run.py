"""Run every benchmark and write benchmarks/RESULTS.md (what `make bench` does).

Each benchmark runs as its own process, one after the other (never two at once: they measure
ratios on a shared 2-core machine). The file records the exact command and the output of each.

    .venv/bin/python benchmarks/run.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BENCHES = [
    (
        "Recorder overhead (issue: median ratio <= 1.03)",
        "benchmarks/bench_record.py",
        ["--rounds", "15", "--steps", "40"],
        ["--rounds", "3", "--steps", "20"],
    ),
    (
        "Recorder overhead with a core left to the writer (torch at 1 thread)",
        "benchmarks/bench_record.py",
        [
            "--threads",
            "1",
            "--variants",
            "bare_again,thread_only,recorder,committed",
            "--rounds",
            "11",
            "--steps",
            "40",
            "--no-throughput",
        ],
        [
            "--threads",
            "1",
            "--variants",
            "thread_only,committed",
            "--rounds",
            "2",
            "--steps",
            "10",
            "--no-throughput",
        ],
    ),
    (
        "Recorder backlog under continuous training (does the writer keep up?)",
        "benchmarks/bench_backlog.py",
        ["--steps", "2000"],
        ["--steps", "100"],
    ),
    (
        "Traced step cost (issue: <= 10x a plain step)",
        "benchmarks/bench_trace.py",
        ["--reps", "9"],
        ["--reps", "3"],
    ),
    (
        "Bisect vs rerunning under detect_anomaly (issue: >= 20x, replayed <= snapshot_every + 1)",
        "benchmarks/bench_bisect.py",
        ["--width", "768", "--snapshot-every", "50"],
        ["--steps", "300", "--fail-at", "290", "--width", "256"],
    ),
    (
        "TUI first paint on a 200,000-op step (issue: about 1 s)",
        "benchmarks/bench_tui.py",
        [],
        ["--repeat", "1", "--moves", "10"],
    ),
    (
        "The background self-check's cost to training (issue: <= 1.05x while it runs)",
        "benchmarks/bench_selfcheck.py",
        ["--rounds", "3"],
        ["--rounds", "1", "--workloads", "MLP"],
    ),
    (
        "The file's size for 100,000 steps of the benchmark GPT (issue 35: reach 10,000)",
        "benchmarks/bench_reach.py",
        ["--steps", "240"],
        ["--steps", "20"],
    ),
    (
        "Batches by reference vs by value: bytes and time per step (issue 35)",
        "benchmarks/bench_batch_refs.py",
        ["--rounds", "5", "--steps", "40"],
        ["--rounds", "1", "--steps", "3"],
    ),
    (
        "Recorder overhead under 2-rank DDP (gloo, CPU)",
        "benchmarks/bench_ddp.py",
        ["--rounds", "7", "--steps", "40"],
        ["--rounds", "2", "--steps", "10"],
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the scripts run")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    parts = [
        "# Benchmark results\n",
        f"Produced by `.venv/bin/python benchmarks/run.py{' --quick' if args.quick else ''}` on "
        f"{time.strftime('%Y-%m-%d')}: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}. Every ratio is measured side by side in one run.\n",
    ]
    for title, script, full, quick in BENCHES:
        argv = [sys.executable, script, *(quick if args.quick else full)]
        shown = " ".join(["PYTHONPATH=.", ".venv/bin/python", script, *argv[2:]])
        print(f"== {title}\n$ {shown}", flush=True)
        t0 = time.time()
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        out = proc.stdout.strip() or "(no output)"
        if proc.returncode != 0:
            out += f"\n\n(exit {proc.returncode})\n" + proc.stderr.strip()[-2000:]
        print(out, flush=True)
        parts.append(
            f"## {title}\n\n```\n$ {shown}\n```\n\n{out}\n\n_({time.time() - t0:.0f} s)_\n"
        )
    Path(args.out).write_text("\n".join(parts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
