"""``replay trace RUN.h5 --step N``: any step, healthy or not, traced per op into the sidecar
that the TUI reads (regression: the TUI told users of a healthy run to run `replay bisect`,
which traces nothing on a healthy run)."""

from __future__ import annotations

import json

from replay.reports import TraceReport
from replay.store.forensics import ForensicsReader
from tests.conftest import SCRIPTS, replay_cli, run_py


def test_a_healthy_step_is_traced_into_the_forensics_file(tmp_path):
    run = tmp_path / "run.h5"
    run_py(
        str(SCRIPTS / "mlp_train.py"),
        str(run),
        "--steps",
        "12",
        "--snapshot-every",
        "5",
        check=True,
    )
    p = replay_cli("trace", str(run), "--step", "7", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert TraceReport.from_json(d).to_json() == d  # the report reads back as printed
    assert d["step"] == 7 and d["op"] is None and d["window"] == [0, 11]
    with ForensicsReader.open(d["forensics"]) as f:
        assert f.step == 7 and f.n_ops > 20  # forward, backward and Adam's ops of one step
        ops = [f.op_row(i)["op"] for i in range(f.n_ops)]
    assert "aten::addmm" in ops
    outside = replay_cli("trace", str(run), "--step", "99", cwd=tmp_path)
    assert outside.returncode == 2 and "outside the replayable window" in outside.stderr
    assert "Traceback" not in outside.stderr


def test_stacks_end_at_the_step_function_not_in_the_replay_command(tmp_path):
    """Regression: every op's stack began with click's frames (``main``, ``invoke`` x3 in
    site-packages), the `replay` command that called the step, above the user's train_step."""
    run = tmp_path / "run.h5"
    run_py(str(SCRIPTS / "mlp_train.py"), str(run), "--steps", "6", check=True)
    p = replay_cli("trace", str(run), "--step", "3", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    with ForensicsReader.open(json.loads(p.stdout)["forensics"]) as f:
        locations = f.strings("locations")
        stacks = [json.loads(s) for s in f.strings("stacks")]
    assert stacks
    for stack in stacks:
        outermost = locations[stack[0]]
        assert outermost.rsplit(":", 2)[0] == str(SCRIPTS / "mlp_train.py"), outermost
    assert not [loc for loc in locations if "click" in loc]
