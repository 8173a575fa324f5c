"""The Recorder on real training loops: what lands in the file, and what it refuses."""

from __future__ import annotations

import math

import mlp_train
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import replay
from replay.store import open_recording


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(batch["x"]), batch["y"])
    loss.backward()
    optimizer.step()
    return loss


def raising_step(model, optimizer, batch):
    raise KeyError("label 'cat' missing")


def batch_for(t):
    """Step t's batch: the same values whenever it is built again."""
    g = torch.Generator().manual_seed(t)
    return {"x": torch.randn(5, 6, generator=g), "y": torch.randint(0, 3, (5,), generator=g)}


def record(path, steps=12, step_fn=train_step, **kw):
    model, opt = build()
    grad_norms = []
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=step_fn,
        build_fn=build,
        snapshot_every=4,
        keep_snapshots=2,
        fingerprint_every=5,
        **kw,
    ) as rec:
        for t in range(steps):
            rec.step(batch_for(t))
            grads = [p.grad for p in model.parameters()]
            grad_norms.append(
                float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))
            )
    return model, grad_norms


def test_batches_health_and_fingerprint_are_recorded(tmp_path):
    path = tmp_path / "run.h5"
    model, grad_norms = record(path, reach=0)
    with open_recording(path) as rec:
        # the dense ring alone, 2*4 steps: the last 8 are kept; health for all 12
        assert rec.steps().tolist() == list(range(4, 12))
        assert rec.snapshot_steps().tolist() == [4, 8]
        w = rec.replayable_window()
        assert (w.first, w.last) == (4, 11)
        h = rec.health()
        assert h["step"].tolist() == list(range(12))
        np.testing.assert_allclose(h["grad_norm"], grad_norms, rtol=1e-6)
        # measured every 5 steps: 0, 5, 10; the last one (step 10) is 11 steps into training
        measured = np.isfinite(h["param_fingerprint"])
        assert h["step"][measured].tolist() == [0, 5, 10]
        assert np.isnan(h["param_nonfinite"][~measured]).all()
        assert (h["param_nonfinite"][measured] == 0).all()
        assert (h["loss_nonfinite"] == 0).all() and (h["raised"] == 0).all()
        assert (h["optimizer_stepped"] == 1).all() and (h["lr"] == 0.1).all()
        rec_7 = rec.read_step(7)
        g = torch.Generator().manual_seed(7)
        assert np.array_equal(rec_7["batch"]["x"].data, torch.randn(5, 6, generator=g).numpy())
        assert rec_7["hparams"][0]["lr"] == 0.1
        assert rec_7["modes"].tolist() == [True] * 4
        assert rec.meta["entry"]["step_fn"]["qualname"] == "train_step"
        assert rec.meta["env"]["num_threads"] == torch.get_num_threads()
        snap = rec.read_snapshot(8)
        assert set(snap) >= {"step", "model", "optimizer"} and snap["step"] == 8
        assert rec.closed_cleanly


def test_a_step_that_raises_is_recorded_and_reraised_unchanged(tmp_path):
    path = tmp_path / "run.h5"
    with pytest.raises(KeyError, match="label 'cat' missing"):
        record(path, step_fn=raising_step)
    with open_recording(path) as rec:
        assert rec.first_bad()["exception"] == 0
        exc = rec.read_step(0)["exception"]
        assert exc["type"] == "KeyError" and "cat" in exc["message"]
        assert "raising_step" in exc["traceback"]


def raises_at_step_9(model, optimizer, batch):
    if int(batch["step"]) == 9:
        raise RuntimeError("shape '[32, -1]' is invalid for input of size 200")
    return train_step(model, optimizer, batch)


def test_a_raised_step_is_not_overwritten_by_the_earlier_steps_committed_after_it(tmp_path):
    """A raised step goes to the writer by the pipe, the steps before it by the step log: it
    could be committed in the same group as step 1, before it, and step 1 took its ring slot
    (examples/odd_last_batch.py lost its failing step so). Step 0 is committed at once."""
    path = tmp_path / "run.h5"
    model, opt = build()
    with pytest.raises(RuntimeError, match="invalid for input"):
        with replay.Recorder(
            path,
            model=model,
            optimizer=opt,
            step_fn=raises_at_step_9,
            build_fn=build,
            snapshot_every=4,
            keep_snapshots=2,
            reach=0,  # the dense ring alone: steps 0 and 1 are overwritten
        ) as rec:
            for t in range(10):
                rec.step({**batch_for(t), "step": torch.tensor(t)})
    with open_recording(path) as r:
        assert r.steps().tolist() == list(range(2, 10))
        assert r.read_step(9)["exception"]["type"] == "RuntimeError"
        assert r.first_bad()["exception"] == 9


