"""`replay info` on good, live, killed and bad files: one line and exit 3 for bad input."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest

from replay.store import FORMAT_VERSION
from tests.conftest import replay_here, run_py


@pytest.fixture(scope="module")
def nan_run(mlp_nan_run):
    return mlp_nan_run


def test_info_reports_window_first_failure_and_entry_points(nan_run):
    proc = replay_here("info", str(nan_run))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "replayable      steps 0..22" in out
    assert "first non-finite at step 22" in out
    assert "__main__:train_step" in out and "mlp_train.py" in out
    proc = replay_here("info", str(nan_run), "--json")
    d = json.loads(proc.stdout)
    assert d["replayable_window"] == [0, 22] and d["first_bad"]["nonfinite"] == 22
    assert d["format_version"] == FORMAT_VERSION and d["snapshots"] == [0, 10, 20]


def test_info_says_when_the_kept_batches_have_gaps(nan_run, tmp_path):
    """A commit cut short (a writer killed mid-group, a full disk) can leave the ring with
    steps missing inside its span; ``batches kept 0..22`` would claim all of them."""
    run = tmp_path / "gaps.h5"
    shutil.copy(nan_run, run)
    with h5py.File(run, "r+") as f:
        markers = f["steps/step"]
        slot = int(np.flatnonzero(markers[:] == 15)[0])
        markers[slot] = -1  # step 15's slot: invalidated, never rewritten
    proc = replay_here("info", str(run))
    assert proc.returncode == 0, proc.stderr
    assert "batches kept    steps 0..22  (22 of them: a commit was cut short)" in proc.stdout
    assert "replayable      steps 20..22" in proc.stdout  # the newest run of steps with a snapshot
    d = json.loads(replay_here("info", str(run), "--json").stdout)
    assert d["batch_steps"] == [0, 22] and d["batch_count"] == 22


def _assert_one_line_error(proc, *fragments):
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in lines[0]


def test_missing_file(tmp_path):
    _assert_one_line_error(replay_here("info", str(tmp_path / "nope.h5")), "no such file")


def test_not_hdf5(tmp_path):
    p = tmp_path / "notes.h5"
    p.write_text("hello")
    _assert_one_line_error(replay_here("info", str(p)), "not an HDF5 file")


def test_hdf5_but_not_a_recording(tmp_path):
    p = tmp_path / "other.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.arange(3)
    _assert_one_line_error(replay_here("info", str(p)), "not a replay recording")


def test_newer_format_version_says_upgrade(tmp_path, nan_run):
    p = tmp_path / "future.h5"
    shutil.copy(nan_run, p)
    with h5py.File(p, "r+") as f:
        f.attrs["format_version"] = 99
    _assert_one_line_error(replay_here("info", str(p)), "newer replay", "pip install -U")


def test_truncated_file(tmp_path, nan_run):
    p = tmp_path / "cut.h5"
    p.write_bytes(nan_run.read_bytes()[:5000])
    _assert_one_line_error(replay_here("info", str(p)), "truncated")


@pytest.mark.parametrize("percent", [90, 50])
def test_truncated_copy_was_called_closed_cleanly(tmp_path, nan_run, percent):
    """Cut to 90% info said nothing of damage; cut to 50% it listed damaged steps under a status
    line saying "closed cleanly". Both exited 0 (issue 32, item 9)."""
    p = tmp_path / f"cut{percent}.h5"
    data = nan_run.read_bytes()
    p.write_bytes(data[: len(data) * percent // 100])
    proc = replay_here("info", str(p))
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    status = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("status")]
    assert len(status) == 1 and "TRUNCATED" in status[0], proc.stdout
    assert f"of the {len(data)} bytes" in status[0] and "closed cleanly" not in proc.stdout
    assert "replayable" in proc.stdout  # what is still readable is listed
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: error: ") and "truncated" in lines[0]
    j = replay_here("info", str(p), "--json")
    assert j.returncode == 3
    d = json.loads(j.stdout)
    assert d["truncated"] == {"size": len(data) * percent // 100, "claimed": len(data)}
    assert d["exit_code"] == 3 and "truncated" in d["error"]
    assert "replayable_window" in d and "damaged_steps" in d
    whole = json.loads(replay_here("info", str(nan_run), "--json").stdout)
    assert whole["truncated"] is None and "error" not in whole


def test_directory_is_not_a_recording(tmp_path):
    proc = replay_here("info", str(tmp_path))
    assert proc.returncode in (2, 3) and "Traceback" not in proc.stderr


def test_usage_error_exits_2():
    proc = replay_here("info")
    assert proc.returncode == 2 and "Missing argument" in proc.stderr


def test_help_and_info_do_not_import_torch(nan_run):
    code = (
        "import sys; from replay.cli import cli; from click.testing import CliRunner\n"
        f"r = CliRunner().invoke(cli, ['info', {str(nan_run)!r}]); assert r.exit_code == 0, r.output\n"
        "r = CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = run_py("-c", code, fresh=True)  # (a forked child has torch already)
    assert proc.returncode == 0, proc.stderr


def test_info_json_keeps_its_keys_in_their_order(nan_run):
    """``InfoReport.to_json`` flattens its steps part between the file's identity and its
    ``/meta/run`` parts: the keys and their order are the ``--json`` contract."""
    d = json.loads(replay_here("info", str(nan_run), "--json").stdout)
    assert list(d) == [
        *("path", "format", "format_version", "run_id", "created", "steps_recorded"),
        *("health_steps", "batch_steps", "batch_count", "snapshots", "replayable_window"),
        *("reach", "not_replayable", "first_bad", "last_loss", "closed_cleanly", "ended"),
        "writer",
        *("truncated", "damaged_steps", "damaged_health", "self_check", "segments"),
        *("watched_objects", "hparams", "config", "entry", "program", "env", "bitwise_cuda"),
        *("environ_here", "model", "optimizer", "scheduler", "scaler", "objects"),
        *("distributed", "trust"),
    ]
    assert list(d["model"]) == ["class", "param_bytes", "n_params"]
    assert list(d["trust"]) == ["standing", "why", "line"]
