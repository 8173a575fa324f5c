"""A siamese network on pairs, shaped like pytorch/examples' ``siamese_network/main.py``: a
custom map-style ``Dataset`` whose ``__getitem__`` draws the pair with python's ``random`` (a
second image of the same class for an even index, of another class for an odd one; ``random``
is never seeded), one tower applied to both images, the two embeddings concatenated, a linear
head, a sigmoid and ``nn.BCELoss`` (made again each epoch, as the example's ``train()`` does),
Adadelta with ``StepLR``. The images are synthetic (the example downloads MNIST).

Wired for replay as a user would: the Recorder gets the loader (``loader=train_loader``, for
batches by reference); the dataset draws random numbers, so the recorder keeps them by value
and says so once, at the program's line. The batch loop's body is the step, handed over with
``replay.step((images_1, images_2, targets), step)``.

The planted bug: image ``--bad-image`` of the dataset holds a NaN pixel (a corrupted record).
The first pair that draws it makes the tower's output NaN, and ``BCELoss`` raises ("all
elements of input should be between 0 and 1"). Bisect must name the data: the NaN in the batch,
and the pair that holds it.

    python siamese_pairs.py [--epochs 2] [--bad-image 17] [--batch-size 16] [--seed N]
"""

import argparse
import random

import torch
import torch.nn as nn
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset

import replay


class SiameseNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = nn.Sequential(
            nn.Conv2d(1, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.fc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 1))
        self.sigmoid = nn.Sigmoid()

    def forward(self, input1, input2):
        output = torch.cat((self.tower(input1), self.tower(input2)), 1)
        return self.sigmoid(self.fc(output))


class APP_MATCHER(Dataset):
    def __init__(self, n, bad_image):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 256, (n, 1, 12, 12), dtype=torch.uint8, generator=g)
        self.targets = torch.randint(0, 10, (n,), generator=g)
        self.images = self.data.float() / 255.0
        if bad_image >= 0:
            self.images[bad_image, 0, 3, 3] = float("nan")
        self.grouped_examples = {i: torch.where(self.targets == i)[0] for i in range(10)}

    def __len__(self):
        return self.data.shape[0]

    def __getitem__(self, index):
        selected_class = random.randint(0, 9)
        group = self.grouped_examples[selected_class]
        index_1 = group[random.randint(0, len(group) - 1)]
        if index % 2 == 0:
            index_2, target = group[random.randint(0, len(group) - 1)], 1.0
        else:
            other = random.choice([c for c in range(10) if c != selected_class])
            other_group = self.grouped_examples[other]
            index_2, target = other_group[random.randint(0, len(other_group) - 1)], 0.0
        return self.images[index_1].clone(), self.images[index_2].clone(), torch.tensor(target)


def train(model, train_loader, optimizer, epoch):
    model.train()
    criterion = nn.BCELoss()
    for batch_idx, (images_1, images_2, targets) in enumerate(train_loader):

        def step(batch):
            images_1, images_2, targets = batch
            optimizer.zero_grad()
            outputs = model(images_1, images_2).squeeze()
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()
            return loss

        loss = replay.step((images_1, images_2, targets), step)
        print(f"Train Epoch: {epoch} [{batch_idx}] Loss: {loss.item():.6f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--bad-image", type=int, default=17)
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--seed", type=int, default=None)  # the example never seeds ``random``
    args = p.parse_args()
    torch.manual_seed(1)
    if args.seed is not None:
        random.seed(args.seed)
    train_loader = DataLoader(APP_MATCHER(args.images, args.bad_image), batch_size=args.batch_size)
    model = SiameseNetwork()
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    replay.Recorder("run.h5", objects={"model": model, "optimizer": optimizer,
                                       "scheduler": scheduler}, loader=train_loader)  # fmt: skip
    for epoch in range(1, args.epochs + 1):
        train(model, train_loader, optimizer, epoch)
        scheduler.step()


if __name__ == "__main__":
    main()