def test_nonfinite_loss_is_recorded_then_raised(tmp_path):
    path = str(tmp_path / "run.h5")
    model, opt = mlp_train.build()
    with pytest.raises(replay.NonFiniteLossError) as info:
        with replay.Recorder(
            path,
            model=model,
            optimizer=opt,
            step_fn=mlp_train.train_step,
            build_fn=mlp_train.build,
            snapshot_every=5,
        ) as rec:
            for t in range(10):
                x, y = mlp_train.make_batch(t)
                if t == 6:
                    x[0, 0] = math.inf
                rec.step((x, y))
    assert info.value.step == 6 and "replay bisect" in str(info.value)
    with open_recording(path) as rec:
        assert rec.first_bad()["nonfinite"] == 6
        assert rec.steps().max() == 6


def test_raise_on_nonfinite_false_keeps_training(tmp_path):
    path = str(tmp_path / "run.h5")
    model, opt = mlp_train.build()
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=mlp_train.train_step,
        build_fn=mlp_train.build,
        raise_on_nonfinite=False,
        fingerprint_every=1,
    ) as rec:
        for t in range(5):
            x, y = mlp_train.make_batch(t)
            x[0, 0] = math.nan if t == 2 else x[0, 0]
            rec.step((x, y))
    with open_recording(path) as rec:
        h = rec.health()
        assert h["loss_nonfinite"].tolist() == [0, 0, 1, 1, 1]  # the NaN poisons the parameters
        assert h["grad_nonfinite"][2] == 1 and h["param_nonfinite"][2] == 1


def test_varying_batch_shapes_grow_the_slot_without_losing_data(tmp_path):
    path = str(tmp_path / "run.h5")
    with mlp_train.recorder(path, snapshot_every=50) as rec:
        for t in range(12):
            n = 2 + 300 * (t % 3)  # 2 rows, then 302: far past the first slot size
            x = torch.full((n, 16), float(t))
            rec.step((x, torch.zeros(n, dtype=torch.long)))
    with open_recording(path) as rec:
        for t in range(12):
            x = rec.read_step(t)["batch"][0].data
            assert x.shape == (2 + 300 * (t % 3), 16) and (x == t).all()


def test_scheduler_stepped_outside_step_fn_is_seen_in_hparams(tmp_path):
    path = str(tmp_path / "run.h5")
    model, opt = mlp_train.build()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        scheduler=sched,
        step_fn=mlp_train.train_step,
        build_fn=mlp_train.build,
        snapshot_every=3,
    ) as rec:
        for t in range(6):
            rec.step(mlp_train.make_batch(t))
            sched.step()
    with open_recording(path) as rec:
        lrs = [rec.read_step(t)["hparams"][0]["lr"] for t in range(6)]
        assert lrs == [1e-2, 1e-2, 5e-3, 5e-3, 2.5e-3, 2.5e-3]
        assert "scheduler" in rec.read_snapshot(3)


def closure_maker():
    def inner(model, optimizer, batch):
        return 0.0

    return inner


@pytest.mark.parametrize(
    "fn, why",
    [(lambda m, o, b: 0.0, "lambda"), (closure_maker(), "closure"), (print, "no source")],
)
def test_entry_points_that_cannot_be_imported_again_are_refused(tmp_path, fn, why):
    model, opt = build()
    with pytest.raises(replay.EntryPointError, match=why.split()[0]):
        replay.Recorder(tmp_path / "x.h5", model=model, optimizer=opt, step_fn=fn, build_fn=build)
    assert not (tmp_path / "x.h5").exists()


def test_eval_mode_is_recorded_per_step(tmp_path):
    path = str(tmp_path / "run.h5")
    model, opt = mlp_train.build()
    with replay.Recorder(
        path, model=model, optimizer=opt, step_fn=mlp_train.train_step, build_fn=mlp_train.build
    ) as rec:
        rec.step(mlp_train.make_batch(0))
        model[2].eval()
        rec.step(mlp_train.make_batch(1))
    with open_recording(path) as rec:
        assert rec.read_step(0)["modes"].all()
        assert rec.read_step(1)["modes"].tolist() == [True, True, True, False, True]


