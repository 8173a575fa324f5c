"""A Lightning run that stops after 12 optimizer steps with a checkpoint, then is resumed from it
with ``fit(ckpt_path=...)`` to 24, both recorded by ReplayCallback to OUT_DIR/run.h5.

    python lightning_resume.py OUT_DIR first    # steps 0..11, OUT_DIR/last.ckpt
    python lightning_resume.py OUT_DIR resume   # steps 12..23 from OUT_DIR/last.ckpt
"""

import argparse

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from replay.integrations.lightning import ReplayCallback


class ResumedMLP(L.LightningModule):
    def __init__(self, width: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("phase", choices=["first", "resume"])
    args = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randint(0, 3, (96,)))
    loader = DataLoader(data, batch_size=8, shuffle=False)
    trainer = L.Trainer(
        max_steps=12 if args.phase == "first" else 24,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
        callbacks=[ReplayCallback(f"{args.out}/run.h5")],
    )
    model = ResumedMLP()
    if args.phase == "first":
        trainer.fit(model, loader)
        trainer.save_checkpoint(f"{args.out}/last.ckpt")
    else:
        trainer.fit(model, loader, ckpt_path=f"{args.out}/last.ckpt")
    print(f"global_step {trainer.global_step}")


if __name__ == "__main__":
    main()
