"""On a GPU: a recorded CUDA run replays bitwise on the GPU, and bisect finds and reproduces a
failure there. Skipped where no CUDA device is present (CI has none); ``make gpu-check`` runs
these on a machine that has one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import replay_cli, run_py

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
SCRIPT = Path(__file__).with_name("cuda_run.py")


def test_a_healthy_cuda_run_replays_bitwise_on_the_gpu(tmp_path):
    run = tmp_path / "run.h5"
    run_py(str(SCRIPT), str(run), "--steps", "30", check=True, timeout=300)
    p = replay_cli("verify", str(run), "--json", cwd=tmp_path)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    d = json.loads(p.stdout)
    assert d["device"].startswith("cuda") and d["deterministic"] is True, d["cause"]


def test_bisect_finds_and_reproduces_a_cuda_failure(tmp_path):
    run = tmp_path / "run.h5"
    run_py(str(SCRIPT), str(run), "--diverge", check=True, timeout=300)
    p = replay_cli("bisect", str(run), "--json", cwd=tmp_path)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    d = json.loads(p.stdout)
    assert d["kind"] == "nonfinite" and d["device"].startswith("cuda")
    assert d["reproducible"] is True, d
    assert d["op"] is not None
