"""Knowledge distillation as DeiT and DistilBERT train: a teacher loaded from its checkpoint,
frozen (``requires_grad_(False)``) and in eval mode, read under ``no_grad`` by a step that trains
a smaller student on the hard labels plus ``T^2 * KL(student/T || teacher/T)``. The Recorder is
given the student and its optimizer only, as users write it: the teacher never changes, and a
replay that runs the program again loads it as it was.

``--ema``: the "teacher" is instead an exponential moving average of the student kept in a
frozen copy (a mean teacher whose parameters do not train, updated under ``no_grad``): the steps
change it, so a replay from a later snapshot would start with the wrong one.

    python distill_teacher.py run.h5 [--steps 60] [--ema]
"""

import argparse
import copy
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

FEATURES, CLASSES, BATCH, T = 16, 5, 32, 2.0


def net(width):
    return nn.Sequential(
        nn.Linear(FEATURES, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, CLASSES)
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ema", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    student = net(16)
    if args.ema:
        teacher = copy.deepcopy(student)
    else:
        teacher = net(64)
        if not os.path.exists("teacher.pt"):  # (the pretrained teacher a real run downloads)
            torch.save(teacher.state_dict(), "teacher.pt")
        teacher.load_state_dict(torch.load("teacher.pt"))
    teacher.eval()
    for q in teacher.parameters():
        q.requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)

    def train_step(batch):
        x, y = batch
        with torch.no_grad():
            t = teacher(x)
        s = student(x)
        soft = F.kl_div(F.log_softmax(s / T, 1), F.softmax(t / T, 1), reduction="batchmean")
        loss = F.cross_entropy(s, y) + T * T * soft
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.ema:
            with torch.no_grad():
                for e, m in zip(teacher.parameters(), student.parameters()):
                    e.mul_(0.9).add_(m, alpha=0.1)
        return loss

    g = torch.Generator().manual_seed(1)
    with replay.Recorder(args.out, model=student, optimizer=opt, step_fn=train_step) as rec:
        for i in range(args.steps):
            x = torch.randn(BATCH, FEATURES, generator=g)
            y = torch.randint(0, CLASSES, (BATCH,), generator=g)
            loss = rec.step((x, y))
            if i % 20 == 0:
                print(f"step {i} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
