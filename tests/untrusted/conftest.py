"""The crafted-file corpus, built once a session from one real recording (see corpus.py)."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest

from tests.conftest import SCRIPTS, run_py

from .corpus import Case, recording_cases, sidecar_cases, truncation_cases


@pytest.fixture(scope="session")
def real_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real recording: 11 steps of the test MLP, snapshots every 5, NaN at step 10."""
    out = tmp_path_factory.mktemp("untrusted-real") / "run.h5"
    proc = run_py(
        str(SCRIPTS / "mlp_train.py"),
        str(out),
        "--steps",
        "12",
        "--snapshot-every",
        "5",
        "--keep",
        "2",
        "--nan-at",
        "10",
    )
    assert out.exists() and "NonFiniteLossError" in proc.stderr, proc.stderr
    return out


@pytest.fixture(scope="session")
def corpus(real_recording: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    out = tmp_path_factory.mktemp("untrusted-corpus")
    with h5py.File(real_recording, "r") as f:
        run_id = str(f.attrs["run_id"])
    cases = recording_cases(real_recording, out)
    cases += sidecar_cases(real_recording, out, run_id)
    cases += truncation_cases(real_recording, out)
    by_name = {c.name: c for c in cases}
    assert len(by_name) == len(cases), "two cases share a name"
    return by_name
