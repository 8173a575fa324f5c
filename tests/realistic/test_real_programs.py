"""The record/replay contract on programs shaped like the ones people run (tests/realistic/programs):
each is recorded in a subprocess, as its author would run it, and replayed with the real CLI from
another working directory. Healthy ones must replay bitwise; broken ones must be refused or
explained with the right cause."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import replay_cli, run_env, run_py, run_until_checked

PROGRAMS = Path(__file__).with_name("programs")


def record(tmp: Path, program: str, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    """Copy ``program`` into ``tmp`` and run it there with ``args``; the run writes run.h5."""
    script = tmp / program
    shutil.copy(PROGRAMS / program, script)
    return tmp / "run.h5", run_py(str(script), *args, cwd=tmp, timeout=180)


def replay(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return replay_cli(*args, cwd=cwd)


def assert_bad_data(run: Path, cwd: Path, *, step: int, tensor: str, samples: list[int]) -> None:
    """``replay bisect`` of ``run`` names bad data at ``step``: that batch tensor, those
    samples, reproducibly."""
    d = json.loads(replay("bisect", str(run), "--json", cwd=cwd).stdout)
    assert (d["first_bad_step"], d["cause"]) == (step, "data"), d
    assert [t["name"] for t in d["data"]["tensors"]] == [tensor], d["data"]
    assert d["samples"] == samples and d["reproducible"] is True, d["notes"]


def bisect_json(run: Path, cwd: Path) -> dict:
    """``replay bisect RUN --json`` from ``cwd``, which must exit 0: its report."""
    p = replay("bisect", str(run), "--json", cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def verify_json(run: Path, cwd: Path) -> tuple[int, dict, str]:
    p = replay("verify", str(run), "--json", cwd=cwd)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    return p.returncode, json.loads(p.stdout), p.stderr  # stdout is the JSON alone


def health(run: Path, column: str) -> np.ndarray:
    with h5py.File(run, "r", swmr=True) as f:
        cols = json.loads(f["health"].attrs["columns"])
        steps = f["health/step"][:]
        values = f["health/values"][:, cols.index(column)]
    order = np.argsort(steps[steps >= 0])
    return values[steps >= 0][order]


def test_argparse_script_parses_the_recorded_arguments_on_replay(tmp_path, elsewhere):
    run, p = record(tmp_path, "argparse_train.py", "--lr", "0.05", "--hidden", "24")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, err = verify_json(run, elsewhere)
    assert "unrecognized arguments" not in err and "usage:" not in err
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 12, v["cause"]
    # The recorded arguments were used: lr 0.05 decayed by StepLR(4, 0.7) outside the step.
    lrs = health(run, "lr")
    assert lrs[0] == 0.05 and lrs[4] == pytest.approx(0.035)
    assert not list(elsewhere.iterdir())  # nothing written where replay ran


def test_nanogpt_shaped_loop_replays_bitwise_and_its_prints_stay_off_the_json(tmp_path, elsewhere):
    run, p = record(tmp_path, "nanogpt_like.py", "max_iters=10")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, err = verify_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 10, v["cause"]
    assert "number of parameters" in err  # the script's print at import went to stderr
    # The lr the loop set outside the step was recorded per step (warmup, then cosine).
    lrs = health(run, "lr")
    assert lrs[0] < lrs[3] and lrs[9] < lrs[4]
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    assert b.returncode == 1, b.stderr[-2000:]  # healthy: nothing to find
    json.loads(b.stdout)


def test_gradients_pending_across_rec_step_calls_are_in_the_snapshot(tmp_path, elsewhere):
    run, p = record(tmp_path, "accumulate_across_steps.py", "run.h5")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, _ = verify_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 12, v["cause"]
    from replay.store import open_recording

    with open_recording(run) as rec:
        # The optimizer steps after odd iterations: before step 3 a micro-batch is pending.
        pending = rec.read_snapshot(3)["grads"]
        clean = rec.read_snapshot(6)["grads"]
    assert sorted(pending) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert clean == {}


def test_manual_sgd_without_an_optimizer_replays_with_its_lr_and_hidden_state(tmp_path, elsewhere):
    run, p = record(tmp_path, "manual_sgd_rnn.py", "run.h5")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, _ = verify_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 12, v["cause"]
    assert list(health(run, "lr")) == [20.0] * 4 + [5.0] * 4 + [1.25] * 4
    info = replay("info", str(run), cwd=elsewhere)
    assert info.returncode == 0, info.stderr
    # Was: "optimizer.step() ran at none of 12 recorded steps", an error for a loop that has no
    # optimizer to step (pytorch/examples' word_language_model updates its weights by hand)
    doc = replay("doctor", str(run), "--json", cwd=elsewhere)
    assert doc.returncode in (0, 1) and "optimizer_never_stepped" not in doc.stdout, doc.stdout


def test_a_script_that_trains_at_import_is_refused_not_run(tmp_path, elsewhere):
    run, p = record(tmp_path, "trains_at_import.py", "run.h5")
    assert p.returncode == 0 and run.exists(), p.stderr[-2000:]
    before = {q.name: q.stat().st_mtime_ns for q in tmp_path.iterdir()}
    v = replay("verify", str(run), cwd=elsewhere)
    assert v.returncode == 4, v.stderr
    err = [ln for ln in v.stderr.splitlines() if ln.startswith("replay: error:")]
    assert len(err) == 1 and 'if __name__ == "__main__":' in err[0]
    assert "Traceback" not in v.stderr
    after = {q.name: q.stat().st_mtime_ns for q in tmp_path.iterdir()}
    assert after == before  # no second recording, the first one untouched
    assert not list(elsewhere.iterdir())


def test_a_global_changed_by_the_loop_is_named_as_state_outside_the_step(tmp_path, elsewhere):
    run, p = record(tmp_path, "global_lr.py", "run.h5")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, _ = verify_json(run, elsewhere)
    assert rc == 1 and v["deterministic"] is False
    cause = v["cause"]
    assert cause["kind"] == "outside_state"
    assert cause["snapshot"] == 4
    assert "model parameters" in [d["object"] for d in cause["differs"]]
    assert "rec.step(batch, name=value)" in cause["hint"]
    text = replay("verify", str(run), cwd=elsewhere).stdout
    assert text.startswith("NOT replayable as recorded: state changed outside the step")


@pytest.mark.slow
def test_a_mean_teachers_ema_the_recorder_was_not_given_is_named_while_it_trains(
    tmp_path, elsewhere
):
    """A timm-shaped loop whose loss reads an EMA of the weights kept in a helper object
    (mean_teacher.py). Was: the self-check and bisect said "state the snapshots do not hold (a
    batch an earlier step prefetched into a global, a counter, a cache)" and left the user to
    find it; now both name ``ema.module``, and giving it to the Recorder as they say makes the
    run replay."""
    script = tmp_path / "mean_teacher.py"
    shutil.copy(PROGRAMS / "mean_teacher.py", script)
    p = run_until_checked(str(script), cwd=tmp_path, timeout=240)
    assert p.returncode != 0 and "NonFiniteLossError" in p.stderr, p.stderr[-2000:]
    warn = [ln for ln in p.stderr.splitlines() if "does NOT replay" in ln]
    assert warn and "ema.module" in warn[0], p.stderr[-3000:]
    assert '"ema_module": ema.module' in warn[0]
    p = replay("bisect", str(tmp_path / "run.h5"), "--json", cwd=elsewhere)
    d = json.loads(p.stdout)
    assert d["first_bad_step"] == 12 and d["reproducible"] is False, p.stderr[-2000:]
    cause = d["divergence_cause"]
    assert cause["kind"] == "outside_state"
    assert cause["suspects"] == ["ema.module (Net, read by train_step)"], cause
    # as told: the EMA among the objects
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    shutil.copy(PROGRAMS / "mean_teacher.py", fixed / "mean_teacher.py")
    p = run_until_checked(str(fixed / "mean_teacher.py"), "--give-ema", cwd=fixed, timeout=240)
    assert "does NOT replay" not in p.stderr, p.stderr[-3000:]
    p = replay("bisect", str(fixed / "run.h5"), "--json", cwd=elsewhere)
    d = json.loads(p.stdout)
    assert d["first_bad_step"] == 12 and d["reproducible"] is True, p.stderr[-2000:]
    assert d["cause"] == "data" and d["samples"] == [3], {k: d[k] for k in ("cause", "samples")}


def test_a_reinforce_loop_whose_step_plays_its_episode_bisects_to_std_of_one_return(
    tmp_path, elsewhere
):
    """reinforce.py (pytorch/examples reinforcement_learning): no loader, each step plays an
    episode seeded by the step's batch and learns from it. Was: refused at Recorder() since
    ``episode(seed)`` had no parameter named 'batch'. The episode that ends after one move has
    one return, whose std is NaN."""
    run, p = record(tmp_path, "reinforce.py", "run.h5")
    assert p.returncode == 3 and "loss is nan at step 17" in p.stderr, p.stderr[-2000:]
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert (d["first_bad_step"], d["kind"], d["cause"]) == (17, "nonfinite", "op"), d["notes"]
    assert (d["op"], d["phase"], d["made"]) == ("aten::std", "forward", "NaN")
    assert d["source"]["function"] == "episode" and d["reproducible"] is True
    # torch's std() warning, raised in the traced op, names the program's line, not the tracer
    assert "replay/trace/mode.py" not in b.stderr, b.stderr[-2000:]


@pytest.mark.slow
def test_an_environments_own_generator_is_named_while_it_trains(tmp_path, elsewhere):
    """The same loop with the environment's generator seeded once for the run, as gymnasium's
    ``env.reset(seed=...)`` does: a replay from a snapshot cannot redo its draws. Was: the
    self-check said so generically, and bisect called two replays that disagree
    non-determinism; both now name ``env.np_random`` and say to seed it from the batch."""
    script = tmp_path / "reinforce.py"
    shutil.copy(PROGRAMS / "reinforce.py", script)
    p = run_until_checked(str(script), "run.h5", "--env-rng", "global", cwd=tmp_path,
                          timeout=180)  # fmt: skip
    warn = [ln for ln in p.stderr.splitlines() if "does NOT replay" in ln]
    assert warn and "env.np_random (random generator numpy Generator" in warn[0], p.stderr[-3000:]
    assert "seed env.np_random from the step's batch" in warn[0]
    b = replay("bisect", str(tmp_path / "run.h5"), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert d["first_bad_step"] == 17 and d["reproducible"] is False, b.stderr[-2000:]
    cause = d["divergence_cause"]
    assert cause["kind"] == "outside_state", cause
    assert cause["suspects"][0].startswith("env.np_random (random generator"), cause


def test_a_dqn_loop_handing_its_sampled_minibatch_to_the_step_bisects_to_the_bad_transition(
    tmp_path, elsewhere
):
    """dqn.py (PyTorch's DQN tutorial): the loop plays a move, pushes the transition into its
    replay memory and hands a minibatch sampled from it to the step (a list of transitions).
    The transition kept for move 70 holds a NaN; the first minibatch that samples it is bad.
    Was: the samples were looked for along dim 0 of each transition's tensors (size 1), and
    sample 0 was named."""
    run, p = record(tmp_path, "dqn.py", "run.h5")
    assert p.returncode == 3 and "loss is nan at step 55" in p.stderr, p.stderr[-2000:]
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert (d["first_bad_step"], d["kind"], d["cause"]) == (55, "nonfinite", "data"), d["notes"]
    assert [t["name"] for t in d["data"]["tensors"]] == ["batch[5].state"]
    assert d["samples"] == [5] and d["reproducible"] is True  # the list's items are its samples


@pytest.mark.slow
def test_a_dqn_step_sampling_the_replay_memory_itself_names_the_memory_while_it_trains(
    tmp_path, elsewhere
):
    """The tutorial's own shape: ``optimize_model()`` samples the global replay memory, which
    the loop fills between steps. A replay from a snapshot finds it empty and raises. Was: the
    self-check and bisect gave the general advice about build_fn (there is none: the program
    is re-entered); both now name ``memory.memory`` and say to sample in the loop."""
    script = tmp_path / "dqn.py"
    shutil.copy(PROGRAMS / "dqn.py", script)
    p = run_until_checked(str(script), "run.h5", "--shape", "memory", cwd=tmp_path,
                          timeout=180)  # fmt: skip
    assert p.returncode == 3, p.stderr[-2000:]
    warn = [ln for ln in p.stderr.splitlines() if "does NOT replay" in ln]
    assert warn and "memory.memory (deque, empty here, read by optimize_model)" in warn[0], warn
    assert "sample what the step takes from memory.memory in the training loop" in warn[0]
    b = replay("bisect", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert b.returncode not in (0, 1) and "Traceback" not in b.stderr, b.stderr[-2000:]
    said = b.stderr.strip().splitlines()[-1]
    assert "raised ValueError" in said and "memory.memory (deque" in said, said
    assert "build_fn" not in said


def test_a_dqn_step_that_waits_for_its_memory_to_fill_names_the_memory_where_it_differs(
    tmp_path, elsewhere
):
    """The tutorial's own loop: the step after every move, returning at once while the memory
    holds less than a minibatch. Steps replayed from a later snapshot differ (their
    memory is empty) while two replays agree. Was: "something outside step_fn changes what
    the step reads", naming nothing; now the memory, and to sample in the loop.

    Was, too: the self-check passed this run (its first steps are no-ops that replay). It now
    also replays steps from a snapshot taken once training is under way (step 60 here:
    ``keep_snapshots`` x ``snapshot_every``), and says so while the run trains."""
    script = tmp_path / "dqn.py"
    shutil.copy(PROGRAMS / "dqn.py", script)
    p = run_until_checked(str(script), "run.h5", "--shape", "tutorial", "--nan-at", "1000",
                          cwd=tmp_path, timeout=180)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    warn = [ln for ln in p.stderr.splitlines() if "does NOT replay" in ln]
    assert len(warn) == 1, p.stderr[-2000:]
    assert "the self-check (steps 60..63, from a snapshot taken once training was under way; " \
        "the first steps, 0..3, replayed) found outside_state" in warn[0], warn[0]  # fmt: skip
    assert "memory.memory (deque, empty here" in warn[0], warn[0]
    run = tmp_path / "run.h5"
    rc, v, err = verify_all_json(run, elsewhere)
    assert rc == 1 and v["cause"]["kind"] == "outside_state", (v.get("cause"), err[-2000:])
    assert any(s.startswith("memory.memory (deque") for s in v["cause"]["suspects"]), v["cause"]
    assert "sample what the step takes from memory.memory" in v["cause"]["hint"]


def verify_all_json(run: Path, cwd: Path) -> tuple[int, dict, str]:
    p = replay("verify", str(run), "--all", "--json", cwd=cwd)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


def test_a_step_needing_an_object_build_fn_does_not_make_is_named_as_raised(tmp_path, elsewhere):
    run, p = record(tmp_path, "global_object.py", "run.h5")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, _ = verify_json(run, elsewhere)
    assert rc == 1
    cause = v["cause"]
    assert cause["kind"] == "raised" and cause["exception"]["type"] == "AttributeError"
    assert "neither its batch nor the objects the Recorder holds" in cause["hint"]


def test_real_non_determinism_is_told_apart_from_drifted_state(tmp_path, elsewhere):
    run, p = record(tmp_path, "nondeterministic.py", "run.h5")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, _ = verify_json(run, elsewhere)
    assert rc == 1 and v["cause"]["kind"] == "nondeterministic", v["cause"]
    assert "two replays of step 0" in v["cause"]["summary"]


def test_dataloader_workers_forked_each_epoch_replay_bitwise(tmp_path, elsewhere):
    run, p = record(tmp_path, "dataloader_workers.py", "run.h5", "--steps", "30")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, _ = verify_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 15, v["cause"]


def test_sigterm_to_the_process_group_with_dataloader_workers_dies_of_sigterm_file_intact(
    tmp_path, elsewhere
):
    """Regression: SIGTERM to the whole group (a scheduler, ``timeout``, ``kill -- -PGID``) killed
    the DataLoader's workers too; torch's SIGCHLD handler raised into the Recorder's SIGTERM
    handler while it closed the file, and the run ended with exit 1 and a traceback through
    replay's code instead of dying of SIGTERM as it does without replay."""
    shutil.copy(PROGRAMS / "dataloader_workers.py", tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "dataloader_workers.py", "run.h5", "--steps", "100000", "--sleep", "0.01"],
        cwd=tmp_path,
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a job is
    )
    last = -1
    for line in proc.stdout:
        last = int(line.split()[1])
        if last >= 40:
            break
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    last = max([last] + [int(ln.split()[1]) for ln in out.splitlines()])
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 60  # the writer process (SIGTERM ignored) commits, then exits
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("a process of the run's group outlived it")
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert int(f["health/step"][:].max()) >= last  # every step the run printed is kept
    rc, v, _ = verify_json(tmp_path / "run.h5", elsewhere)
    assert rc == 0 and v["deterministic"] is True, v["cause"]


