"""timm-shaped (``pytorch-image-models/train.py``): ``main()`` parses the arguments and builds
the model, optimizer, loss, a ModelEmaV2-like EMA and an AMP loss scaler; each epoch runs in
``train_one_epoch(...)``, whose step is spread over ``_forward``/``_backward`` closures made
again for every batch, reading per-batch locals (``need_update``) as timm's do. Trained on an
ImageFolder-like folder of ``.npy`` images (``DATA/<class>/<name>.npy``, CHW float32).

Wired for replay where the step is: the Recorder is opened once in ``main()`` without a step
function, and each step is handed over inside ``train_one_epoch`` with the step function made
there; nothing is passed down. Changed lines against the unwired program (6, marked
``# replay``):

    import replay                                         (added)
    replay.Recorder(args.record, objects=...)             (added, in main)
    def _forward(batch):                                  (was: def _forward():)
        input, target = batch                             (added)
    return _loss                                          (added, the end of _backward)
    loss = replay.step((input, target), lambda batch: _backward(_forward(batch)))
                                                          (was: loss = _forward(); _backward(loss))

One liberty against timm: its loop zero_grads and updates the EMA after calling the closures;
here ``_backward`` ends with them, so that the two closures are the whole step. A per-batch
local a closure reads (``need_update``) is the same at every step with ``--grad-accum-steps 1``
(timm's default); with more, hand it over as a per-step value and take it as a parameter.

    python timm_train.py DATA --record run.h5 [--epochs 2] [--lr 0.05]
"""

# ruff: noqa: B023 - the closures read the loop's need_update, as timm's do (see above)
import argparse
import copy
import os
from contextlib import suppress

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
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.head(x.mean((2, 3)))


class ModelEmaV2(nn.Module):
    """timm's ModelEmaV2: a copy of the model whose weights follow it with ``decay``."""

    def __init__(self, model, decay=0.9):
        super().__init__()
        self.module = copy.deepcopy(model)
        self.module.eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model):
        for e, m in zip(self.module.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point:
                e.mul_(self.decay).add_(m, alpha=1 - self.decay)
            else:
                e.copy_(m)


class NativeScaler:
    """timm's NativeScaler: a GradScaler, called with the loss, that steps the optimizer."""

    def __init__(self, enabled):
        self._scaler = torch.amp.GradScaler("cpu", enabled=enabled)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, need_update=True):
        self._scaler.scale(loss).backward()
        if need_update:
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state):
        self._scaler.load_state_dict(state)


def train_one_epoch(
    epoch,
    model,
    loader,
    optimizer,
    loss_fn,
    args,
    amp_autocast=suppress,
    loss_scaler=None,
    model_ema=None,
):
    model.train()
    accum_steps = args.grad_accum_steps
    last_batch_idx = len(loader) - 1
    losses = []
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0

        def _forward(batch):  # replay
            input, target = batch  # replay
            with amp_autocast():
                output = model(input)
                _loss = loss_fn(output, target)
            if accum_steps > 1:
                _loss /= accum_steps
            return _loss

        def _backward(_loss):
            if loss_scaler is not None:
                loss_scaler(
                    _loss,
                    optimizer,
                    clip_grad=args.clip_grad,
                    parameters=model.parameters(),
                    need_update=need_update,
                )
            else:
                _loss.backward()
                if need_update:
                    if args.clip_grad is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
                    optimizer.step()
            if need_update:
                optimizer.zero_grad()
                if model_ema is not None:
                    model_ema.update(model)
            return _loss  # replay

        loss = replay.step((input, target), lambda batch: _backward(_forward(batch)))  # replay
        losses.append(loss.item() * accum_steps)
    return sum(losses) / len(losses)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--record", default="run.h5")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clip-grad", type=float, default=None)
    parser.add_argument("--grad-accum-steps", type=int, default=1)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--model-ema", action="store_true")
    parser.add_argument("--model-ema-decay", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    dataset = ImageFolderNpy(args.data)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=False)
    model = SmallNet(len(dataset.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train_loss_fn = nn.CrossEntropyLoss()
    model_ema = ModelEmaV2(model, decay=args.model_ema_decay) if args.model_ema else None
    loss_scaler = NativeScaler(enabled=args.amp)
    amp_autocast = suppress
    if args.amp:
        amp_autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    replay.Recorder(args.record, objects={"model": model, "optimizer": optimizer, "ema": model_ema, "scaler": loss_scaler})  # replay  # fmt: skip

    for epoch in range(args.epochs):
        loss = train_one_epoch(
            epoch,
            model,
            loader,
            optimizer,
            train_loss_fn,
            args,
            amp_autocast=amp_autocast,
            loss_scaler=loss_scaler,
            model_ema=model_ema,
        )
        print(f"epoch {epoch} loss {loss:.4f}")


if __name__ == "__main__":
    main()
