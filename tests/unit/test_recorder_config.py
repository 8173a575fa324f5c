"""``RecorderConfig`` is the only list of the Recorder's settings: a setting reaches it by name
from ``Recorder(...)`` (and from an integration's ``**kwargs``); a misspelt one or a value of
the wrong type is refused before anything starts, naming it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import replay
from replay.record.config import RecorderConfig


def _step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = model(batch).square().mean()
    loss.backward()
    optimizer.step()
    return loss


def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_misspelt_setting_is_refused_naming_the_closest_one(tmp_path):
    model = torch.nn.Linear(2, 1)
    with pytest.raises(TypeError, match=r"'snapshot_evry'; did you mean 'snapshot_every'\?"):
        replay.Recorder(
            tmp_path / "run.h5",
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            step_fn=_step,
            snapshot_evry=5,
        )
    assert not (tmp_path / "run.h5").exists()  # refused before anything was started


@pytest.mark.parametrize(
    ("setting", "value"),
    [("snapshot_every", "5"), ("reach", 2.5), ("self_check", "yes"), ("max_pending_seconds", None)],
)
def test_a_setting_of_the_wrong_type_is_refused(setting, value):
    with pytest.raises(TypeError, match=f"Recorder setting {setting}="):
        RecorderConfig.of(None, {setting: value})


def test_settings_become_plain_python_values_for_the_files_metadata():
    c = RecorderConfig.of(None, {"snapshot_every": np.int64(20), "self_check": 0, "reach": 0})
    assert c.snapshot_every == 20 and type(c.snapshot_every) is int
    assert c.self_check is False
    json.dumps(c.meta(c.plan()))  # (a numpy integer there broke the JSON)


def test_a_config_given_whole_is_overridden_by_a_setting_named_beside_it(tmp_path):
    model, opt = build()
    base = replay.RecorderConfig(snapshot_every=7, keep_snapshots=4, self_check=False)
    with replay.Recorder(
        tmp_path / "run.h5",
        model=model,
        optimizer=opt,
        step_fn=_step,
        build_fn=build,
        config=base,
        keep_snapshots=5,
        handle_signals=False,
    ) as rec:
        rec.step(torch.ones(3, 2))
    assert (rec.config.snapshot_every, rec.config.keep_snapshots) == (7, 5)
    from replay.store.reader import open_recording

    with open_recording(tmp_path / "run.h5") as r:
        assert r.meta["config"]["snapshot_every"] == 7
        assert r.meta["config"]["keep_snapshots"] == 5
