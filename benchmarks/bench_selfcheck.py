"""The background self-check's cost to training (docs/selfcheck.md; issue: at most 5% while
the check runs, with a core free).

Each round trains a workload twice in a fresh process, torch at one thread (a core left free):
once with the self-check on, then once off. The run with it on
trains until the check has written its verdict; the run with it off trains the same number of
steps. Each process times every step; the steps measured are those while the check ran (from
the end of the step that started it to the verdict's write), in both runs by their index.
The ratio of a round is median(on) / median(off) over those steps; the table shows the median
ratio over rounds, the check's own wall time and its verdict.

Run:  .venv/bin/python benchmarks/bench_selfcheck.py [--rounds 3] [--workloads MLP,CNN,GPT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TARGET = """
import json, os, sys, time
sys.path.insert(0, {bench!r})
import torch
import replay
from workloads import WORKLOADS, step

name, steps, check = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "on"
torch.set_num_threads(1)
torch.manual_seed(0)
model, batch = WORKLOADS[name]()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
verdict = "run.selfcheck.json"
ends = []
deadline = time.monotonic() + 300
with replay.Recorder("run.h5", model=model, optimizer=optimizer, step_fn=step,
                     self_check=check) as rec:
    t = 0
    while (steps and t < steps) or (not steps and time.monotonic() < deadline):
        rec.step(batch)
        ends.append(time.time())
        t += 1
        if not steps and t % 10 == 0 and os.path.exists(verdict):
            with open(verdict) as fh:
                if json.load(fh)["status"] != "running":
                    break
out = {{"ends": ends}}
if check and os.path.exists(verdict):
    with open(verdict) as fh:
        out["verdict"] = json.load(fh)
    out["verdict_time"] = os.path.getmtime(verdict)
print(json.dumps(out))
"""

NAMES = {"MLP": "MLP", "CNN": "CNN", "GPT": "GPT (2 blocks)"}


def run(tmp: str, name: str, steps: int, check: bool) -> dict:
    d = tempfile.mkdtemp(dir=tmp)
    script = os.path.join(d, "train.py")
    with open(script, "w") as fh:
        fh.write(TARGET.format(bench=str(ROOT / "benchmarks")))
    env = dict(os.environ, REPLAY_SELF_CHECK="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run(
        [sys.executable, script, name, str(steps), "on" if check else "off"],
        cwd=d,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def step_times(ends: list[float]) -> list[float]:
    return [b - a for a, b in zip(ends, ends[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="MLP,CNN,GPT")
    args = ap.parse_args()
    print(
        "| workload | steps while the check ran | step ms, off | step ms, on | ratio (median) |"
        " check wall s | verdict |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.workloads.split(","):
            name = NAMES[key]
            ratios, offs, ons, walls, counts, verdicts = [], [], [], [], [], []
            for _ in range(args.rounds):
                on = run(tmp, name, 0, True)  # first: it says how many steps the check took
                off = run(tmp, name, len(on["ends"]), False)
                ends = on["ends"]
                start = 4  # the check starts after the 4th step (self_check_steps)
                stop = next(
                    (i for i, e in enumerate(ends) if e >= on.get("verdict_time", ends[-1])),
                    len(ends) - 1,
                )
                t_on = step_times(ends)[start:stop]
                t_off = step_times(off["ends"])[start:stop]
                if len(t_on) < 5:
                    continue
                m_on, m_off = statistics.median(t_on), statistics.median(t_off)
                ratios.append(m_on / m_off)
                ons.append(m_on)
                offs.append(m_off)
                counts.append(len(t_on))
                walls.append(on.get("verdict_time", ends[-1]) - ends[start - 1])
                v = on.get("verdict") or {}
                verdicts.append(
                    v.get("status", "none")
                    + (f" ({v['summary']})" if v.get("status") == "error" else "")
                )
            if not ratios:
                print(f"| {key} | (the check ended within 5 steps) | | | | | |")
                continue
            print(
                f"| {key} | {statistics.median(counts):.0f} | {statistics.median(offs) * 1e3:.2f}"
                f" | {statistics.median(ons) * 1e3:.2f} | {statistics.median(ratios):.3f}x"
                f" ({min(ratios):.3f}..{max(ratios):.3f}) | {statistics.median(walls):.1f}"
                f" | {', '.join(sorted(set(verdicts)))} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
