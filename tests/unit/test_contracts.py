"""The typed contracts (replay/store/contracts.py): health names, frames, phases and statuses."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from replay.bisect.search import Note, NoteKind, note_kind
from replay.capture.health import health_row
from replay.store.contracts import (
    HEALTH_DERIVED,
    HEALTH_INPUTS,
    HEALTH_KEYS,
    HealthFrame,
    OpStatus,
    Phase,
    StepFrame,
)
from replay.store.forensics import PHASES, STATUSES
from replay.store.layout import COL, HEALTH_COLUMNS
from replay.store.reader import open_recording
from replay.store.writer import RingSpec, pack_parts
from replay.store.writer_process import WriterClient

ROOT = Path(__file__).resolve().parents[2]


def _health_keys_written(path: Path) -> set[str]:
    """Every ``health["name"] = ...``, ``health.update(name=...)`` and ``{"name": ...}`` given
    to a variable called ``health`` in a source file."""
    keys: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "health":
            if isinstance(node.slice, ast.Constant) and isinstance(node.ctx, ast.Store):
                keys.add(node.slice.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "update" and getattr(node.func.value, "id", None) == "health":
                keys.update(k.arg for k in node.keywords if k.arg)
        elif isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "health":
            if isinstance(node.value, ast.Dict):
                keys.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return keys


def test_every_health_name_the_recorder_writes_is_known():
    # the step's health is written where the step's work is (step_capture.py, since the
    # Recorder became its configuration and lifecycle); the Recorder itself, too
    record = ROOT / "replay" / "record"
    keys = _health_keys_written(record / "step_capture.py")
    keys |= _health_keys_written(record / "recorder.py")
    assert {
        "lr",
        "raised",
        "loss",
        "grad_norm",
        "scale_after",
        "cuda_peak",
    } <= keys  # the walk works
    assert keys <= HEALTH_KEYS, keys - HEALTH_KEYS


def test_health_keys_are_the_measured_columns_and_the_flag_inputs():
    assert set(HEALTH_COLUMNS) | HEALTH_INPUTS == HEALTH_KEYS | HEALTH_DERIVED
    assert not HEALTH_KEYS & HEALTH_DERIVED


def test_an_unknown_health_name_raises_instead_of_vanishing():
    with pytest.raises(KeyError, match="grad_nrom"):
        health_row({"loss": 1.0, "grad_nrom": 2.0})
    with pytest.raises(KeyError, match="loss_nonfinite"):  # derived: health_row computes it
        health_row({"loss_nonfinite": 0.0})


def test_known_health_names_fill_their_columns():
    row = health_row(
        {"loss": 2.0, "grad_norm": torch.tensor(3.0), "scale": 8.0, "scale_after": 4.0}
    )
    assert row[COL["loss"]] == 2.0 and row[COL["grad_norm"]] == 3.0
    assert row[COL["scaler_skipped"]] == 1.0 and row[COL["loss_nonfinite"]] == 0.0
    assert math.isnan(row[COL["param_fingerprint"]])


def test_phases_and_statuses_are_their_names_and_their_file_codes():
    assert PHASES == ("forward", "backward", "optimizer", "other")
    assert STATUSES == ("finite", "producer", "propagator", "raised", "exempt")
    assert [p.code for p in Phase] == [0, 1, 2, 3]
    assert OpStatus.EXEMPT.code == 4 and STATUSES[OpStatus.EXEMPT.code] is OpStatus.EXEMPT
    out = {"phase": Phase.BACKWARD, "status": OpStatus.PRODUCER}
    assert json.dumps(out) == '{"phase": "backward", "status": "producer"}'
    assert f"{Phase.OPTIMIZER} {OpStatus.RAISED:>8}" == "optimizer   raised"
    assert str(Phase.OTHER) == "other" and Phase.FORWARD == "forward"


def test_a_note_is_its_text_and_has_a_kind():
    n = Note("the replay differs", NoteKind.NONDETERMINISM)
    assert n == "the replay differs" and json.dumps([n]) == '["the replay differs"]'
    assert note_kind(n) is NoteKind.NONDETERMINISM and note_kind("plain") is NoteKind.GENERAL


def test_frames_go_through_the_writer_process_into_the_file(tmp_path):
    """A step sent as parts and one sent whole read back the same; the health row lands."""
    path = str(tmp_path / "run.h5")
    client = WriterClient().create(
        path,
        run_id="c" * 32,
        meta={"config": {}},
        sources={},
        steps=RingSpec(4, 4096, 4096),
        snapshots=RingSpec(2, 4096, 4096),
        health_slots=8,
    )
    batch = np.arange(1000, dtype=np.float32)
    parts, mlen = pack_parts({"step": 0, "batch": batch})
    whole, wlen = pack_parts({"step": 1, "batch": batch})
    row = np.full(len(HEALTH_COLUMNS), np.nan)
    row[COL["loss"]] = 0.5
    client.commit(
        steps=[StepFrame(0, parts, mlen), StepFrame(1, np.concatenate(whole), wlen)],
        health=[HealthFrame(0, row), HealthFrame(1, row)],
        last_step=1,
    )
    client.close()
    with open_recording(path) as rec:
        assert rec.steps().tolist() == [0, 1]
        for t in (0, 1):
            assert np.array_equal(rec.read_step(t)["batch"], batch)
        assert rec.health()["loss"].tolist() == [0.5, 0.5]


@pytest.mark.parametrize("name", ["recording_v1.h5", "recording_v2.h5"])
def test_run_meta_reads_archived_files_and_writes_their_json_back_unchanged(name):
    """The recorder now builds RunMeta and sends ``to_json()``: for the metadata of a file the
    previous release wrote, that is the same JSON, key order included (the blob's bytes)."""
    from replay.store.contracts import RunMeta

    with open_recording(str(ROOT / "tests" / "data" / name)) as rec:
        meta = rec.run_meta
        assert meta.model.params and meta.model.modules
        first = meta.model.params[0]
        assert isinstance(first.shape, tuple) and first.dtype == rec.meta["model"]["params"][0][2]
        assert sum(p.numel for p in meta.model.params) > 0
        if name == "recording_v2.h5":  # the current format (v1 files lack "objects")
            assert json.dumps(RunMeta.from_json(rec.meta).to_json()) == json.dumps(rec.meta)


def test_rss_is_read_at_most_every_rss_every_seconds(monkeypatch):
    """Memory is read from /proc at most every RSS_EVERY: a fast loop's steps in between repeat
    the last reading (reading it right after the backward cost more than the rest of the row)."""
    import replay.capture.health as health

    clock = [1000.0]
    monkeypatch.setattr(health.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(health, "_last_rss", [-math.inf, math.nan])
    first = health_row({"loss": 1.0})[COL["rss"]]
    assert first > 0
    ballast = np.ones(64 << 20, np.uint8)  # 64 MiB more resident
    clock[0] += health.RSS_EVERY / 2
    assert health_row({"loss": 1.0})[COL["rss"]] == first
    clock[0] += health.RSS_EVERY
    assert health_row({"loss": 1.0})[COL["rss"]] >= first + ballast.nbytes * 0.9
