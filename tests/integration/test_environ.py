"""A program that reads an environment variable into its step replays otherwise in a shell
without it: the recording keeps each variable's keyed digest (never its value), and verify names
the variable instead of only saying that state changed outside the step."""

import json
import textwrap

from replay.capture.environ import environ_differences, environ_digests
from tests.conftest import replay_cli, replay_json, run_py

PROGRAM = textwrap.dedent(
    """
    import os, sys
    import torch
    import replay

    SCALE = float(os.environ.get("TRAIN_LOSS_SCALE", "1.0"))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        opt.zero_grad()
        loss = model(batch).pow(2).mean() * SCALE
        loss.backward()
        opt.step()
        return loss

    with replay.Recorder(sys.argv[1], objects={"model": model, "optimizer": opt},
                         step_fn=step, snapshot_every=4, self_check=False) as rec:
        for _ in range(6):
            rec.step(torch.randn(8, 4))
    """
)
SECRET = "hunter2-s3cr3t-t0ken"


def test_a_variable_the_step_reads_is_named_when_the_replay_runs_without_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    run = str(tmp_path / "run.h5")
    env = {"TRAIN_LOSS_SCALE": "0.5", "API_TOKEN": SECRET}
    p = run_py(str(script), run, cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    # the value of no variable is in the file, only its name and keyed digest
    raw = (tmp_path / "run.h5").read_bytes()
    assert SECRET.encode() not in raw and b"API_TOKEN" in raw

    # the same environment: bitwise, and nothing said about variables
    rc, v, err = replay_json("verify", run, env=env)
    assert rc == 0 and v["deterministic"] is True, err[-2000:]
    assert "environment differs" not in err

    # without it: the divergence's cause names the variable (and only it), on stderr too
    rc, v, err = replay_json("verify", run, env={"API_TOKEN": SECRET})
    assert rc != 0 and v["deterministic"] is False, err[-2000:]
    cause = v["cause"]
    assert cause["changed_environ"] == ["TRAIN_LOSS_SCALE (set in the recorded run, unset here)"]
    assert "TRAIN_LOSS_SCALE" in cause["summary"] and "environment variables" in cause["hint"]
    assert "the environment differs from the recording's: TRAIN_LOSS_SCALE" in err

    # another value: said as such; info says it without replaying anything
    p = replay_cli("info", run, env={"TRAIN_LOSS_SCALE": "0.7", "API_TOKEN": SECRET})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "differ here: TRAIN_LOSS_SCALE (another value here)" in p.stdout, p.stdout
    p = replay_cli("info", run, env=env)
    assert "kept as keyed digests, the same here" in p.stdout, p.stdout


def test_bisect_of_a_failure_the_environment_made_says_so_where_it_says_not_reproducible(
    tmp_path,
):
    """Was: "reproducible  NO: suspect non-determinism, hardware, or state no snapshot holds"
    for a run whose loss went inf through a variable the replay ran without."""
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    run = str(tmp_path / "run.h5")
    p = run_py(str(script), run, cwd=tmp_path, env={"TRAIN_LOSS_SCALE": "1e39"}, timeout=120)
    assert p.returncode != 0 and "NonFiniteLossError" in p.stderr, p.stderr[-2000:]
    p = replay_cli("bisect", run)
    assert "reproducible  NO: the environment differs from the recorded run's" in p.stdout, (
        p.stdout,
        p.stderr[-2000:],
    )
    assert "TRAIN_LOSS_SCALE (set in the recorded run, unset here)" in p.stdout
    p = replay_cli("bisect", run, env={"TRAIN_LOSS_SCALE": "1e39"})
    assert "reproducible  yes" in p.stdout and "environment" not in p.stdout, p.stdout


def test_environment_digests_hold_no_value_and_compare_only_under_the_same_key():
    key, other = b"k" * 32, b"o" * 32
    env = {"LR": "0.1", "TOKEN": SECRET, "PWD": "/x", "SLURM_JOB_ID": "7", "REPLAY_HOME": "/h"}
    kept = environ_digests(key, env)
    assert set(kept["digests"]) == {"LR", "TOKEN"}  # a shell's, a launcher's, replay's: never
    assert SECRET not in json.dumps(kept) and "0.1" not in json.dumps(kept)
    assert environ_digests(None, env) == {}  # unsigned: nothing kept
    assert environ_differences(kept, key, env) == []
    assert environ_differences(kept, key, {**env, "PWD": "/y", "SLURM_JOB_ID": "8"}) == []
    assert environ_differences(kept, key, {"LR": "0.2", "NEW": "1"}) == [
        "LR (another value here)",
        "NEW (set here, not in the recorded run)",
        "TOKEN (set in the recorded run, unset here)",
    ]
    assert environ_differences(kept, other, {}) is None  # another user's key: cannot be told
    assert environ_differences(None, key, env) is None  # an older recording


def test_a_crafted_recordings_variable_names_never_reach_the_terminal():
    key = b"k" * 32
    kept = environ_digests(key, {})
    kept["digests"] = {"\x1b]0;pwned\x07": "0" * 16, "A" * 500: "0" * 16, "OK_NAME": "0" * 16}
    assert environ_differences(kept, key, {}) == ["OK_NAME (set in the recorded run, unset here)"]
    kept["digests"] = {f"V{i}": "0" * 16 for i in range(100_000)}
    assert environ_differences(kept, key, {}) is None  # not compared: no shell holds that many
    many = {f"V{i}": "x" for i in range(9)}
    assert environ_differences(environ_digests(key, many), key, {})[-1] == "and 4 more"
