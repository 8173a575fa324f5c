"""replay verify on a real recorded run; entry-point import rules and their errors."""

import pytest
from recorded_runs import cli, cli_json, record

from replay.reports import VerifyReport


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """Dropout, Adam, a scheduler stepped outside step_fn, gradient clipping; 25 steps."""
    d = tmp_path_factory.mktemp("healthy")
    run, truth = record(d, "healthy", steps=25, every=10)
    return d, run, truth


def test_healthy_run_replays_bitwise(healthy):
    d, run, truth = healthy
    rc, v, err = cli_json("verify", str(run))
    assert rc == 0, err
    assert VerifyReport.from_json(v).to_json() == v  # the report reads back as printed
    assert v["deterministic"] is True and v["window"] == [0, 24] and v["replayed_steps"] == 25
    assert [s["loss"] for s in v["steps"]] == truth["losses"]  # float32 losses, exactly
    assert all(s["match"] and s["compared"] for s in v["steps"])
    assert f"replay: importing {d / 'train.py'}" in err
    assert "changed since" not in err


def test_training_loop_of_the_script_does_not_run_on_import(healthy, tmp_path):
    d, run, _ = healthy
    p = cli("verify", str(run), cwd=tmp_path)
    assert p.returncode == 0
    assert not list(tmp_path.iterdir())  # main() would have written a recording and a truth file


def test_changed_source_warns_with_a_diff(tmp_path):
    run, _ = record(tmp_path, "healthy", steps=12)
    script = tmp_path / "train.py"
    script.write_text(
        script.read_text().replace("    return loss\n", "    return loss  # edited\n")
    )
    p = cli("verify", str(run))
    assert p.returncode == 0, p.stderr  # a comment changes nothing numerically
    assert "changed since it was recorded" in p.stderr
    assert "-    return loss\n+    return loss  # edited" in p.stderr
    assert f"{script} (recorded)" in p.stderr


def test_changed_numerics_show_the_first_divergence(tmp_path):
    run, _ = record(tmp_path, "healthy", steps=12)
    script = tmp_path / "train.py"
    script.write_text(script.read_text().replace("0.01 * pair", "0.02 * pair"))
    rc, v, err = cli_json("verify", str(run))
    assert rc == 1 and v["deterministic"] is False
    fd = v["first_divergence"]
    assert fd["step"] == 0 and fd["column"] == "loss" and fd["abs_diff"] > 0


def test_missing_entry_point_exits_4_naming_the_file_and_the_flag(tmp_path):
    run, _ = record(tmp_path, "healthy", steps=5)
    moved = tmp_path / "moved.py"
    (tmp_path / "train.py").rename(moved)
    for cmd in (("verify",), ("bisect", "--until", "loss > 0")):  # (bisect: a step to replay)
        p = cli(*cmd, str(run))
        assert p.returncode == 4, p.stderr
        assert str(tmp_path / "train.py") in p.stderr and "--entry" in p.stderr
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = cli("verify", str(run), "--entry", f"{moved}:build,train_step")
    assert p.returncode == 0, p.stderr
    assert f"importing {moved}" in p.stderr
    p = cli("verify", str(run), "--entry", f"{moved}:build,no_such_step")
    assert p.returncode == 4 and "no_such_step" in p.stderr


def test_entry_override_by_module_name(healthy, tmp_path):
    d, run, _ = healthy
    (tmp_path / "mytrain.py").write_text((d / "train.py").read_text())
    p = cli("verify", str(run), "--entry", "mytrain:build,train_step", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"importing {tmp_path / 'mytrain.py'}" in p.stderr


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('torch').cuda.is_available()")
def test_cuda_replay_of_a_cpu_recording_warns(healthy):
    _, run, _ = healthy
    p = cli("verify", str(run), "--device", "cuda")
    assert "numerics may differ" in p.stderr
