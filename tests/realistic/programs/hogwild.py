"""Hogwild training, shaped like pytorch/examples' ``mnist_hogwild``: the model's parameters are
put in shared memory (``model.share_memory()``) and ``--num-processes`` processes started with
``multiprocessing`` (``spawn``) each train them at once with an optimizer of their own, with no
lock. The data is synthetic (the example downloads MNIST).

Wired as a user would: each worker's ``train()`` opens ``run.rank<N>.h5`` with the model and its
optimizer and hands each step over with ``replay.step``. No ``build_fn``: replay re-runs a
program's command and takes over a Recorder in that command's own process, never in one it
starts, so the recorder says while the run trains that these recordings will not replay
(pass ``build_fn``), and a replay must not start the workers' training again.

    python hogwild.py [--num-processes 2] [--epochs 1]
"""

import argparse

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import replay


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(rank, args, model, dataset):
    torch.manual_seed(args.seed + rank)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    replay.Recorder(f"run.rank{rank}.h5", objects={"model": model, "optimizer": optimizer})
    model.train()
    for _ in range(args.epochs):
        for data, target in loader:

            def step(batch):
                data, target = batch
                optimizer.zero_grad()
                loss = F.nll_loss(model(data), target)
                loss.backward()
                optimizer.step()
                return loss

            replay.step((data, target), step)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    dataset = torch.utils.data.TensorDataset(
        torch.randn(256, 64, generator=g), torch.randint(0, 10, (256,), generator=g)
    )
    torch.manual_seed(args.seed)
    mp.set_start_method("spawn", force=True)
    model = Net()
    model.share_memory()
    processes = []
    for rank in range(args.num_processes):
        p = mp.Process(target=train, args=(rank, args, model, dataset))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    print("done", flush=True)
