"""A research script with the side effects people put before their Recorder: a metrics log
opened with "w", an output folder removed and made again (`--remake`), a checkpoint saved with
torch.save, a log appended through `logging`, a new file named by time, and (`--connect PORT`) a
TCP connection to a logging service. It trains and logs every step, then, with `--nan-at`,
fails. Replay runs this start-up again: none of it may change what the run left.

    python side_effects.py run.h5 --steps 40 [--nan-at 30] [--remake] [--connect PORT]
                              [--self-check [--until-checked]]

`--until-checked`: train on (the same batches again) until the background self-check has
given its verdict, at most 240 s. Each loss is logged exactly (float.hex).
"""

import argparse
import json
import logging
import os
import shutil
import socket
import time

import torch
import torch.nn.functional as F

import replay


def checked():
    try:
        with open("run.selfcheck.json") as fh:
            return json.load(fh)["status"] != "running"
    except (OSError, ValueError, KeyError):
        return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--nan-at", type=int, default=-1)
    p.add_argument("--remake", action="store_true")
    p.add_argument("--connect", type=int, default=0)
    p.add_argument("--self-check", action="store_true")
    p.add_argument("--until-checked", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    metrics = open("metrics.csv", "w")  # noqa: SIM115 - truncates the run's own log on every start
    metrics.write("step,loss\n")
    logging.basicConfig(filename="train.log", level=logging.INFO)
    if args.remake:
        if os.path.isdir("outputs"):
            shutil.rmtree("outputs")
        os.makedirs("outputs")
    os.makedirs("outputs", exist_ok=True)
    with open(os.path.join("outputs", f"started-{time.time_ns()}.txt"), "w") as fh:
        fh.write("a file named by the time it was made\n")
    if args.connect:
        socket.create_connection(("127.0.0.1", args.connect), timeout=5).close()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    torch.save(model.state_dict(), "init.pt")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(args.steps, 4, 8)
    labels = torch.randint(0, 2, (args.steps, 4))
    if 0 <= args.nan_at < args.steps:
        data[args.nan_at, 1, 3] = float("nan")

    def step(batch):
        x, y = batch
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    with replay.Recorder(
        args.out,
        model=model,
        optimizer=optimizer,
        step_fn=step,
        snapshot_every=5,
        self_check=args.self_check,
    ) as rec:
        t = 0
        deadline = time.monotonic() + 240
        while t < args.steps or (
            args.until_checked and not checked() and time.monotonic() < deadline
        ):
            i = t % args.steps
            loss = rec.step((data[i], labels[i]))
            metrics.write(f"{t},{float(loss).hex()}\n")
            metrics.flush()
            logging.info("step %d loss %.6f", t, float(loss))
            t += 1
    metrics.close()
    torch.save(model.state_dict(), "final.pt")
    print("training ended")


if __name__ == "__main__":
    main()
