"""lightning_plain.py with ReplayCallback added (to OUT_DIR/run.h5), nothing else: a tiny MLP on random data, dropout, accumulation 2,
clipping, AdamW and a step-interval StepLR. ``--nan-at K`` makes the K-th training_step call
(counted from 0) take sqrt of a negative number. Usage: python lightning_recorded.py OUT_DIR"""

import argparse

import lightning.pytorch as L
import torch
from lightning.pytorch.plugins import MixedPrecision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from replay.integrations.lightning import ReplayCallback


class TinyMLP(L.LightningModule):
    def __init__(self, width: int = 16, lr: float = 0.05, nan_at: int = -1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(width, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.net(x)
        if int(self.calls) == self.hparams.nan_at:
            h = torch.sqrt(h - 100.0)
        self.calls += 1
        loss = nn.functional.cross_entropy(self.head(h), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--nan-at", type=int, default=-1)
    p.add_argument("--precision", default="32-true")
    args = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randint(0, 3, (96,)))
    loader = DataLoader(
        data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    # Lightning turns precision="16-mixed" into bf16 on a CPU; its plugin keeps fp16 and a scaler.
    amp = args.precision == "16-mixed"
    trainer = L.Trainer(
        max_epochs=2,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        precision=None if amp else args.precision,
        plugins=[MixedPrecision("16-mixed", "cpu")] if amp else None,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
        callbacks=[ReplayCallback(f"{args.out}/run.h5")],
    )
    trainer.fit(TinyMLP(nan_at=args.nan_at), loader)


if __name__ == "__main__":
    main()
