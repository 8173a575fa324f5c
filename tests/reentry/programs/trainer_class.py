"""A small library-style Trainer that owns the loop (as minGPT's): the Recorder is made inside
Trainer.run() and the step is a bound method. Run as a module: `python -m trainer_class`.
`--label-bug` makes the last batch's label out of range (the step raises in nll_loss)."""

import sys

import torch
import torch.nn.functional as F

import replay


class Trainer:
    def __init__(self, model, lr, steps, label_bug):
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.steps = steps
        self.label_bug = label_bug
        self.iter_num = 0

    def _step(self, batch):
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss

    def run(self):
        g = torch.Generator().manual_seed(7)
        with replay.Recorder(
            "run.h5",
            model=self.model,
            optimizer=self.optimizer,
            step_fn=self._step,
            snapshot_every=3,
        ) as rec:
            while self.iter_num < self.steps:
                x = torch.randn(5, 6, generator=g)
                y = torch.randint(0, 3, (5,), generator=g)
                if self.label_bug and self.iter_num == self.steps - 1:
                    y[2] = 3
                rec.step((x, y))
                self.iter_num += 1


if __name__ == "__main__":
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))
    Trainer(net, 1e-2, 8, "--label-bug" in sys.argv).run()
