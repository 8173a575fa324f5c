"""The settings that decide a bitwise replay are recorded, shown by ``info``, applied by a replay,
and named where they differ (issue 43, item 5)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from replay.capture.numerics import apply_numerics, current_env, warn_unless_bitwise
from replay.store.bitwise import cuda_blockers, differences
from tests.conftest import replay_json, run_py

PROGRAM = textwrap.dedent(
    """
    import torch, torch.nn as nn, torch.nn.functional as F
    import replay

    torch.set_float32_matmul_precision("medium")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        optimizer.zero_grad()
        loss = F.mse_loss(model(batch), torch.zeros(3, 2))
        loss.backward()
        optimizer.step()
        return loss

    with replay.Recorder("run.h5", model=model, optimizer=optimizer, step_fn=step,
                         snapshot_every=2, self_check=False) as rec:
        for t in range(4):
            rec.step(torch.randn(3, 4))
    """
)


def test_a_recording_keeps_the_settings_that_decide_a_bitwise_replay(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    run_py(str(tmp_path / "train.py"), cwd=tmp_path, check=True)
    rc, d, err = replay_json("info", str(tmp_path / "run.h5"), cwd=tmp_path)
    assert rc == 0, err
    env = d["env"]
    assert env["matmul_precision"] == "medium" and env["deterministic_algorithms"] is True
    assert env["deterministic_warn_only"] is False
    assert set(env["sdpa"]) >= {"flash", "mem_efficient", "math"}
    assert "cublas_workspace_config" in env and "cudnn_tf32" in env
    assert d["bitwise_cuda"] is None  # a CPU run: nothing to say about CUDA
    rc, v, err = replay_json("verify", str(tmp_path / "run.h5"), cwd=tmp_path)
    assert rc == 0 and v["deterministic"] is True, err
    assert "numerics differ" not in err


def test_a_replay_applies_the_recorded_matmul_precision() -> None:
    was = torch.get_float32_matmul_precision()
    try:
        apply_numerics({"matmul_precision": "medium"}, cuda=False)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(was)


def test_a_settings_or_version_difference_is_named_in_one_phrase_each() -> None:
    now = current_env(on_gpu=False)
    recorded = {**now, "torch": "2.0.0", "matmul_precision": "medium", "devices": ["A100"]}
    said = differences(recorded, now)
    assert f"torch 2.0.0 recorded, {torch.__version__} here" in said
    assert any(s.startswith("matmul_precision medium recorded") for s in said)
    assert any(s.startswith("devices A100 recorded") for s in said)
    assert differences(now, now) == []


def test_why_a_cuda_run_will_not_replay_bitwise() -> None:
    env = {"devices": ["H100"], "cudnn_benchmark": True, "deterministic_algorithms": False}
    why = cuda_blockers(env)
    assert any("cudnn.benchmark was on" in w for w in why)
    assert any("deterministic algorithms were off" in w for w in why)
    ok = {"devices": ["H100"], "deterministic_algorithms": True}
    assert cuda_blockers({**ok, "cublas_workspace_config": ":4096:8"}) == []
    assert cuda_blockers({**env, "devices": []}) == []  # a CPU run: never


def test_a_cpu_only_run_is_never_warned_about_cuda_settings() -> None:
    was = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:  # warnings are errors in this suite: a warning fails the test
        warn_unless_bitwise(torch.nn.Linear(2, 2))
    finally:
        torch.backends.cudnn.benchmark = was
