"""A program with no file to run again says so when it starts recording, not after the crash:
``python -c CODE`` and ``python - < train.py`` (its ``__file__`` is ``<stdin>``, which the
recorder took for a script until its self-check, seconds in, failed to run it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_py

PROGRAM = """
import torch, torch.nn as nn, torch.nn.functional as F, replay
torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def step(batch):
    x, y = batch
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss

with replay.Recorder("run.h5", objects={"model": model, "optimizer": opt}, step_fn=step,
                     self_check=False) as rec:
    for _ in range(3):
        rec.step((torch.randn(4, 8), torch.randint(0, 2, (4,))))
print("trained")
"""


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_program_without_a_file_is_told_at_once_that_it_will_not_replay(
    tmp_path: Path, how: str
) -> None:
    if how == "-c":
        p = run_py("-c", PROGRAM, cwd=tmp_path, timeout=120)
    else:
        p = run_py("-", input=PROGRAM, cwd=tmp_path, timeout=120, fresh=True)
    assert p.returncode == 0 and p.stdout.strip() == "trained", p.stderr[-2000:]
    assert p.stderr.count("RecorderWarning") == 1, p.stderr
    assert "this run's steps will not replay; pass build_fn=" in p.stderr, p.stderr
