"""Forensics sidecar: a traced step round-trips; 200,000 ops page by row range; foreign files
are refused with a clear error."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from replay.store.forensics import (
    OPS_COLUMNS,
    STATS_COLUMNS,
    ForensicsReader,
    NotAForensicsFile,
    write_forensics,
)
from replay.store.safefile import staging_name
from replay.trace import trace_step
from replay.trace.stats import Stats


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 4)

    def forward(self, x):
        return torch.log(torch.softmax(self.proj(x) * 1e4, dim=-1))


def step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.nll_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def test_the_tracers_stats_row_is_in_the_files_column_order():
    # The tracer appends Stats rows as they are: the /ops/stats column is their stack.
    assert Stats._fields == STATS_COLUMNS


def test_traced_step_round_trips(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Head())
    r = trace_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        step,
        (torch.randn(16, 8) * 10, torch.randint(0, 4, (16,))),
    )
    path = tmp_path / "run.forensics.h5"
    r.write(path, run_id="run-1", step=42)
    assert not os.path.exists(staging_name(str(path)))
    with ForensicsReader.open(path) as f:
        assert (f.run_id, f.step, f.n_ops) == ("run-1", 42, r.n_ops)
        v = f.verdict
        assert v["step"] == 42 and v["op"] == "aten::log" and v["module"] == "1"
        assert v["output"]["stats"]["neginf"] > 0 and v["output"]["stats"]["min"] != "nan"
        row = f.op_row(v["op_index"])
        assert (row["op"], row["phase"], row["status"], row["module"]) == (
            "aten::log",
            "forward",
            "producer",
            "1",
        )
        assert row["source"] == f.strings("locations")[r.ops["source"][v["op_index"]]]
        assert row["stack"][-1] == row["source"]
        cols = f.ops_columns(0, f.n_ops)
        for k in OPS_COLUMNS:
            np.testing.assert_array_equal(cols[k], r.ops[k])
        mods = {m["name"]: m for m in f.modules()}
        assert mods["1"]["kind"] == "Head" and mods["1.proj"]["parent"] == list(mods).index("1")
        assert mods["1.proj"]["n_ops"] > 0
        params = {p["name"]: p for p in f.params()}
        assert params["0.weight"]["has_grad"] and params["0.weight"]["grad_nan"] > 0
        mem = f.memory()
        assert mem["peak_bytes"] > 0 and 0 <= mem["peak_op"] < f.n_ops and mem["largest"]
        src = f.sources()
        file, line, _ = row["source"].rsplit(":", 2)
        assert "torch.log" in src[file]["lines"][line]
        assert f.batch()["batch_size"] == 16


def synthetic_tables(n: int) -> dict:
    rng = np.random.default_rng(0)
    ops = {
        name: (np.arange(n).astype(dt) if not tail else rng.standard_normal((n, *tail)).astype(dt))
        for name, (dt, tail) in OPS_COLUMNS.items()
    }
    ops["name"] = (np.arange(n) % 3).astype(np.int32)
    for k in ("module", "source", "stack", "node", "inputs", "outputs"):
        ops[k] = np.full(n, -1, np.int32)
    ops["phase"] = ops["status"] = np.zeros(n, np.uint8)
    ops["stats"][7, 0] = np.nan
    empty = {"name": np.zeros(0, np.int32)}
    from replay.store.forensics import MODULE_COLUMNS, PARAM_COLUMNS

    return {
        "verdict": {"kind": "none", "notes": [float("inf")]},
        "ops": ops,
        "strings": {"ops": ["aten::a", "aten::b", "aten::c"]},
        "modules": {k: np.zeros(0, v) for k, v in MODULE_COLUMNS.items()} | empty,
        "params": {k: np.zeros(0, v) for k, v in PARAM_COLUMNS.items()},
        "memory": {"peak_bytes": 0, "peak_op": -1, "largest": []},
        "sources": {},
        "batch": {"batch_size": None, "leaves": [], "culprits": []},
    }


def test_200k_ops_read_by_row_ranges(tmp_path):
    n = 200_000
    tables = synthetic_tables(n)
    path = tmp_path / "big.forensics.h5"
    write_forensics(path, run_id="r", step=1, tables=tables)
    with h5py.File(path) as h:
        assert h["ops/stats"].chunks[0] == 4096
        assert h["ops"].attrs["encoding-type"] == "op-table"
    with ForensicsReader.open(path) as f:
        assert f.n_ops == n and f.verdict["notes"] == ["inf"]
        page = f.ops_columns(150_000, 150_050)
        np.testing.assert_array_equal(page["mem_bytes"], np.arange(150_000, 150_050))
        np.testing.assert_array_equal(page["hist"], tables["ops"]["hist"][150_000:150_050])
        assert f.ops_columns(n - 5, n + 100)["phase"].shape == (5,)
        assert np.isnan(f.op_row(7)["stats"]["min"]) and f.op_row(199_999)["op"] == "aten::b"
        with pytest.raises(IndexError):
            f.op_row(n)


def test_foreign_files_are_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as h:
        h.attrs["format"] = "replay-recording"
    with pytest.raises(NotAForensicsFile, match="does not look like a forensics sidecar"):
        ForensicsReader.open(other)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not an HDF5 file"):
        ForensicsReader.open(text)


def test_string_tables_are_json_and_columns_must_agree(tmp_path):
    tables = synthetic_tables(10)
    write_forensics(tmp_path / "a.h5", run_id="r", step=1, tables=tables)
    with h5py.File(tmp_path / "a.h5") as h:
        assert json.loads(h["strings/ops"][()].tobytes()) == ["aten::a", "aten::b", "aten::c"]
    tables["ops"]["time_ns"] = tables["ops"]["time_ns"][:5]
    with pytest.raises(ValueError, match="differ in length"):
        write_forensics(tmp_path / "b.h5", run_id="r", step=1, tables=tables)


@pytest.mark.parametrize("planted", ["tmp_symlink", "sidecar_fifo"])
def test_planted_link_or_fifo_at_the_sidecar_was_written_through(tmp_path, planted):
    """The sidecar bisect writes beside a recording follows the recorder's rule: only regular
    files it created (issue 32, item 2)."""
    import os

    from replay.store.safefile import UnsafePath

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Head())
    r = trace_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        step,
        (torch.randn(16, 8) * 10, torch.randint(0, 4, (16,))),
    )
    path = tmp_path / "run.forensics.h5"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    if planted == "tmp_symlink":
        os.symlink(victim, staging_name(str(path)))
    else:
        os.mkfifo(path)
    with pytest.raises(UnsafePath):
        r.write(path, run_id="run-1", step=42)
    assert victim.read_text() == "precious"
    assert os.path.islink(staging_name(str(path))) or not os.path.isfile(path)


def test_a_sidecar_written_before_the_closure_column_reads_it_as_none(tmp_path):
    import h5py

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    r = trace_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        step,
        (torch.randn(16, 8), torch.randint(0, 4, (16,))),
    )
    path = tmp_path / "run.forensics.h5"
    r.write(path, run_id="run-1", step=1)
    with h5py.File(path, "a") as f:  # as an older writer left it
        del f["ops/closure"]
    with ForensicsReader.open(path) as f:
        assert f.n_ops == r.n_ops > 0
        assert (f.ops_columns(0, f.n_ops)["closure"] == -1).all()
        assert f.op_row(0)["closure"] == -1
        assert f.ops_columns(0, 3, ("phase",))["phase"].tolist() == r.ops["phase"][:3].tolist()


@pytest.mark.parametrize(
    ("axes", "samples", "ok"),
    [
        ([0, 1], [[1, 5]], True),  # a list of micro-batches: [micro-batch, row]
        ([0], [3], True),
        (None, [3], True),  # written before sample_axes
        ([0], [[1, 5]], False),
        ([0, 1], [1], False),
        ([0, 1], [[1, -5]], False),
        ([0, 1, 2], [[1, 5]], False),
        ("0", [3], False),
    ],
)
def test_a_verdict_of_micro_batch_row_pairs_is_read_not_called_damaged(tmp_path, axes, samples, ok):
    """Was: the reader took only plain indices, so a sidecar whose samples were [micro-batch,
    row] pairs (open_clip's list of micro-batches, a stacked [M, B] batch) was "damaged": the
    TUI and the report showed no forensics for the run bisect had just traced."""
    from tests.untrusted.corpus import sidecar_tables

    tables = sidecar_tables("run-1")
    tables["verdict"].update(sample_axes=axes, samples=samples)
    path = tmp_path / "run.forensics.h5"
    write_forensics(path, run_id="run-1", step=10, tables=tables)
    if not ok:
        with pytest.raises(NotAForensicsFile, match="sample"):
            ForensicsReader.open(path)
        return
    with ForensicsReader.open(path) as f:
        assert f.verdict["samples"] == samples
