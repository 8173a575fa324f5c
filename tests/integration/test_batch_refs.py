"""Batches by reference: a DataLoader-fed run records the sample indices and a digest per step,
replay draws each batch again from the dataset, and a dataset edited since is refused."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from recorded_runs import cli

from replay.errors import EXIT_DATA_CHANGED
from replay.store import open_recording
from tests.conftest import run_py

SCRIPT = Path(__file__).with_name("scripts") / "loader_train.py"


def _data(path: Path) -> Path:
    rows = np.random.default_rng(0).standard_normal((100, 9)).astype(np.float32)
    rows[:, 8] = rows[:, :8].sum(axis=1)
    np.save(path, rows)
    return path


def _record(tmp_path: Path, *extra: str) -> tuple[Path, Path, subprocess.CompletedProcess]:
    data, run = _data(tmp_path / "data.npy"), tmp_path / "run.h5"
    p = run_py(str(SCRIPT), str(run), str(data), *extra, timeout=120)
    assert p.returncode == 0, p.stderr
    return run, data, p


@pytest.mark.slow
def test_a_run_recorded_by_reference_replays_bitwise_and_refuses_an_edited_dataset(tmp_path):
    # two worker processes: the sampler runs ahead of the batches the loop gets (prefetch)
    run, data, _ = _record(tmp_path, "--workers", "2")
    with open_recording(run) as rec:
        record = rec.read_step(5)
        assert record["batch"] is None  # no batch bytes: the indices and a digest
        assert record["batch_ref"]["indices"].shape == (8,)
        assert len(record["batch_ref"]["sha256"]) == 64
    p = cli("verify", str(run))
    assert p.returncode == 0, p.stderr
    assert "all 30 steps of the window (0..29) replay bitwise" in p.stdout
    rows = np.load(data)
    rows[:, 2] += 1.0  # every sample changed
    np.save(data, rows)
    p = cli("verify", str(run))
    assert p.returncode == EXIT_DATA_CHANGED, p.stderr
    error = [line for line in p.stderr.splitlines() if line.startswith("replay: error")]
    assert len(error) == 1 and "step 0: the data changed since the recording" in error[0]
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_a_loop_that_changes_its_batches_keeps_them_by_value(tmp_path):
    run, _, p = _record(tmp_path, "--scale", "2", "--steps", "12")
    assert "batches are recorded by value from here on, not by reference" in p.stderr
    with open_recording(run) as rec:
        record = rec.read_step(3)
        assert record["batch"] is not None and "batch_ref" not in record
    p = cli("verify", str(run))
    assert p.returncode == 0, p.stderr


def test_a_culprit_sample_drawn_by_reference_is_named_by_its_dataset_index_and_file(tmp_path):
    """Was: "samples 3", its row in the batch, for a NaN planted at dataset index 37: nothing a
    user could look up. The batch's recorded indices name the sample in the dataset, and a
    dataset that lists its files (an ImageFolder's ``samples``) names the file."""
    data = _data(tmp_path / "data.npy")
    rows = np.load(data)
    rows[37, 3] = np.nan
    np.save(data, rows)
    run = tmp_path / "run.h5"
    p = run_py(str(SCRIPT), str(run), str(data), timeout=120)
    assert p.returncode != 0 and "loss is nan" in p.stderr, p.stderr[-2000:]
    b = cli("bisect", str(run), "--json")
    assert b.returncode == 0, b.stderr[-2000:]
    d = json.loads(b.stdout)
    assert d["cause"] == "data" and len(d["samples"]) == 1, d
    assert d["sample_sources"] == [{"index": 37, "file": "rows/0037.row"}], d["sample_sources"]
    text = cli("bisect", str(run)).stdout
    assert f"samples       {d['samples'][0]} (dataset index 37: rows/0037.row)" in text, text
