"""A DDP run with ``ZeroRedundancyOptimizer`` (zero_ddp.py, two ranks under torchrun).

Was: the first snapshot called ``optimizer.state_dict()``, which a ZeRO optimizer refuses until
every rank has consolidated the whole state on one ("Optimizer state has not been consolidated
on this rank"): recording stopped at step 0 on every rank and no file was left. Each rank's
file now keeps the shard of the state its rank holds. And ``replay verify --all`` (and
``--from``) of a rank set replayed the newest snapshots' steps whatever was asked: the flags
never reached the leading rank.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import replay_json, run_py

PROGRAMS = Path(__file__).with_name("programs")


def _torchrun(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    shutil.copy(PROGRAMS / "zero_ddp.py", tmp)
    launch = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    return run_py(*launch, str(tmp / "zero_ddp.py"), *args, cwd=tmp, timeout=240)


def test_a_zero_optimizers_shards_are_recorded_and_every_snapshot_replays_bitwise(tmp_path):
    p = _torchrun(tmp_path, "run.h5", "--steps", "20")
    assert p.returncode == 0 and "stopped" not in p.stderr, p.stderr[-3000:]
    rc, v, err = replay_json("verify", str(tmp_path / "run.h5"), "--all", cwd=tmp_path)
    assert rc == 0 and v["deterministic"] is True, err[-3000:]
    assert v["window"] == [0, 19] and v["steps"][0]["step"] == 0, v  # --all: from step 0
    assert {r["replayed_steps"][0] for r in v["ranks"].values()} == {0}, v["ranks"]