@pytest.mark.parametrize("reach, short", [(0, 60), (40, 300)], ids=["dense", "tiers"])
def test_file_size_stays_flat_between_a_short_and_a_long_run(tmp_path, reach, short):
    """Bounded: once the rings are full the file stops growing, whatever the run's length;
    with tiers (reach 40: every 5 steps for the last 10, every 50 beyond, 90 step slots) too."""
    from tests.conftest import SCRIPTS, run_py

    sizes = {}
    for steps in (short, 600):
        out = tmp_path / f"run{steps}.h5"
        run_py(
            str(SCRIPTS / "mlp_train.py"),
            str(out),
            "--steps",
            str(steps),
            "--snapshot-every",
            "5",
            "--keep",
            "2",
            "--keep-health",
            "50",
            "--reach",
            str(reach),
            check=True,
        )
        sizes[steps] = out.stat().st_size
        with open_recording(out) as rec:
            assert rec.status()["steps_total"] == steps
            assert len(rec.health()["step"]) == (50 if reach == 0 else 90)  # >= the step ring
    assert sizes[600] <= sizes[short] * 1.02, sizes


class FlakyBatch(dict):
    """A batch container whose iteration fails: the recorder cannot copy it, the step can use it."""

    def items(self):
        raise RuntimeError("this container cannot be iterated")


def test_a_batch_the_recorder_cannot_copy_stops_recording_not_training(tmp_path):
    model, opt = build()
    losses = []
    with pytest.warns(replay.RecorderWarning, match="capturing the step failed") as record_warnings:
        with replay.Recorder(
            tmp_path / "run.h5", model=model, optimizer=opt, step_fn=train_step, build_fn=build
        ) as rec:
            for t in range(3):
                g = torch.Generator().manual_seed(t)
                batch = FlakyBatch(
                    x=torch.randn(5, 6, generator=g), y=torch.randint(0, 3, (5,), generator=g)
                )
                losses.append(float(rec.step(batch).detach()))
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    assert len([w for w in record_warnings if w.category is replay.RecorderWarning]) == 1


def test_a_recorder_whose_first_step_could_not_be_captured_ends_its_writer_process(tmp_path):
    """The first step failed to be captured before the writer thread started, and close()
    closed only what that thread would have: the writer process ran on, its pipes open (the
    next test in the worker failed on their ResourceWarnings)."""
    model, opt = build()
    with pytest.warns(replay.RecorderWarning, match="capturing the step failed"):
        with replay.Recorder(
            tmp_path / "run.h5", model=model, optimizer=opt, step_fn=train_step, build_fn=build
        ) as rec:
            batch = FlakyBatch(x=torch.randn(5, 6), y=torch.randint(0, 3, (5,)))
            rec.step(batch)
    proc = rec._capture.transport.client.proc
    assert proc.poll() == 0 and proc.stdin.closed and proc.stdout.closed
    assert not (tmp_path / "run.h5").exists()  # no step was recorded: no file


@pytest.mark.parametrize("step_log", ["on", "off"])
def test_reused_batch_buffers_never_carry_one_steps_data_into_another(
    tmp_path, monkeypatch, step_log
):
    # The batch copies' buffers go back to the pool once the writer has sent them, and the
    # next steps copy into them: a buffer handed back too early would show up here as a step
    # holding a later step's values. With the step log (the default on Linux) its space is
    # reused the same way once the writer process has committed it.
    monkeypatch.setenv("REPLAY_STEP_LOG", step_log)
    path = str(tmp_path / "run.h5")
    with mlp_train.recorder(path, snapshot_every=100, keep_snapshots=2) as rec:
        for t in range(200):
            rec.step((torch.full((8, 16), float(t)), torch.full((8,), t % 4, dtype=torch.long)))
            if t % 10 == 9:
                rec.flush()  # every buffer sent so far is back in the pool
        if step_log == "off":
            assert rec.transport.pool.hits > 300  # the buffers really were recycled
        else:
            assert (
                rec.transport.log is not None and rec.transport.pool.hits == 0
            )  # no copy outside the log
    with open_recording(path) as r:
        for t in range(200):
            x, y = (leaf.data for leaf in r.read_step(t)["batch"])
            assert (x == t).all() and (y == t % 4).all(), t
