"""A verdict is a function of the recording (issue 44): the same PPO recording bisected several
times gave "op: aten::log made -inf, aten::mul turned it into NaN" three times and "state:
non-finite before this step, aten::lerp_ (optimizer)" once, whatever PYTHONHASHSEED. The tracer
knew storages by address, and which new gradient lands at the address of one zero_grad() freed
is up to malloc; two bisects at once also shared the sidecar's temporary file. Here one
recording is bisected by three fresh interpreters at once (each its own hash seed, on a busy
machine), and the reports must be the same, timings and paths aside."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from tests.conftest import run_env, run_py
from tests.realistic.test_real_programs import PROGRAMS

# fields that name where the files are, not what the recording says
PATH_FIELDS = ("recording", "forensics", "entry_files")


def _bisect_at_once(run: str, cwd: str, seeds: list[int]) -> list[dict]:
    """``replay bisect RUN --json`` in one fresh interpreter per hash seed, all at once (the fork
    server's children would share its hash seed)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "replay", "bisect", run, "--json"],
            cwd=cwd,
            env={**run_env(), "PYTHONHASHSEED": str(seed)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in seeds
    ]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        d = json.loads(out)
        reports.append({k: v for k, v in d.items() if k not in PATH_FIELDS})
    return reports


def test_a_ppo_recording_bisects_to_one_verdict_under_any_hash_seed_and_at_once(tmp_path):
    """ppo.py (CleanRL's shape, entropy as -(p * log p), lr 0.3, the update returning nothing):
    three bisects at once, each with its own hash seed, say the same thing, and it is right."""
    shutil.copy(PROGRAMS / "ppo.py", tmp_path / "ppo.py")
    p = run_py(str(tmp_path / "ppo.py"), "run.h5", cwd=tmp_path, timeout=180)
    assert p.returncode == 3 and "Simplex" in p.stderr, p.stderr[-2000:]
    first, *others = _bisect_at_once("run.h5", str(tmp_path), [0, 1, 2])
    assert (first["first_bad_step"], first["cause"], first["op"]) == (9, "op", "aten::log")
    assert first["nan_from_inf"]["op"] == "aten::mul" and first["reproducible"] is True
    for other in others:
        assert other == first
