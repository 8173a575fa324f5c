"""The disk fills up while a run records (issue: "Training never dies because of the recorder").

A file size limit (``RLIMIT_FSIZE``) makes every write past it fail as a full disk does, in the
writer process too. Training goes on to its last step with one warning; the steps written
before stay readable and replay bitwise; and the failed writer left no lock file beside the
recording (it left without closing HDF5, which may crash there, and took its lock file's
removal with it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import replay_json, run_py

SCRIPT = Path(__file__).with_name("scripts") / "file_size_limit.py"


def test_a_full_disk_stops_recording_not_training_and_leaves_no_lock_file(tmp_path: Path) -> None:
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    p = run_py(SCRIPT.name, "run.h5", "3000000", cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(json.loads(p.stdout.strip().splitlines()[-1])) == 200  # every step trained
    assert p.stderr.count("RecorderWarning") == 1 and "File too large" in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["file_size_limit.py", "run.h5"]
    rc, info, err = replay_json("info", "run.h5", cwd=tmp_path)
    assert rc == 0 and info["steps_recorded"] > 0, (info, err)
    rc, verify, err = replay_json("verify", "run.h5", cwd=tmp_path)
    assert rc == 0 and verify["deterministic"] is True, (verify, err[-3000:])
