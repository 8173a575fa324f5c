"""torchvision-reference-shaped (``references/classification/train.py``): ``main(args)`` builds
the data, model, criterion, optimizer, an ExponentialMovingAverage of the model and an AMP
GradScaler, then calls ``train_one_epoch(model, criterion, optimizer, data_loader, device,
epoch, args, model_ema=None, scaler=None)`` once per epoch; the step is the body of that
function's loop, with the per-batch index ``i`` deciding when the EMA updates. Trained on an
ImageFolder-like folder of ``.npy`` images (``DATA/<class>/<name>.npy``, CHW float32).

Wired for replay where the step is: the Recorder is opened once in ``main(args)`` without a
step function; the loop's body becomes the step function (the ``for`` line turned into its
``def``, at the same indentation, so the body is untouched), and a new loop hands each batch
over with the per-batch values the body reads. Changed lines against the unwired program (6,
marked ``# replay``):

    import replay                                          (added)
    replay.Recorder(args.record, objects=...)              (added, in main)
    def _step(batch, i, epoch):                            (was: for i, (image, target) in ...)
    image, target = (t.to(device) for t in batch)          (was: ... = image.to(device), ...)
    for i, batch in enumerate(data_loader):                (added)
        replay.step(batch, _step, i=i, epoch=epoch)        (added)

As in the reference, the step returns nothing: the gradients are where a NaN is first seen.

    python torchvision_train.py DATA --record run.h5 [--epochs 2] [--lr 0.05]
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import replay  # replay


class ImageFolderNpy(torch.utils.data.Dataset):
    """torchvision's ImageFolder over ``.npy`` files: classes are the sorted folder names."""

    def __init__(self, root):
        self.classes = sorted(os.listdir(root))
        self.samples = [
            (os.path.join(root, c, f), i)
            for i, c in enumerate(self.classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
        ]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        return torch.from_numpy(np.load(path)), target


class SmallNet(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).mean((2, 3)))


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """The reference's EMA (utils.ExponentialMovingAverage): buffers averaged too."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def accuracy(output, target):
    # The reference's utils.accuracy runs under torch.inference_mode(); inside a step, that
    # loses bisect its data verdict (cause none, source here) where no_grad keeps it: open.
    with torch.no_grad():
        return (output.argmax(1) == target).float().mean().item() * 100


def train_one_epoch(
    model, criterion, optimizer, data_loader, device, epoch, args, model_ema=None, scaler=None
):
    model.train()
    meters = {"loss": [], "acc1": [], "img/s": []}

    def _step(batch, i, epoch):  # replay  # fmt: skip
        start_time = time.time()
        image, target = (t.to(device) for t in batch)  # replay
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)

        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            if args.clip_grad_norm is not None:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if args.clip_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            optimizer.step()

        if model_ema and i % args.model_ema_steps == 0:
            model_ema.update_parameters(model)
            if epoch < args.lr_warmup_epochs:
                # Reset ema buffer to keep copying weights during warmup period
                model_ema.n_averaged.fill_(0)

        acc1 = accuracy(output, target)
        batch_size = image.shape[0]
        meters["loss"].append(loss.item())
        meters["acc1"].append(acc1)
        meters["img/s"].append(batch_size / max(time.time() - start_time, 1e-9))

    for i, batch in enumerate(data_loader):  # replay
        replay.step(batch, _step, i=i, epoch=epoch)  # replay
    return sum(meters["loss"]) / len(meters["loss"])


def main(args):
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    dataset = ImageFolderNpy(args.data)
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=False)
    model = SmallNet(len(dataset.classes)).to(device)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    scaler = torch.amp.GradScaler("cpu") if args.amp else None
    model_ema = None
    if args.model_ema:
        model_ema = ExponentialMovingAverage(model, decay=args.model_ema_decay, device=device)
    replay.Recorder(args.record, objects={"model": model, "optimizer": optimizer, "model_ema": model_ema, "scaler": scaler})  # replay  # fmt: skip

    for epoch in range(args.start_epoch, args.epochs):
        loss = train_one_epoch(
            model, criterion, optimizer, data_loader, device, epoch, args, model_ema, scaler
        )
        print(f"epoch {epoch} loss {loss:.4f}")


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Classification Training", add_help=True)
    parser.add_argument("data")
    parser.add_argument("--record", default="run.h5")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("-b", "--batch-size", default=8, type=int)
    parser.add_argument("--epochs", default=2, type=int)
    parser.add_argument("--start-epoch", default=0, type=int)
    parser.add_argument("--lr", default=0.05, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("--label-smoothing", default=0.0, type=float)
    parser.add_argument("--lr-warmup-epochs", default=1, type=int)
    parser.add_argument("--clip-grad-norm", default=None, type=float)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--model-ema", action="store_true")
    parser.add_argument("--model-ema-steps", type=int, default=2)
    parser.add_argument("--model-ema-decay", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    return parser


if __name__ == "__main__":
    args = get_args_parser().parse_args()
    main(args)
