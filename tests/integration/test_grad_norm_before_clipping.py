"""Regression: the recorded gradient norm was taken after ``clip_grad_norm_`` (it sat at the clip
value, and read 0.0 when an infinite norm made the clip zero the gradients), so the doctor's
exploding-gradient rules could never fire on a clipped run. It must be the norm before any clip.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import replay
from replay.store import open_recording

CLIP = 1.0
SCALE = {"value": 1000.0}  # how large the step makes its gradients
SEEN: list[float] = []  # what clip_grad_norm_ returned at each step: the true pre-clip norm


def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def clipped_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = F.mse_loss(model(batch), torch.zeros(len(batch), 3))
    (loss * SCALE["value"]).backward()
    SEEN.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
    optimizer.step()
    return loss


def value_clipped_step(model, optimizer, batch):
    optimizer.zero_grad()
    (F.mse_loss(model(batch), torch.zeros(len(batch), 3)) * SCALE["value"]).backward()
    SEEN.append(
        float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))
    )
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
    optimizer.step()
    return torch.zeros(())


def _record(path, step_fn, steps=4):
    SEEN.clear()
    model, opt = build()
    g = torch.Generator().manual_seed(1)
    with replay.Recorder(
        path, model=model, optimizer=opt, step_fn=step_fn, build_fn=build, snapshot_every=2
    ) as rec:
        for _ in range(steps):
            rec.step(torch.randn(8, 4, generator=g))
    with open_recording(path) as r:
        h = r.health()
    return h


def test_recorded_grad_norm_is_the_norm_clip_grad_norm_saw(tmp_path):
    h = _record(tmp_path / "run.h5", clipped_step)
    assert all(v > 10 * CLIP for v in SEEN)
    for recorded, seen in zip(h["grad_norm"], SEEN):
        assert math.isclose(recorded, seen, rel_tol=1e-5), (recorded, seen)


def test_an_infinite_norm_that_the_clip_zeroes_is_recorded_as_non_finite(tmp_path):
    SCALE["value"] = math.inf
    try:
        h = _record(tmp_path / "run.h5", clipped_step, steps=1)  # step 1 would be NaN
    finally:
        SCALE["value"] = 1000.0
    assert all(not math.isfinite(v) for v in SEEN)
    assert h["grad_nonfinite"][0] == 1.0 and not math.isfinite(h["grad_norm"][0])


def test_clip_grad_value_is_measured_before_it_clamps(tmp_path):
    h = _record(tmp_path / "run.h5", value_clipped_step)
    for recorded, seen in zip(h["grad_norm"], SEEN):
        assert math.isclose(recorded, seen, rel_tol=1e-5), (recorded, seen)
    assert min(h["grad_norm"]) > 1.0  # clamped to 0.01 per element, the norm would be < 0.1


def build_fused_amp():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True),
        "scaler": torch.amp.GradScaler("cpu", init_scale=1024.0),
    }


def fused_amp_step(model, optimizer, scaler, batch):
    optimizer.zero_grad()
    loss = F.mse_loss(model(batch), torch.zeros(len(batch), 3))
    scaler.scale(loss).backward()
    grads = [p.grad for p in model.parameters()]
    norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
    SEEN.append(norm / scaler.get_scale())  # the norm of the gradients the update sees
    scaler.step(optimizer)  # the fused step unscales inside its own kernel
    scaler.update()
    return loss


def test_a_fused_optimizer_under_a_grad_scaler_records_the_unscaled_gradient_norm(tmp_path):
    """It recorded the scaled norm (1024x here, 65,536x at GradScaler's default scale): a fused
    optimizer is handed scaled gradients and unscales them inside its step."""
    SEEN.clear()
    g = torch.Generator().manual_seed(1)
    with replay.Recorder(
        tmp_path / "run.h5",
        objects=build_fused_amp(),
        step_fn=fused_amp_step,
        build_fn=build_fused_amp,
        self_check=False,
    ) as rec:
        for _ in range(3):
            rec.step(torch.randn(8, 4, generator=g))
    with open_recording(tmp_path / "run.h5") as r:
        h = r.health()
    assert len(SEEN) == 3 and all(0 < v < 100 for v in SEEN)
    for recorded, seen in zip(h["grad_norm"], SEEN):
        assert math.isclose(recorded, seen, rel_tol=1e-6), (recorded, seen)
    assert list(h["scale"]) == [1024.0] * 3 and not any(h["scaler_skipped"])
