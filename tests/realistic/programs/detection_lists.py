"""Object detection, shaped like torchvision's ``references/detection`` (``train.py`` and
``engine.train_one_epoch``): images of different sizes and per-image targets (``boxes[N_i, 4]``,
``labels[N_i]``) collated by ``utils.collate_fn`` (``tuple(zip(*batch))``: a tuple of images and
a tuple of target dicts, no stacking); the model (``GeneralizedRCNN``-like) pads the images into
one tensor itself, and in training returns a dict of losses whose sum the loop backpropagates; a
linear warm-up scheduler in the first epoch; the loop stops itself on a non-finite loss
(``Loss is nan, stopping training``), as the reference does. The box regression targets are
encoded as torchvision's ``BoxCoder.encode`` does (``log(gt_width / anchor_width)``). Synthetic
images and boxes (the reference reads COCO).

Wired for replay where the step is: the Recorder is opened once in ``main()``; the body of
``train_one_epoch``'s loop from the model call to ``optimizer.step()`` becomes ``train_step``
and is handed each ``(images, targets)`` with ``replay.step`` (lines marked ``# replay``).

Before its Recorder the program writes ``train.log`` (a line per step).

The planted failure: ``--degenerate I`` gives sample I's first box no width (``x2 == x1``: an
annotation a crop collapsed; torchvision's model refuses such boxes with a ValueError, this one
does not check). Its regression target is ``log(0) = -inf``: the loss is inf at the first step
holding it, the gradients NaN (step 3, sample 1 of its batch for ``--degenerate 13``).

    python detection_lists.py [--record run.h5] [--steps 8] [--degenerate I]
"""

import argparse
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import replay  # replay

N_CLASSES, ANCHOR = 3, 8.0


class Shapes(Dataset):
    """Images of 24..40 pixels a side, each with 1..3 boxes (x1, y1, x2, y2) and labels."""

    def __init__(self, n, degenerate=(), seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            h, w = (int(v) for v in torch.randint(24, 41, (2,), generator=g))
            image = torch.rand(3, h, w, generator=g)
            k = int(torch.randint(1, 4, (), generator=g))
            xy = torch.rand(k, 2, generator=g) * torch.tensor([w / 2, h / 2])
            wh = 4 + torch.rand(k, 2, generator=g) * torch.tensor([w / 2 - 4, h / 2 - 4])
            boxes = torch.cat([xy, xy + wh], dim=1)
            if i in degenerate:
                boxes[0, 2] = boxes[0, 0]  # no width left
            labels = torch.randint(1, N_CLASSES, (k,), generator=g)
            self.items.append((image, {"boxes": boxes, "labels": labels, "image_id": i}))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate_fn(batch):
    return tuple(zip(*batch))


def encode(gt_boxes, anchor_boxes, weights=(10.0, 10.0, 5.0, 5.0)):
    """torchvision's BoxCoder.encode_single: deltas of the boxes against their anchors."""
    wx, wy, ww, wh = weights
    ex_widths = anchor_boxes[:, 2] - anchor_boxes[:, 0]
    ex_heights = anchor_boxes[:, 3] - anchor_boxes[:, 1]
    ex_ctr_x = anchor_boxes[:, 0] + 0.5 * ex_widths
    ex_ctr_y = anchor_boxes[:, 1] + 0.5 * ex_heights
    gt_widths = gt_boxes[:, 2] - gt_boxes[:, 0]
    gt_heights = gt_boxes[:, 3] - gt_boxes[:, 1]
    gt_ctr_x = gt_boxes[:, 0] + 0.5 * gt_widths
    gt_ctr_y = gt_boxes[:, 1] + 0.5 * gt_heights
    targets_dx = wx * (gt_ctr_x - ex_ctr_x) / ex_widths
    targets_dy = wy * (gt_ctr_y - ex_ctr_y) / ex_heights
    targets_dw = ww * torch.log(gt_widths / ex_widths)  # encode width
    targets_dh = wh * torch.log(gt_heights / ex_heights)
    return torch.stack((targets_dx, targets_dy, targets_dw, targets_dh), dim=1)


class TinyDetector(nn.Module):
    """Pads the images into a batch, a small backbone, and per box: a class score and the
    deltas to its anchor (a box of ANCHOR pixels at the box's grid cell)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        )  # fmt: skip
        self.cls_head = nn.Conv2d(32, N_CLASSES, 1)
        self.box_head = nn.Conv2d(32, 4, 1)

    def forward(self, images, targets):
        h = max(im.shape[1] for im in images)
        w = max(im.shape[2] for im in images)
        batch = images[0].new_zeros(len(images), 3, h, w)
        for b, im in zip(batch, images):
            b[:, : im.shape[1], : im.shape[2]].copy_(im)
        features = self.backbone(batch)
        scores, deltas = self.cls_head(features), self.box_head(features)
        cls_losses, box_losses = [], []
        for i, t in enumerate(targets):
            cx = ((t["boxes"][:, 0] + t["boxes"][:, 2]) / 8).long().clamp(0, features.shape[3] - 1)
            cy = ((t["boxes"][:, 1] + t["boxes"][:, 3]) / 8).long().clamp(0, features.shape[2] - 1)
            anchors = torch.stack([cx * 4.0, cy * 4.0, cx * 4.0 + ANCHOR, cy * 4.0 + ANCHOR], 1)
            regression_targets = encode(t["boxes"], anchors)
            cls_losses.append(F.cross_entropy(scores[i, :, cy, cx].T, t["labels"]))
            box_losses.append(F.smooth_l1_loss(deltas[i, :, cy, cx].T, regression_targets))
        return {
            "loss_classifier": torch.stack(cls_losses).mean(),
            "loss_box_reg": torch.stack(box_losses).mean(),
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", default="run.h5")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--degenerate", type=int, action="append", default=[])
    args = parser.parse_args()

    log = open("train.log", "w")  # noqa: SIM115 - open for the whole run, as a logger's file
    torch.manual_seed(0)
    dataset = Shapes(args.steps * args.batch_size, degenerate=args.degenerate)
    data_loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, collate_fn=collate_fn
    )
    model = TinyDetector()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    warmup_iters = min(1000, len(data_loader) - 1)
    lr_scheduler = torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=0.001, total_iters=warmup_iters
    )
    replay.Recorder(args.record, objects={"model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler})  # replay  # fmt: skip

    def train_step(batch):  # replay (was the loop's body)
        images, targets = batch  # replay
        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())
        optimizer.zero_grad()
        losses.backward()
        optimizer.step()
        lr_scheduler.step()
        return losses  # replay

    model.train()
    for i, (images, targets) in enumerate(data_loader):
        images = list(image for image in images)
        targets = [{k: v for k, v in t.items()} for t in targets]
        losses = replay.step((images, targets), train_step)  # replay
        loss_value = losses.item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training", file=log, flush=True)
            sys.exit(1)
        print(f"step {i} loss {loss_value:.4f}", file=log, flush=True)


if __name__ == "__main__":
    main()
