"""Recordings for the TUI tests, made by a real training loop in a subprocess (once a session).

``traced/run.h5`` + ``traced/run.forensics.h5`` (step 6 traced: a 0/0 in ``body.0.norm``),
``plain/run.h5`` (the same recording without forensics), ``big/`` (the same recording with a
synthetic 200,000-op sidecar). Fixed folder names keep what the screens show stable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from synthetic import write_synthetic

from replay.store import open_recording
from tests.conftest import run_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("tui-runs", numbered=False)
    traced = base / "traced"
    traced.mkdir()
    shutil.copy(os.path.join(HERE, "train_fixture.py"), traced)
    subprocess.run(
        [sys.executable, "train_fixture.py", str(traced), "--trace"],
        cwd=traced,
        env=run_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    plain = base / "plain"
    plain.mkdir()
    shutil.copy(traced / "run.h5", plain / "run.h5")
    big = base / "big"
    big.mkdir()
    shutil.copy(traced / "run.h5", big / "run.h5")
    with open_recording(str(big / "run.h5")) as rec:
        culprit = write_synthetic(str(big / "run.forensics.h5"), rec.run_id)
    return {
        "traced": str(traced / "run.h5"),
        "plain": str(plain / "run.h5"),
        "big": str(big / "run.h5"),
        "big_culprit": str(culprit),
    }


RANK_NAN_STEP = 12  # rank 1's batch gets a NaN here; rank 0 trains on


@pytest.fixture(scope="session")
def rank_set(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``ddp/run.h5``: the base path of ``run.rank0.h5`` (20 clean steps) and ``run.rank1.h5``
    (NaN loss at step 12, where it stops), two real training processes run side by side."""
    d = tmp_path_factory.mktemp("tui-ranks", numbered=False) / "ddp"
    d.mkdir()
    base = str(d / "run.h5")
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "rank_fixture.py"), str(r), base, "--steps", "20"]
            + (["--nan-at", str(RANK_NAN_STEP)] if r == 1 else []),
            env=run_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for r in (0, 1)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    return base
