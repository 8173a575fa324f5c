"""``replay export``: the state before a step as a plain torch checkpoint that the user's own
resume code loads without replay, and from which the recorded steps come out bitwise."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, SCRIPTS, replay_here, run_env, run_py


def _run(*args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` with this checkout and the scripts folder importable."""
    return run_py(*args, env=run_env(SCRIPTS), timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    paths = {
        "healthy": (),
        "bad": ("--bad", "14"),
        "no_sched": ("--no-sched",),
        "bad_no_sched": ("--bad", "14", "--no-sched"),
    }
    for name, flags in paths.items():
        p = _run(str(SCRIPTS / "export_train.py"), str(d / f"{name}.h5"), *flags)
        assert p.returncode == 0, p.stderr[-2000:]
    return d / "healthy.h5", d / "bad.h5", d / "no_sched.h5", d / "bad_no_sched.h5"


# Runs the recorded steps from an exported directory with torch alone: the way a user's resume
# code would, with the loop's own build/step functions. Prints each step's loss as float.hex.
RESUME = textwrap.dedent(
    """
    import json, random, sys
    import numpy as np
    import torch
    import export_train as T

    d, last = sys.argv[1], int(sys.argv[2])
    model, opt, *rest = T.build()
    sched = rest[0] if rest else None
    model.load_state_dict(torch.load(f"{d}/model.pt"))
    opt.load_state_dict(torch.load(f"{d}/optimizer.pt"))
    if sched is not None:
        sched.load_state_dict(torch.load(f"{d}/scheduler.pt"))
    grads = torch.load(f"{d}/grads.pt")
    for name, p in model.named_parameters():
        p.grad = grads.get(name)
    skip = json.load(open(f"{d}/skip.json"))
    start = skip["resume_step"]
    rng = torch.load(f"{d}/rng.pt")
    skipped = {s["step"] for s in skip["skip"]}
    losses = {}
    for it in range(start, last + 1):
        batch = T.batch_for(it)
        if it == start:  # the states the recorder took right before this step
            torch.set_rng_state(rng["torch"])
            kind, keys, pos, has_gauss, gauss = rng["numpy"]
            np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
            version, state, gauss_next = rng["python"]
            random.setstate((version, tuple(state), gauss_next))
        if it in skipped:
            continue
        losses[it] = float(T.train_step(model, opt, batch, it=it)).hex()
        if sched is not None:
            sched.step()
    assert "replay" not in sys.modules, "the resume side imported replay"
    print(json.dumps(losses))
    """
)


def _recorded_losses(run: Path) -> dict[int, str]:
    from replay.store import open_recording

    with open_recording(str(run)) as rec:
        h = rec.health()
        return {int(s): float(v).hex() for s, v in zip(h["step"], h["loss"])}


@pytest.mark.parametrize(
    "run, step",
    [("healthy", 8), ("no_sched", 8), ("no_sched", 11)],  # a snapshot's state, one replayed to
)
def test_an_exported_state_resumes_bitwise_without_replay(tmp_path, runs, run, step):
    healthy = runs[0] if run == "healthy" else runs[2]
    out = tmp_path / "ckpt"
    p = _run(
        "-m", "replay", "export", str(healthy), "--out", str(out), "--step", str(step), "--json"
    )
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert report["step"] == step and report["snapshot"] == 8
    assert report["replayed"] == step - 8 and report["skip"] == []
    files = {"model.pt", "optimizer.pt", "grads.pt", "rng.pt", "skip.json", "README.md"}
    files.add("hparams.json")  # the schedule to resume with, every recorded step from `step` on
    if run == "healthy":
        files.add("scheduler.pt")
    assert set(os.listdir(out)) == files
    schedule = json.loads((out / "hparams.json").read_text())["steps"]
    steps = sorted(map(int, schedule))
    assert steps == list(range(step, steps[-1] + 1)) and steps[-1] >= 20, steps
    (tmp_path / "resume.py").write_text(RESUME)
    flags = ("--no-sched",) if run == "no_sched" else ()
    r = _run(str(tmp_path / "resume.py"), str(out), "20", *flags)
    assert r.returncode == 0, r.stderr[-2000:]
    resumed = {int(k): v for k, v in json.loads(r.stdout).items()}
    recorded = _recorded_losses(healthy)
    assert sorted(resumed) == list(range(step, 21))
    assert resumed == {t: recorded[t] for t in resumed}


def test_a_failed_run_exports_the_last_healthy_snapshot_and_the_step_to_skip(tmp_path, runs):
    _, bad, *_ = runs
    out = tmp_path / "ckpt"
    p = _run("-m", "replay", "export", str(bad), "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    # NaN at step 14: the state right before it cannot be reached (the loop steps its
    # scheduler, which replay does not run), so the snapshot before it, 12, still healthy
    assert report["first_bad"] == 14 and report["step"] == 12 and report["replayed"] == 0
    assert any("scheduler" in n for n in report["notes"]), report["notes"]
    assert report["skip"] == [{"step": 14, "values": {"it": 14}}]
    skip = json.loads((out / "skip.json").read_text())
    assert skip["resume_step"] == 12 and skip["skip"][0]["step"] == 14
    readme = (out / "README.md").read_text()
    assert "optimizer.load_state_dict" in readme and "step 14" in readme
    # Resuming and skipping step 14's batch: the steps before it are the recorded ones, and
    # training goes on with finite losses past the failure.
    (tmp_path / "resume.py").write_text(RESUME)
    r = _run(str(tmp_path / "resume.py"), str(out), "18")
    assert r.returncode == 0, r.stderr[-2000:]
    resumed = {int(k): float.fromhex(v) for k, v in json.loads(r.stdout).items()}
    recorded = _recorded_losses(bad)
    assert [float.fromhex(recorded[t]) for t in (12, 13)] == [resumed[12], resumed[13]]
    assert 14 not in resumed and all(resumed[t] == resumed[t] for t in (15, 16, 17, 18))


def test_a_state_between_snapshots_is_refused_when_the_loop_steps_an_object_itself(tmp_path, runs):
    """The loop steps its scheduler outside the step function, which replay does not run: the
    scheduler's state at step 11 is unknown, so only the snapshots' states can be exported."""
    healthy, *_ = runs
    out = tmp_path / "ckpt"
    p = _run("-m", "replay", "export", str(healthy), "--out", str(out), "--step", "11")
    assert p.returncode == 2, p.stderr
    assert [ln for ln in p.stderr.splitlines() if "error" in ln] == [p.stderr.splitlines()[-1]]
    assert "scheduler" in p.stderr and "8, 12" in p.stderr
    assert not out.exists()


def test_export_never_writes_into_a_directory_that_holds_files(tmp_path, runs):
    healthy, *_ = runs
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    p = _run("-m", "replay", "export", str(healthy), "--out", str(out))
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "not an empty directory" in p.stderr
    assert os.listdir(out) == ["mine.txt"]
    p = _run("-m", "replay", "export", str(healthy), "--out", str(tmp_path / "n"), "--step", "99")
    assert p.returncode == 2 and "outside the replayable window" in p.stderr
    assert not (tmp_path / "n").exists()


def test_a_failed_run_exported_a_scheduled_snapshot_not_the_state_before_the_failure(
    tmp_path, runs
):
    """A run that failed at step 14 with a snapshot at 12 exported resume_step 12 (at 21 with
    snapshot_every=50: resume_step 0). The state right before the failure is replayed from the
    snapshot, each step checked bitwise, and resuming from it is resuming the real run."""
    bad = runs[3]
    out = tmp_path / "ckpt"
    p = _run("-m", "replay", "export", str(bad), "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert report["first_bad"] == 14 and report["step"] == 14, report
    assert report["snapshot"] == 12 and report["replayed"] == 2 and report["verified"] == 2
    assert json.loads((out / "skip.json").read_text())["resume_step"] == 14
    # The snapshot's own state, resumed through 13, reaches the same state: both resumes
    # (skipping step 14's batch) give the same bits at every later step.
    snap = tmp_path / "snap"
    p = _run("-m", "replay", "export", str(bad), "--out", str(snap), "--step", "12")
    assert p.returncode == 0, p.stderr[-2000:]
    (tmp_path / "resume.py").write_text(RESUME)
    losses = []
    for d in (out, snap):
        r = _run(str(tmp_path / "resume.py"), str(d), "18", "--no-sched")
        assert r.returncode == 0, r.stderr[-2000:]
        losses.append({int(k): v for k, v in json.loads(r.stdout).items()})
    from_failure, from_snapshot = losses
    recorded = _recorded_losses(bad)
    assert [from_snapshot[t] for t in (12, 13)] == [recorded[12], recorded[13]]
    assert sorted(from_failure) == [15, 16, 17, 18]
    assert from_failure == {t: from_snapshot[t] for t in from_failure}


def _full_dev(path):
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # /dev/full's numbers, our own node


@pytest.mark.parametrize("problem", ["dangling_symlink", "under_a_device", "a_file", "empty"])
def test_export_out_problem_was_an_internal_error(tmp_path, runs, problem):
    healthy = runs[0]
    victim = tmp_path / "victim"
    if problem == "dangling_symlink":
        out = tmp_path / "link"
        os.symlink(victim, out)
    elif problem == "under_a_device":
        if os.geteuid() != 0:
            pytest.skip("mknod of a character device needs root")
        _full_dev(tmp_path / "full")
        out = tmp_path / "full" / "x"
    elif problem == "empty":
        out = ""
    else:
        out = tmp_path / "file"
        out.write_text("mine")
    p = replay_here("export", str(healthy), "--out", str(out))  # refused before any replay
    assert p.returncode == 2, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and errors[0].startswith("replay: error: "), p.stderr
    assert "--out" in errors[0], errors[0]
    assert not victim.exists()
    if problem == "a_file":
        assert out.read_text() == "mine"


def test_export_on_a_full_disk_left_a_partial_checkpoint(tmp_path, runs):
    """A tmpfs of our own, filled to the last byte: one line, exit 3, nothing left there."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        out = disk / "ckpt"
        p = _run("-m", "replay", "export", str(runs[0]), "--out", str(out))
        assert p.returncode == 3, p.stderr
        errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
        assert len(errors) == 1 and "No space left on device" in errors[0], p.stderr
        assert sorted(os.listdir(disk)) == ["filler"]  # no ckpt, no temporary folder
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_export_wrote_a_replayed_state_nobody_checked(tmp_path):
    """A step that reads a global the loop changes replays differently: export used to write
    the state it reached anyway. Every replayed step is compared bitwise with the recording on
    the way, and the first that differs stops the export (exit 5) before anything is written."""
    program = ROOT / "tests" / "realistic" / "programs" / "global_lr.py"
    run = tmp_path / "global_lr.h5"
    p = run_py(str(program), str(run), cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    out = tmp_path / "ckpt"
    p = _run("-m", "replay", "export", str(run), "--out", str(out), "--step", "3")
    assert p.returncode == 5, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
    # (step 1's update used the wrong rate; step 2's loss is the first to show it)
    assert len(errors) == 1 and "replaying step 2 " in errors[0], p.stderr
    assert "--step 0" in errors[0]
    assert os.listdir(tmp_path) == ["global_lr.h5"]  # no checkpoint, no temporary folder


def test_export_of_a_run_that_failed_at_step_21_offered_resume_step_0(tmp_path):
    """Issue 31's case: snapshot_every=50, NaN at step 21. Every healthy step was lost to the
    user who wanted to resume; now the state before step 21 is exported, each of the 21 steps
    replayed to reach it checked bitwise."""
    run = tmp_path / "nan21.h5"
    p = run_py(
        str(SCRIPTS / "mlp_train.py"), str(run), "--steps", "40", "--nan-at", "21",
        "--snapshot-every", "50",
    )  # fmt: skip
    assert "NonFiniteLossError" in p.stderr, p.stderr[-2000:]
    out = tmp_path / "ckpt"
    p = _run("-m", "replay", "export", str(run), "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert (report["step"], report["snapshot"], report["verified"]) == (21, 0, 21), report
    skip = json.loads((out / "skip.json").read_text())
    assert skip["resume_step"] == 21 and [s["step"] for s in skip["skip"]] == [21]
    p = _run("-m", "replay", "export", str(run), "--out", str(tmp_path / "s9"), "--step", "9")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "replayed 9 step(s) from the snapshot of step 0, 9 checked bitwise" in p.stdout