@pytest.mark.slow
def test_preflight_says_replayable_for_a_good_run_and_names_the_cause_for_a_bad_one(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    shutil.copy(PROGRAMS / "nanogpt_like.py", good)
    shutil.copy(PROGRAMS / "global_lr.py", bad)
    ok = replay("preflight", "--", sys.executable, "nanogpt_like.py", "max_iters=50", cwd=good)
    assert ok.returncode == 0, (ok.stdout, ok.stderr[-2000:])
    assert "REPLAYABLE" in ok.stdout
    assert "iter 8:" not in ok.stderr and "iter 7:" in ok.stderr  # stopped after 8 steps
    assert not (good / "run.h5").exists()  # the script's own path was left alone
    no = replay("preflight", "--json", "--", sys.executable, "global_lr.py", cwd=bad)
    assert no.returncode == 1, no.stderr[-2000:]
    rep = json.loads(no.stdout)
    assert rep["replayable"] is False and rep["reason"] == "outside_state"
    assert rep["cause"]["differs"][0]["object"] == "model parameters"


def test_preflight_of_a_command_without_a_recorder_says_so(tmp_path):
    p = replay("preflight", "--", sys.executable, "-c", "print('hello')", cwd=tmp_path)
    assert p.returncode == 1
    assert "created no replay.Recorder" in p.stdout


@pytest.mark.parametrize("flavour", [[], ["--reentrant"]], ids=["non_reentrant", "reentrant"])
def test_an_lm_trained_with_activation_checkpointing_is_bisected_and_its_recompute_placed(
    tmp_path, elsewhere, flavour
):
    """checkpointed_lm.py (HF's gradient checkpointing, torchtitan's AC): every block's forward
    runs again inside the backward. The culprit is the first producer, in the forward; and the
    recomputed forward's ops, which run inside the backward, are in their own block at their own
    lines. Was: the model, at the checkpoint(...) line; and, with use_reentrant=True, the
    backward of every block in no module at no line."""
    from replay.store.forensics import ForensicsReader

    run, p = record(tmp_path, "checkpointed_lm.py", "run.h5", *flavour)
    assert p.returncode == 3 and "loss is nan at step 12" in p.stderr, p.stderr[-2000:]
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert (d["first_bad_step"], d["cause"], d["op"], d["phase"], d["module"]) == (
        12, "op", "aten::mul", "forward", "blocks.1"
    ), d  # fmt: skip
    assert d["source"]["code"] == "scores = scores * temperature" and d["reproducible"] is True
    with ForensicsReader.open(tmp_path / "run.forensics.h5") as f:
        rows = [f.op_row(i) for i in range(f.n_ops)]
    recomputed = [r for r in rows if r["phase"] == "backward" and r["op"] == "aten::_softmax"]
    assert len(recomputed) == 3, [(r["op"], r["module"]) for r in recomputed]
    assert {r["module"] for r in recomputed} == {"blocks.0", "blocks.1", "blocks.2"}
    assert {r["source"].split(":")[1] for r in recomputed} == {"43"}  # the softmax's own line
    backward = [r for r in rows if r["op"] == "aten::softmax_backward_data"] or [
        r for r in rows if r["op"] == "aten::_softmax_backward_data"
    ]
    assert {r["module"] for r in backward} == {"blocks.0", "blocks.1", "blocks.2"}, backward


def test_a_gradient_penalty_through_a_double_backward_names_sqrt_at_zero_and_the_blank_sample(
    tmp_path, elsewhere
):
    """gradient_penalty_gan.py: the critic's penalty ``sqrt(sum(g ** 2))`` of its input
    gradient, made with ``autograd.grad(create_graph=True)``; a blank real sample makes that
    gradient exactly 0, and sqrt's derivative there is infinite. The failure is recorded one
    step late (the step's loss is finite; its update makes the parameters NaN); the culprit is
    the double backward's division at the penalty's line, and the blank sample is named."""
    run, p = record(tmp_path, "gradient_penalty_gan.py", "run.h5")
    assert p.returncode == 3 and "at step 11" in p.stderr, p.stderr[-2000:]
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert (d["first_bad_step"], d["cause"], d["op"], d["phase"]) == (
        10, "op", "aten::div", "backward"
    ), d  # fmt: skip
    assert "torch.sqrt((grads**2).sum(1))" in d["source"]["code"], d["source"]
    assert d["samples"] == [3] and d["reproducible"] is True, d["notes"]


def test_a_moco_queue_kept_as_plain_attributes_is_named_while_it_trains(tmp_path, elsewhere):
    """moco_queue.py: a queue of keys and its pointer kept as plain attributes of the model are
    in no state_dict, so no snapshot holds them. Was: the self-check and verify said only that
    the step reads state the snapshots do not hold; the recorded model counted as held whole.
    Now both are named, with their module, and what to do; done (register_buffer), the run
    replays bitwise."""
    script = tmp_path / "moco_queue.py"
    shutil.copy(PROGRAMS / "moco_queue.py", script)
    p = run_until_checked(str(script), "run.h5", cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    warn = [ln for ln in p.stderr.splitlines() if "does NOT replay" in ln]
    assert len(warn) == 1, p.stderr[-2000:]
    assert "model.queue (tensor float32[16, 64], kept by MoCo outside its state_dict)" in warn[0]
    assert "model.ptr (number int, kept by MoCo outside its state_dict)" in warn[0]
    assert "register each as a persistent buffer" in warn[0], warn[0]
    _, p = record(tmp_path, "moco_queue.py", "fixed.h5", "--shape", "buffers")
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, err = verify_json(tmp_path / "fixed.h5", elsewhere)
    assert rc == 0 and v["deterministic"] is True, (v.get("cause"), err[-2000:])


def test_dp_sgd_with_per_sample_gradients_from_torch_func_is_traced_and_bisected(
    tmp_path, elsewhere
):
    """dp_sgd.py: per-sample gradients from vmap(grad(...)) (PyTorch's tutorial, Opacus's
    functorch mode). Was: the tracer's module hook measured the module's output, a vmapped
    tensor with no storage of its own; reading it raised inside the traced step ("Cannot access
    data pointer of Tensor that doesn't have storage"), and the trace stopped at its 11th op
    with no verdict. The values under the transform's wrappers are read with it off."""
    run, p = record(tmp_path, "dp_sgd.py", "run.h5")
    assert p.returncode == 3 and "loss is nan at step 8" in p.stderr, p.stderr[-2000:]
    assert_bad_data(run, elsewhere, step=8, tensor="batch[0]", samples=[5])


@pytest.mark.parametrize("how", ["group", "flag"])
def test_gradual_unfreezing_between_steps_replays_across_the_unfreeze(tmp_path, elsewhere, how):
    """gradual_unfreeze.py: the loop unfreezes the backbone at step 21, between two snapshots
    (every 10 steps): ``requires_grad_(True)`` and ``add_param_group`` (``group``), or only
    ``requires_grad`` and the learning rate (``flag``). Neither is in a state_dict. Was: the
    snapshot of step 30 did not fit the replayed optimizer ("loaded state dict has a different
    number of parameter groups", and the self-check said so while the run trained), a replay
    carried across step 21 stopped ("the recording has 2 param groups"), and the flag's replay
    from step 20 trained a frozen backbone: not reproducible. Snapshots now hold which
    parameters each group holds and which are frozen, and a step record the requires_grad of
    every parameter where it changed."""
    run, p = record(tmp_path, "gradual_unfreeze.py", "run.h5", "--how", how)
    assert p.returncode == 3 and "loss is nan" in p.stderr, p.stderr[-2000:]
    rc, v, err = verify_all_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True, (v.get("cause"), err[-2000:])
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert d["cause"] == "op" and d["reproducible"] is True, (d["notes"], b.stderr[-2000:])
    if how == "flag":  # replayed from the snapshot before the unfreeze, through it
        assert (d["first_bad_step"], d["snapshot"]) == (25, 20), d


def test_sparse_embedding_gradients_are_traced_and_the_bad_label_named(tmp_path, elsewhere):
    """sparse_embeddings.py (DLRM-shaped): EmbeddingBag(sparse=True) under SparseAdam. Was:
    the tracer copied each op's output to numpy, which a sparse gradient cannot be ("can't
    convert Sparse layout tensor to numpy"): the traced backward raised, and bisect named no
    cause and two samples. A sparse tensor is measured by the values it stores."""
    run, p = record(tmp_path, "sparse_embeddings.py", "run.h5")
    assert p.returncode == 3 and "loss is nan at step 12" in p.stderr, p.stderr[-2000:]
    assert_bad_data(run, elsewhere, step=12, tensor="batch[2]", samples=[5])


@pytest.mark.parametrize(
    ("kind", "tensor"),
    [("dataclass", "batch.features"), ("encoding", "batch.data['features']"), ("graph", "batch.x")],
)
def test_a_batch_that_is_an_object_replays_and_its_bad_sample_is_named(
    tmp_path, elsewhere, kind, tensor
):
    """object_batches.py: a dataclass batch, a UserDict (BatchEncoding's shape), a plain object
    holding tensors (torch_geometric's Data's). Was: each stored as opaque, so no step of the
    run replayed ("'Opaque' object has no attribute 'x'"), and the self-check and bisect
    blamed state the step reads outside its batch. Now kept by their attributes and made
    again as their own class, so the step's own methods work on replay."""
    run, p = record(tmp_path, "object_batches.py", "run.h5", "--kind", kind)
    assert p.returncode == 3 and "loss is nan at step 9" in p.stderr, p.stderr[-2000:]
    samples = [4] if kind != "graph" else None  # (message passing mixes the samples)
    d = json.loads(replay("bisect", str(run), "--json", cwd=elsewhere).stdout)
    assert (d["first_bad_step"], d["cause"], d["reproducible"]) == (9, "data", True), d
    assert [t["name"] for t in d["data"]["tensors"]] == [tensor], d["data"]
    if samples is not None:
        assert d["samples"] == samples, d["notes"]
