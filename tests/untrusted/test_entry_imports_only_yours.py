"""``--entry FILE:build,step`` is the user saying which code runs. Was: the recording's other
named files were still imported (a class a framework integration's ``build`` takes, recorded as
an extra ``entry`` key), so ``--entry`` — the refusal's own remedy — ran a file the user never
chose. One real recording, with such a key added by h5py pointing at a file that prints a
marker when imported (on stderr: a file it wrote might be kept from the user's directory)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import replay_cli, run_py

USERMOD = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F


    def build(**kwargs):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)


    def train_step(model, optimizer, batch):
        optimizer.zero_grad()
        loss = F.mse_loss(model(batch), batch.sum(1, keepdim=True))
        loss.backward()
        optimizer.step()
        return loss


    if __name__ == "__main__":
        import sys

        import replay

        model, opt = build()
        with replay.Recorder(sys.argv[1], model=model, optimizer=opt, step_fn=train_step,
                             build_fn=build, snapshot_every=2) as rec:
            for _ in range(4):
                rec.step(torch.randn(4, 3))
    """
)

OTHER = textwrap.dedent(
    """
    import sys

    print("MARKER: other.py ran", file=sys.stderr, flush=True)


    class Thing:
        pass
    """
)


@pytest.fixture(scope="module")
def named_other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("entry-only")
    (d / "own.py").write_text(USERMOD)
    (d / "other.py").write_text(OTHER)
    run = d / "run.h5"
    p = run_py(str(d / "own.py"), str(run), cwd=d)
    assert p.returncode == 0, p.stderr[-2000:]
    with h5py.File(run, "r+") as f:
        meta = json.loads(f["meta/run"][()].tobytes())
        meta["entry"]["module_class"] = {
            "module": "__main__",
            "qualname": "Thing",
            "path": str(d / "other.py"),
            "is_script": True,
        }
        del f["meta/run"]
        f["meta"].create_dataset(
            "run", data=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        )
    return run


def test_entry_imports_nothing_else_the_recording_names(named_other: Path) -> None:
    d = named_other.parent
    p = replay_cli(
        "verify", str(named_other), "--entry", "own.py:build,train_step", "--trust", cwd=d
    )
    assert "MARKER" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"importing {d / 'own.py'}" in p.stderr
    assert "--entry: not importing module_class from" in p.stderr and "other.py" in p.stderr
    # The recording does name other.py: without --entry a trusted replay imports it.
    p = replay_cli("verify", str(named_other), "--trust", cwd=d)
    assert "MARKER: other.py ran" in p.stderr, p.stderr[-2000:]
