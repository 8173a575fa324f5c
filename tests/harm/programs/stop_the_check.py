"""A run that does something to its own background self-check, then ends: `--signal KILL`
kills the check and trains on until the verdict says what happened; `--signal STOP` stops it
(as a debugger or a job-control mistake would) and ends at once. Prints the verdict's status.

    python stop_the_check.py run.h5 --signal KILL|STOP
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import replay


def verdict():
    try:
        with open("run.selfcheck.json") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--signal", choices=["KILL", "STOP"], required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        x, y = batch
        if os.path.exists("slow"):  # made once the check runs: its replayed steps last 1 s each,
            time.sleep(1.0)  # so the signal 2 s on finds it still checking however fast it is
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    deadline = time.monotonic() + 120
    with replay.Recorder(
        args.out, model=model, optimizer=optimizer, step_fn=step, self_check=True
    ) as rec:
        pid = None
        while time.monotonic() < deadline:
            rec.step((torch.randn(4, 8), torch.randint(0, 2, (4,))))
            time.sleep(0.01)
            v = verdict()
            if pid is None and v.get("status") == "running" and v.get("pid"):
                pid = v["pid"]
                open("slow", "w").close()
                time.sleep(2)  # past the child's first lines (it asks to die with its run)
                os.kill(pid, getattr(signal, "SIG" + args.signal))
                print(f"sent SIG{args.signal} to {pid}", flush=True)
                if args.signal == "STOP":
                    break
            elif pid is not None and v.get("status") != "running":
                break
    print(f"pid {pid} status {verdict().get('status')}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
