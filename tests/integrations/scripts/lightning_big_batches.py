"""A Lightning fit whose batches (from an iterable dataset: recorded by value) are 256 KiB each,
recorded under ``keep_bytes=8 MiB``: the file's rings must be sized from those batches.

    python lightning_big_batches.py OUT_DIR STEPS
"""

import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset

from replay.integrations.lightning import ReplayCallback

FEATURES = 64 * 64  # 16 rows of 4,096 float32: 256 KiB a batch


class Stream(IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(FEATURES, generator=g), torch.randint(0, 4, (), generator=g)


class Linear(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(FEATURES, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ReplayCallback(str(out / "run.h5"), keep_bytes=8 << 20)],
    )
    trainer.fit(Linear(), DataLoader(Stream(), batch_size=16))
