"""``replay trace RUN.h5 --step N``: any step, healthy or not, traced per op into the sidecar
that the TUI reads (regression: the TUI told users of a healthy run to run `replay bisect`,
which traces nothing on a healthy run)."""

from __future__ import annotations

import json

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
    assert d["step"] == 7 and d["op"] is None and d["window"] == [0, 11]
    with ForensicsReader.open(d["forensics"]) as f:
        assert f.step == 7 and f.n_ops > 20  # forward, backward and Adam's ops of one step
        ops = [f.op_row(i)["op"] for i in range(f.n_ops)]
    assert "aten::addmm" in ops
    outside = replay_cli("trace", str(run), "--step", "99", cwd=tmp_path)
    assert outside.returncode == 2 and "outside the replayable window" in outside.stderr
    assert "Traceback" not in outside.stderr
