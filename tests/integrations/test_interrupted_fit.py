"""A KeyboardInterrupt is not a step's result: ``Recorder.step`` and the Hugging Face callback
leave the window it cut short out of the recording. The Lightning callback recorded it as the
step's exception (Lightning calls ``on_exception`` with the KeyboardInterrupt before it exits),
so ``replay info`` named a failure at that step and ``bisect`` went looking for it.

Either way, how the program ended is kept (``/ended``): the interrupt, or an exception Lightning
raised outside any training step (a ``validation_step``), which left a recording that read
"closed cleanly" and a bisect that said "healthy"."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import replay_here_json, run_py

pytest.importorskip("lightning")

SCRIPT = textwrap.dedent(
    """
    import sys

    import lightning.pytorch as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from replay.integrations.lightning import ReplayCallback


    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 3)
            self.calls = 0

        def training_step(self, batch, batch_idx):
            self.calls += 1
            if self.calls == 7 and sys.argv[2] == "interrupt":  # micro-batch 1 of step 3
                raise KeyboardInterrupt
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch, batch_idx):  # (after 6 micro-batches: 3 steps)
            if sys.argv[2] == "validation":
                raise ValueError("no label column in the validation set")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    trainer = L.Trainer(
        max_epochs=1, accumulate_grad_batches=2, val_check_interval=6, num_sanity_val_steps=0, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=sys.argv[1], callbacks=[ReplayCallback(sys.argv[1] + "/run.h5")],
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))
    """
)


def _fit(tmp_path, how: str, said: str) -> dict:
    """The script run until ``how`` ends it (its stderr says ``said``): ``replay info --json``."""
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    p = run_py(str(script), str(tmp_path), how, timeout=180)
    assert p.returncode != 0 and said in p.stderr, p.stderr[-2000:]
    rc, info, err = replay_here_json("info", str(tmp_path / "run.h5"))
    assert rc == 0, err
    assert info["first_bad"] == {"nonfinite": None, "exception": None}, info["first_bad"]
    return info


def test_a_keyboard_interrupt_in_a_lightning_step_is_not_recorded_as_its_exception(tmp_path):
    info = _fit(tmp_path, "interrupt", "KeyboardInterrupt")
    assert info["health_steps"] == [0, 2]  # the steps before the interrupt, and no more
    assert (info["ended"]["kind"], info["ended"]["last_step"]) == ("interrupted", 2)


def test_an_exception_in_a_lightning_validation_step_is_kept_as_how_the_run_ended(tmp_path):
    ended = _fit(tmp_path, "validation", "no label column")["ended"]
    assert (ended["type"], ended["last_step"]) == ("ValueError", 2), ended
    assert ended["where"].endswith("in validation_step")
