"""Size of `replay report`'s page and time to write it, for a long recording and a large trace.

    PYTHONPATH=. python benchmarks/bench_report.py [--steps 10000] [--ops 200000] [--repeat 3]

Records ``--steps`` steps of the test MLP (tests/integration/scripts/mlp_train.py, a NaN at
the last steps, needs torch), then writes the page two ways, alternating, ``--repeat`` times:
from the recording alone (no sidecar), and with a synthetic sidecar of ``--ops`` ops
(tests/tui/synthetic.py, the TUI benchmark's) beside it. Each write is the whole command's work
(``write_report``: health, snapshots' update ratios, doctor's checklist, the ops around the
culprit). Prints a markdown table: the page's size, seconds to write it (best and median).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "tui"))


def _record(work: str, steps: int) -> str:
    run = os.path.join(work, "run.h5")
    env = dict(os.environ, PYTHONPATH=ROOT, REPLAY_SELF_CHECK="0", OMP_NUM_THREADS="1")
    script = os.path.join(ROOT, "tests", "integration", "scripts", "mlp_train.py")
    nan_at = max(1, steps - 1)  # the last step: every one of the --steps has its health
    proc = subprocess.run(
        [sys.executable, script, run, "--steps", str(steps), "--nan-at", str(nan_at)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if not os.path.exists(run):
        raise SystemExit(f"recording failed: {proc.stderr[-2000:]}")
    return run


def _time_write(run: str, out: str) -> tuple[float, int]:
    from replay.report import write_report

    t = time.perf_counter()
    size = write_report(run, out)
    return time.perf_counter() - t, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--ops", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work here (default: a temporary folder)")
    args = ap.parse_args()
    from synthetic import write_synthetic

    from replay.store import open_recording

    work = args.dir or tempfile.mkdtemp(prefix="bench-report-")
    os.makedirs(work, exist_ok=True)
    try:
        t = time.perf_counter()
        traced = _record(work, args.steps)
        record_s = time.perf_counter() - t
        alone = os.path.join(work, "alone", "run.h5")
        os.makedirs(os.path.dirname(alone))
        shutil.copy(traced, alone)
        with open_recording(traced) as rec:
            run_id = rec.run_id
            health_steps = len(rec.health()["step"])
        write_synthetic(traced.replace(".h5", ".forensics.h5"), run_id, args.ops)
        times: dict[str, list[float]] = {"alone": [], "traced": []}
        sizes: dict[str, int] = {}
        for _ in range(args.repeat):  # alternate the variants
            for name, run in (("alone", alone), ("traced", traced)):
                s, size = _time_write(run, os.path.join(work, f"{name}.html"))
                times[name].append(s)
                sizes[name] = size
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"recording: {health_steps:,} steps of health (the MLP, recorded in {record_s:.0f} s); "
        f"sidecar: {args.ops:,} ops (synthetic)\n"
    )
    print("| page from | page size | write, best (s) | write, median (s) |")
    print("|---|---|---|---|")
    labels = {
        "alone": f"the recording alone ({health_steps:,} steps)",
        "traced": f"the recording and a {args.ops:,}-op sidecar",
    }
    for name in ("alone", "traced"):
        print(
            f"| {labels[name]} | {sizes[name] / 1024:,.0f} KiB | {min(times[name]):.2f} | "
            f"{statistics.median(times[name]):.2f} |"
        )


if __name__ == "__main__":
    main()
