"""A LightningCLI program as upstream examples write it (a LightningModule and a DataModule,
everything else from the command line), with no replay code in it: the recorder is added as the
docs say, ``--trainer.callbacks+=replay.integrations.lightning.ReplayCallback
--trainer.callbacks.path=run.h5``. ``--model.nan_at K`` makes the K-th training_step call
(counted from 0) take the square root of a negative number."""

import lightning.pytorch as L
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, width: int = 16, lr: float = 0.05, nan_at: int = -1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 1))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        if int(self.calls) == self.hparams.nan_at:
            out = torch.sqrt(out - 100.0)
        self.calls += 1
        loss = nn.functional.mse_loss(out.squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class Points(L.LightningDataModule):
    def __init__(self, n: int = 64, batch_size: int = 8) -> None:
        super().__init__()
        self.n, self.batch_size = n, batch_size

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(self.n, 6, generator=g)
        self.data = TensorDataset(x, x.sum(1) + 0.1 * torch.randn(self.n, generator=g))

    def train_dataloader(self):
        return DataLoader(
            self.data,
            batch_size=self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(1),
        )


if __name__ == "__main__":
    LightningCLI(Regressor, Points, seed_everything_default=0)
