"""Benchmark: `replay bisect` vs rerunning from the start under `torch.autograd.detect_anomaly`.

    PYTHONPATH=. python benchmarks/bench_bisect.py [--steps 2000] [--fail-at 1990] [--width 1024]

Records a run of an MLP (a NaN reaches the data at step --fail-at, near the end), then times,
as subprocesses started the same way and alternating when --repeats > 1:
  bisect   `python -m replay bisect RUN.h5 --json` until it prints its verdict (per-op trace included)
  anomaly  the same training script rerun from step 0 under detect_anomaly until it raises
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys, torch, torch.nn.functional as F
from torch import nn
import replay

WIDTH, DEPTH, BATCH = {width}, {depth}, {batch}

def build():
    torch.manual_seed(0)
    layers = [nn.Linear(64, WIDTH), nn.GELU()]
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss

def batches(n, fail_at):
    g = torch.Generator().manual_seed(1)
    for t in range(n):
        x = torch.randn(BATCH, 64, generator=g)
        y = torch.randint(0, 10, (BATCH,), generator=g)
        if t == fail_at:
            x[5, 7] = float("nan")   # a corrupt sample near the end of the run
        yield x, y

if __name__ == "__main__":
    mode, steps, fail_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    model, opt = build()
    if mode == "record":
        with replay.Recorder(sys.argv[4], model=model, optimizer=opt, step_fn=train_step,
                             build_fn=build, snapshot_every={every}) as rec:
            for b in batches(steps, fail_at):
                try:
                    rec.step(b)
                except replay.NonFiniteLossError:
                    break
    else:
        with torch.autograd.detect_anomaly():
            for t, b in enumerate(batches(steps, fail_at)):
                try:
                    train_step(model, opt, b)
                except RuntimeError as e:
                    print(f"anomaly at step {{t}}: {{str(e).splitlines()[0]}}")
                    break
"""


# Start-up only: python, torch, the torch._dynamo import of the first optimizer step. It leaves
# with os._exit: the interpreter's teardown (~1 s of garbage collection over torch's objects)
# is not a cost a bisect has to pay (replay's console process freezes its heap).
START = (
    "import os, torch; m = torch.nn.Linear(2, 2); o = torch.optim.AdamW(m.parameters()); "
    "m(torch.ones(1, 2)).sum().backward(); o.step(); os._exit(0)"
)


def run(cmd: list[str], cwd: str) -> tuple[float, subprocess.CompletedProcess]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--fail-at", type=int, default=1990)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--snapshot-every", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        script = Path(d, "train_mlp.py")
        script.write_text(
            SCRIPT.format(width=a.width, depth=a.depth, batch=a.batch, every=a.snapshot_every)
        )
        h5 = str(Path(d, "run.h5"))
        t_rec, p = run([sys.executable, str(script), "record", str(a.steps), str(a.fail_at), h5], d)
        assert os.path.exists(h5), p.stderr
        step_ms = 1000 * t_rec / (a.fail_at + 1)
        times: dict[str, list[float]] = {"bisect": [], "anomaly": []}
        verdict, anomaly_out = None, ""
        for _ in range(a.repeats):
            t, p = run([sys.executable, "-m", "replay", "bisect", h5, "--json"], d)
            assert p.returncode == 0, p.stderr
            times["bisect"].append(t)
            verdict = json.loads(p.stdout)
            t, p = run([sys.executable, str(script), "anomaly", str(a.steps), str(a.fail_at)], d)
            times["anomaly"].append(t)
            anomaly_out = p.stdout.strip()
        # What both variants pay before their first step (START).
        starts = []
        for _ in range(3):
            t, p = run([sys.executable, "-c", START], d)
            assert p.returncode == 0, p.stderr
            starts.append(t)
        t_start = min(starts)
    tb, ta = min(times["bisect"]), min(times["anomaly"])
    print(
        f"workload: MLP 64-{a.width}x{a.depth}-10, batch {a.batch}, AdamW, 1 thread; "
        f"recorded {a.fail_at + 1} steps in {t_rec:.1f} s ({step_ms:.1f} ms/step incl. start); "
        f"NaN sample at step {a.fail_at}; snapshot_every {a.snapshot_every}\n"
    )
    print("| variant | wall time (s) | steps executed | verdict |")
    print("|---|---:|---:|---|")
    print(
        f"| replay bisect (incl. per-op trace) | {tb:.2f} | {verdict['replayed_steps']} + "
        f"{verdict['rechecked_steps']} | step {verdict['first_bad_step']}, {verdict['op']} in "
        f"{verdict['module']!r}, samples {verdict['samples']} |"
    )
    print(f"| rerun under detect_anomaly | {ta:.2f} | {a.fail_at + 1} | {anomaly_out[:80]} |")
    print(
        f"\nspeed-up: {ta / tb:.1f}x; replayed steps {verdict['replayed_steps']} "
        f"(<= snapshot_every + 1 = {a.snapshot_every + 1})"
    )
    plain_step = (t_rec - t_start) / (a.fail_at + 1)  # a recorded step, start-up excluded
    replay_floor = t_start + verdict["replayed_steps"] * plain_step
    print(
        f"\nstart-up both variants pay (python, torch, the torch._dynamo import of the first "
        f"optimizer step; best of 3): {t_start:.2f} s. A bisect that did nothing but start and re-run its "
        f"{verdict['replayed_steps']} steps ({plain_step * 1e3:.1f} ms each, as recorded) would "
        f"take {replay_floor:.2f} s: a ceiling of {ta / replay_floor:.1f}x for this workload."
    )


if __name__ == "__main__":
    main()
