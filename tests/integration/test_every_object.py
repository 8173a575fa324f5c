"""Every model and optimizer among the named objects is watched (issue 31, item 1).

A GAN passes netG and optG beside ``model``/``optimizer`` (netD, optD). The health rows watched D
only, so bisect reported the step where D's loss went NaN with cause ``state`` and the note "the
failure began at an earlier step"; G's gradients had gone NaN a step before. Now each watched
object has its own columns (``netG__grad_norm``, ...), bisect's first bad step is the first step
where any object went bad, and a step that began with non-finite state is walked back to the
step that made it so.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import replay
from replay.store import open_recording
from replay.store.layout import OBJECT_METRICS
from tests.conftest import SCRIPTS, replay_json, run_py

GAN = SCRIPTS / "gan_train.py"
STATE = SCRIPTS / "state_train.py"


def _plain(script, *args):
    p = run_py(str(script), "--plain", *args, check=True)
    return json.loads(p.stdout)


def _first_bad(truth):
    """The first step where a model's gradients (before its update) or parameters (after the
    step) were non-finite, or the loss was, by the plain loop's own checks."""
    for r in truth:
        if (
            not r["loss_finite"]
            or not all(r["grads_finite"].values())
            or not all(r["params_finite"].values())
        ):
            return r["step"]
    return None


@pytest.mark.slow
def test_gan_bisect_finds_the_step_netG_went_bad(tmp_path):
    truth = _plain(GAN, "--steps", "8")
    bad = _first_bad(truth)
    assert bad is not None and truth[bad]["loss_finite"]  # D's loss shows it a step later
    assert not truth[bad]["grads_finite"]["netG"] and truth[bad]["grads_finite"]["netD"]
    assert truth[bad]["first_nonfinite_op"] == "aten::log"
    run = tmp_path / "gan.h5"
    p = run_py(str(GAN), str(run), "--steps", "12", cwd=tmp_path)
    assert "NonFiniteLossError" in p.stderr, p.stderr
    with open_recording(run) as r:
        assert r.watched_objects == ["netG"]
        assert [c for c in r.health_columns if c.startswith("netG__")] == [
            f"netG__{m}" for m in OBJECT_METRICS
        ]
        h = r.health()
        first_loss = int(h["step"][h["loss_nonfinite"] == 1][0])
        assert first_loss == bad + 1
        # The recorder saw G go bad at that step, D's own columns did not.
        i = list(h["step"]).index(bad)
        assert h["netG__grad_nonfinite"][i] == 1 and h["netG__param_nonfinite"][i] == 1
        assert h["grad_nonfinite"][i] == 0
        assert r.first_bad()["nonfinite"] == bad
        assert all(
            h["netG__grad_nonfinite"][j] == 0 and math.isfinite(h["netG__grad_norm"][j])
            for j in range(i)
        )
    rc, d, err = replay_json("bisect", str(run), cwd=tmp_path)
    assert rc == 0, err
    assert d["first_bad_step"] == bad
    assert d["deterministic"] is True and d["reproducible"] is True
    assert d["cause"] == "op"
    # The op that made G's gradients non-finite: log's backward (grad / p at p == 0), created
    # by the forward line of G's loss, where the plain loop saw log(0) first.
    assert "torch.log(p_gen)" in d["source"]["code"]
    assert not any("earlier step" in n for n in d["notes"] + d.get("trace_notes", []))
    # The object's columns are usable in a predicate.
    rc, d, err = replay_json(
        "bisect", str(run), "--until", "netG__grad_nonfinite == 1", "--no-trace", cwd=tmp_path
    )
    assert rc == 0, err
    assert d["kind"] == "predicate" and d["first_bad_step"] == bad


@pytest.mark.slow
def test_state_bad_before_the_step_is_walked_back(tmp_path):
    truth = _plain(STATE, "--steps", "8", "--bad-at", "5")
    went = next(r["step"] for r in truth if not r["scale_finite"])
    assert truth[went]["loss_finite"] and not truth[went + 1]["loss_finite"]
    run = tmp_path / "state.h5"
    run_py(str(STATE), str(run), "--bad-at", "5", cwd=tmp_path)
    rc, d, err = replay_json("bisect", str(run), cwd=tmp_path)
    assert rc == 0, err
    assert d["symptom_step"] == went + 1
    assert d["first_bad_step"] == went
    assert d["cause"] == "op" and d["op"] == "aten::mul_"
    assert "stats.scale.mul_(gain)" in d["source"]["code"]
    assert any(f"step {went + 1} began with non-finite state" in n for n in d["notes"])
    assert not any("earlier step" in n for n in d["notes"] + d.get("trace_notes", []))


# -- in-process: where each object's norm is measured --------------------------------------

SEEN: dict[str, list[float]] = {"D": [], "G": []}


def build_two():
    torch.manual_seed(0)
    netD, netG = torch.nn.Linear(4, 1), torch.nn.Linear(3, 4)
    return {
        "model": netD,
        "optimizer": torch.optim.SGD(netD.parameters(), lr=1e-3),
        "netG": netG,
        "optG": torch.optim.SGD(netG.parameters(), lr=1e-3),
    }


def _norm(params):
    return float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params])))


def two_step(model, optimizer, netG, optG, batch):
    z, x = batch
    optimizer.zero_grad()
    errD = F.softplus(-model(x)).mean() + F.softplus(model(netG(z).detach())).mean()
    errD.backward()
    SEEN["D"].append(_norm(model.parameters()))
    optimizer.step()
    optG.zero_grad()
    errG = F.softplus(-model(netG(z))).mean() * 1000
    errG.backward()
    SEEN["G"].append(_norm(netG.parameters()))
    torch.nn.utils.clip_grad_norm_(netG.parameters(), 0.5)  # only G's: D's norm is taken
    optG.step()
    return errD


def test_each_object_norm_is_its_own_before_its_clip(tmp_path):
    SEEN["D"].clear()
    SEEN["G"].clear()
    objs = build_two()
    g = torch.Generator().manual_seed(3)
    with replay.Recorder(
        tmp_path / "two.h5", objects=objs, step_fn=two_step, build_fn=build_two, snapshot_every=2
    ) as rec:
        for _ in range(4):
            rec.step((torch.randn(5, 3, generator=g), torch.randn(5, 4, generator=g)))
    with open_recording(tmp_path / "two.h5") as r:
        h = r.health()
    close = lambda a, b: all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b, strict=True))  # noqa: E731 - (float64 norms of float32 gradients)
    assert close(h["grad_norm"], SEEN["D"])
    # G's norm before its clip (the clip brings it to 0.5), not D's, not after the clip.
    assert close(h["netG__grad_norm"], SEEN["G"])
    assert all(n > 0.5 for n in SEEN["G"])
    assert list(h["netG__grad_nonfinite"]) == [0.0] * 4
    # Fingerprints at the fingerprint steps (step 0 of every 10), NaN between.
    assert math.isfinite(h["netG__param_fingerprint"][0])
    assert all(math.isnan(v) for v in h["netG__param_fingerprint"][1:])
