"""Layer-local training, shaped like pytorch/examples' ``mnist_forward_forward/main.py`` (Hinton's
forward-forward): the network keeps its layers in a plain python list (so it holds no
parameters of its own), each layer has its own Adam optimizer and trains on its own loss, for
all its epochs, inside the layer's own ``train(x_pos, x_neg)`` method (which overrides
``nn.Module.train``); the next layer then trains on the detached outputs of the one before.
One full batch of synthetic "images" (the example downloads MNIST), labels overlaid on the
first pixels; negatives get a wrong label drawn from torch's generator.

Wired for replay as a user would: the Recorder is made before ``net.train(...)`` with the
network and every layer and optimizer among its objects; the body of the layer's loop becomes
a step handed over with ``replay.step(i, step)`` (the epoch number; the data in the closure).

A healthy run: no NaN anywhere. ``replay info`` and ``replay bisect`` must say so (a network
that holds no parameters is no non-finite one), and every step replays bitwise, layer 1's too
(their closure, over layer 1 and layer 0's outputs, is made again from the records).

    python layer_local.py [--epochs 12] [--train-size 200] [--snapshot-every 50]
"""

import argparse

import torch
import torch.nn as nn
from torch.optim import Adam

import replay


def overlay_y_on_x(x, y, classes=10):
    x_ = x.clone()
    x_[:, :classes] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


def get_y_neg(y):
    offset = torch.randint(1, 10, y.shape)  # any label but the right one
    return (y + offset) % 10


class Layer(nn.Linear):
    def __init__(self, in_features, out_features, lr, threshold, epochs):
        super().__init__(in_features, out_features)
        self.relu = nn.ReLU()
        self.opt = Adam(self.parameters(), lr=lr)
        self.threshold, self.num_epochs = threshold, epochs

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos, x_neg):  # (overrides nn.Module.train, as upstream's does)
        for i in range(self.num_epochs):

            def step(i):
                g_pos = self.forward(x_pos).pow(2).mean(1)
                g_neg = self.forward(x_neg).pow(2).mean(1)
                loss = torch.log1p(
                    torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))
                ).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                return loss

            loss = replay.step(i, step)
            print(f"loss {loss.item():.6f}", flush=True)
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(nn.Module):
    def __init__(self, dims, lr, threshold, epochs):
        super().__init__()
        self.layers = [Layer(dims[d], dims[d + 1], lr, threshold, epochs) for d in range(len(dims) - 1)]  # fmt: skip

    def predict(self, x):
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, label)
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness = goodness + [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train(self, x_pos, x_neg):
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print("training layer:", i, flush=True)
            h_pos, h_neg = layer.train(h_pos, h_neg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--threshold", type=float, default=2.0)
    p.add_argument("--train-size", type=int, default=200)
    p.add_argument("--snapshot-every", type=int, default=50)
    args = p.parse_args()
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(args.train_size, 64, generator=g) - 0.13) / 0.31
    y = torch.randint(0, 10, (args.train_size,), generator=g)
    net = Net([64, 32, 32], args.lr, args.threshold, args.epochs)
    x_pos, x_neg = overlay_y_on_x(x, y), overlay_y_on_x(x, get_y_neg(y))
    objects = {"model": net}
    for i, layer in enumerate(net.layers):
        objects[f"layer{i}"], objects[f"opt{i}"] = layer, layer.opt
    replay.Recorder("run.h5", objects=objects, snapshot_every=args.snapshot_every)
    net.train(x_pos, x_neg)
    print("train error:", 1.0 - net.predict(x).eq(y).float().mean().item())


if __name__ == "__main__":
    main()
