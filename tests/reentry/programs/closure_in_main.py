"""A loop as people write it: everything is a local of main(), the step is a closure, no
build_fn, a scheduler stepped outside the step. `--bad-step N` scales the batch of step N by
1e38: the logits stay finite, and the first non-finite value is the +inf the forward
`aten::nll_loss_forward` of `F.cross_entropy` makes by summing them. Every run appends a line to
`trained.log`, except a replay (`replay.replaying()`)."""

import argparse

import torch
import torch.nn.functional as F

import replay


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--bad-step", type=int, default=-1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--out", default="run.h5")
    args = p.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
        for _ in range(args.steps)
    ]

    def step(batch):
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    if not replay.replaying():
        with open("trained.log", "a") as fh:
            fh.write("started\n")

    with replay.Recorder(
        args.out,
        objects={"model": model, "optimizer": optimizer, "scheduler": scheduler},
        step_fn=step,
        snapshot_every=4,
    ) as rec:
        for i, (x, y) in enumerate(data):
            if i == args.bad_step:
                x = x * 1e38
            loss = rec.step((x, y))
            scheduler.step()  # outside the step: the lr is recorded every step
            print(f"step {i} loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
