"""Replay by re-entry (docs/reentry.md): programs shaped as people write them, with no build_fn,
recorded as their authors run them and replayed with the real CLI from another directory.

Each failing one must bisect to the right step and op; each healthy one must verify bitwise; the
replay must run the program only up to its Recorder and write no recording."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import replay_cli, run_py

PROGRAMS = Path(__file__).with_name("programs")


def record(tmp: Path, program: str, *args: str, module: bool = False) -> Path:
    """Copy ``program`` into ``tmp`` and run it there (``python -m`` with ``module``)."""
    shutil.copy(PROGRAMS / program, tmp / program)
    cmd = ("-m", program.removesuffix(".py")) if module else (str(tmp / program),)
    p = run_py(*cmd, *args, cwd=tmp, timeout=180)
    assert (tmp / "run.h5").exists(), p.stderr[-2000:]
    return tmp / "run.h5"


def replay_json(*args: str, cwd: Path) -> tuple[int, dict, subprocess.CompletedProcess]:
    p = replay_cli(*args, "--json", cwd=cwd)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


def test_a_closure_over_the_locals_of_main_replays_bitwise_and_trains_nothing(tmp_path, elsewhere):
    run = record(tmp_path, "closure_in_main.py", "--steps", "12")
    assert (tmp_path / "trained.log").read_text() == "started\n"
    before = digest(run)
    rc, v, p = replay_json("verify", str(run), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 12, p.stderr[-3000:]
    assert "again, up to its replay.Recorder" in p.stderr
    # The program ran only up to its Recorder: it printed no training step, it saw
    # replay.replaying() (no second "started"), and it wrote no recording.
    assert "step 0 loss" not in p.stderr + p.stdout
    assert (tmp_path / "trained.log").read_text() == "started\n"
    assert digest(run) == before
    assert sorted(x.name for x in tmp_path.glob("run*.h5")) == ["run.h5"]
    assert not list(elsewhere.iterdir())


def test_a_closure_step_bisects_to_the_step_and_the_op_that_made_the_inf(tmp_path, elsewhere):
    run = record(tmp_path, "closure_in_main.py", "--steps", "12", "--bad-step", "6")
    rc, v, p = replay_json("bisect", str(run), cwd=elsewhere)
    assert rc == 0, p.stderr[-3000:]
    assert v["first_bad_step"] == 6 and v["op"] == "aten::nll_loss_forward", v
    assert v["phase"] == "forward" and v["reproducible"] is True
    assert v["source"]["function"] == "step" and "cross_entropy" in v["source"]["code"]


def test_a_script_that_trains_at_import_is_replayed_by_running_it(tmp_path, elsewhere):
    run = record(tmp_path, "trains_at_import_reentry.py", "3")
    rc, v, p = replay_json("bisect", str(run), cwd=elsewhere)
    assert rc == 0, p.stderr[-3000:]
    assert v["first_bad_step"] == 3 and v["cause"] == "data" and v["samples"] == [2], v
    assert "done" not in p.stderr  # the script's line after its loop never ran


def test_objects_made_inside_main_worker_and_a_partial_step_replay_bitwise(tmp_path, elsewhere):
    run = record(tmp_path, "main_worker.py", "--epochs", "3", "--lr", "0.05")
    rc, v, p = replay_json("verify", str(run), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 12, p.stderr[-3000:]


def test_a_trainer_class_run_as_a_module_with_a_bound_method_step(tmp_path, elsewhere):
    run = record(tmp_path, "trainer_class.py", "--label-bug", module=True)
    rc, v, p = replay_json("bisect", str(run), cwd=elsewhere)
    assert rc == 0, p.stderr[-3000:]
    assert "python -m trainer_class --label-bug" in p.stderr
    assert v["kind"] == "exception" and v["first_bad_step"] == 7, v
    assert v["op"] == "aten::nll_loss_forward" and v["samples"] == [2], v
    assert v["source"]["function"] == "_step"


def test_trace_and_overfit_run_through_the_same_door(tmp_path, elsewhere):
    run = record(tmp_path, "closure_in_main.py", "--steps", "8")
    rc, v, p = replay_json("trace", str(run), "--step", "5", cwd=elsewhere)
    assert rc in (0, 1) and v["step"] == 5 and v["op"] is None, p.stderr[-3000:]
    p = replay_cli("overfit", str(run), "--iters", "30", cwd=elsewhere)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    assert "again, up to its replay.Recorder" in p.stderr


def test_a_program_that_no_longer_reaches_its_recorder_is_one_line_exit_4(tmp_path, elsewhere):
    run = record(tmp_path, "closure_in_main.py", "--steps", "6")
    script = tmp_path / "closure_in_main.py"
    script.write_text(script.read_text().replace("    main()\n", "    pass\n"))
    p = replay_cli("verify", str(run), cwd=elsewhere)
    assert p.returncode == 4, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "ran to its end before it constructed a replay.Recorder" in last
    assert "changed since it was recorded" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_program_that_raises_before_its_recorder_is_one_line_exit_4(tmp_path, elsewhere):
    run = record(tmp_path, "closure_in_main.py", "--steps", "6")
    script = tmp_path / "closure_in_main.py"
    script.write_text(script.read_text().replace("    torch.manual_seed(0)\n", "    1 / 0\n"))
    # (a predicate every step matches: a healthy window is answered without running anything)
    p = replay_cli("bisect", str(run), "--until", "loss > 0", cwd=elsewhere)
    assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "raised ZeroDivisionError: division by zero before it constructed" in p.stderr


def test_the_changed_source_diff_of_a_rerun_program_reaches_the_terminal_escaped(
    tmp_path, elsewhere
):
    """Was: replaying by re-entry printed its notes raw (the engine's went through term_safe),
    so the diff of a program changed since the recording wrote its control characters to the
    terminal: a line holding ESC ] 0 ; ... BEL set the terminal's title."""
    run = record(tmp_path, "closure_in_main.py", "--steps", "6")
    script = tmp_path / "closure_in_main.py"
    script.write_text(script.read_text() + "# \x1b]0;pwned\x07\n")
    p = replay_cli("verify", str(run), cwd=elsewhere)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr
    assert "changed since it was recorded" in p.stderr and "\\x1b]0;pwned\\x07" in p.stderr


def test_build_fn_recordings_still_replay_through_their_entry_points_and_reenter_on_request(
    tmp_path, elsewhere
):
    shutil.copy(PROGRAMS.parent.parent / "integration" / "scripts" / "mlp_train.py", tmp_path)
    p = run_py(str(tmp_path / "mlp_train.py"), str(tmp_path / "run.h5"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, p = replay_json("verify", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True, p.stderr[-2000:]
    assert "up to its replay.Recorder" not in p.stderr  # imported, not run
    rc, v, p = replay_json("verify", str(tmp_path / "run.h5"), "--reenter", cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True, p.stderr[-2000:]
    assert "up to its replay.Recorder" in p.stderr


def test_an_accelerate_loop_with_accumulation_trains_the_same_and_replays_bitwise(
    tmp_path, elsewhere
):
    """accelerate's prepared objects and the Accelerator itself among the objects (its
    micro-batch counter decides when accumulate() lets the optimizer step): the losses are the
    same with and without the Recorder, and a replay from a mid-run snapshot steps the
    optimizer on the same micro-batches as the recording."""
    pytest.importorskip("accelerate")
    shutil.copy(PROGRAMS / "accelerate_loop.py", tmp_path)
    bare = run_py(str(tmp_path / "accelerate_loop.py"), "--no-replay", cwd=tmp_path)
    recorded = run_py(str(tmp_path / "accelerate_loop.py"), cwd=tmp_path)
    assert bare.returncode == 0 and recorded.returncode == 0, recorded.stderr[-2000:]
    losses = [line for line in recorded.stdout.splitlines() if line.startswith("losses")]
    assert losses and losses == [
        line for line in bare.stdout.splitlines() if line.startswith("losses")
    ]
    rc, v, p = replay_json("verify", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True, p.stderr[-3000:]
    assert v["window"] == [5, 15]  # from the snapshot of step 5: an odd micro-batch


def test_a_fabric_loop_with_its_wrapped_objects_replays_and_bisects(tmp_path, elsewhere):
    pytest.importorskip("lightning")
    run = record(tmp_path, "fabric_loop.py")
    rc, v, p = replay_json("verify", str(run), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 12, p.stderr[-3000:]
    (tmp_path / "run.h5").unlink()
    run = record(tmp_path, "fabric_loop.py", "5")
    rc, v, p = replay_json("bisect", str(run), cwd=elsewhere)
    assert rc == 0 and v["first_bad_step"] == 5 and v["reproducible"] is True, p.stderr[-3000:]


def torchrun(tmp: Path, nproc: int, *args: str) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=N ddp_torchrun.py ARGS`` in ``tmp``."""
    shutil.copy(PROGRAMS / "ddp_torchrun.py", tmp)
    launch = ("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}")
    return run_py(*launch, str(tmp / "ddp_torchrun.py"), *args, cwd=tmp, timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_torchrun_program_is_replayed_rank_by_rank_by_reentry(tmp_path, elsewhere, nproc):
    """Each rank's replay runs the program again with torchrun's environment: it makes its own
    process group and DDP wrapper, and its Recorder hands them over."""
    p = torchrun(tmp_path, nproc, "--steps", "8")
    assert p.returncode == 0, p.stderr[-3000:]
    rc, v, err = replay_json("verify", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True, err.stderr[-3000:]
    assert len(v["ranks"]) == nproc


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_torchrun_programs_bad_rank_is_bisected_by_reentry(tmp_path, elsewhere, nproc):
    """The rank whose data went bad, its step and its sample, found by replaying every rank
    together, each by running the program again under torchrun's environment."""
    p = torchrun(tmp_path, nproc, "--steps", "8", "--bad-rank", "1", "--bad-step", "5")
    assert p.returncode != 0
    rc, v, err = replay_json("bisect", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert rc == 0, err.stderr[-3000:]
    assert v["first_bad_step"] == 5 and v["rank"] == 1 and v["cause"] == "data", v
    assert v["samples"] == [1] and v["reproducible"] is True


@pytest.mark.slow
def test_a_rank_that_died_outside_a_step_is_the_culprit_not_the_peer_whose_collective_failed(
    tmp_path, elsewhere
):
    """Rank 1's loader raises before step 4 (outside any step); rank 0's step 4 then raises in
    DDP's all-reduce (gloo: "Connection closed by peer"). Was: info blamed rank 0's step 4 ("went
    bad after the all-reduce"), and bisect replayed the ranks together and failed on their
    windows (rank 0: 0..4, rank 1: 0..3). Now rank 1's death is the culprit, said by info,
    doctor and bisect, and bisect answers from the files (it runs nothing)."""
    p = torchrun(tmp_path, 2, "--steps", "8", "--die-rank", "1", "--die-step", "4")
    assert p.returncode != 0 and "image file is truncated" in p.stderr, p.stderr[-3000:]
    rc, v, err = replay_json("info", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert rc == 0, err.stderr[-3000:]
    f = v["first_bad"]
    assert (f["kind"], f["ranks"], f["step"]) == ("died", [1], 4), f
    assert f["ended"]["type"] == "OSError" and f["ended"]["last_step"] == 3
    assert f["after"]["ranks"] == [0] and f["after"]["kind"] == "exception", f
    said = (
        "rank 1 died: OSError: image file is truncated (sample 17), outside any step, after step 3"
    )
    assert v["summary"].startswith(said), v["summary"]
    assert "then rank 0 raised at step 4 in a collective" in v["summary"]
    p = replay_cli("doctor", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert said in p.stdout, p.stdout + p.stderr
    p = replay_cli("bisect", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert p.returncode == 1, p.stderr[-3000:]  # nothing a replay of a step can find
    assert f"but {said}" in p.stdout and "then rank 0 raised at step 4" in p.stdout, p.stdout
    assert "importing" not in p.stderr and "replaying" not in p.stderr, p.stderr  # ran nothing
    # verify replays the steps every rank completed (was: "the ranks' replayable windows
    # differ (rank 0: steps 0..4; rank 1: steps 0..3)", and nothing was verified)
    rc, v, err = replay_json("verify", str(tmp_path / "run.h5"), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True, err.stderr[-3000:]
    assert [r["replayed_steps"] for r in v["ranks"].values()] == [[0, 1, 2, 3]] * 2, v["ranks"]


@pytest.mark.slow
def test_a_compiled_model_replays_bitwise_and_bisects_to_its_op(tmp_path, elsewhere):
    # one recording (each run compiles): its steps up to the NaN, that one included, replay
    # bitwise compiled, and its bisect names the op
    run = record(tmp_path, "compiled_model.py", "5")
    rc, v, p = replay_json("verify", str(run), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 6, p.stderr[-3000:]
    rc, v, p = replay_json("bisect", str(run), cwd=elsewhere)
    assert rc == 0 and v["first_bad_step"] == 5 and v["op"] == "aten::log", p.stderr[-3000:]
    assert v["reproducible"] is True


@pytest.mark.slow
def test_a_nan_only_the_compiled_code_makes_is_said_to_be_compiled_and_eager_disagreeing(
    tmp_path, elsewhere
):
    """Step 3's NaN comes from inductor keeping a float16 round trip in float32: the compiled
    replay reproduces it bitwise, the per-op trace (which runs the model eagerly) is finite.
    Was: cause null, op null and "no sample named", as if the trace had failed; now the cause
    says compiled and eager replays disagree, with both losses."""
    run = record(tmp_path, "compiled_disagrees.py", "3")
    rc, v, p = replay_json("bisect", str(run), cwd=elsewhere)
    assert rc == 0 and v["first_bad_step"] == 3 and v["reproducible"] is True, p.stderr[-3000:]
    assert v["cause"] == "compiled" and v["op"] is None and v["samples"] is None, v
    said = [n for n in v["notes"] if n.startswith("compiled and eager replays disagree: step 3")]
    assert len(said) == 1 and "fails compiled, as recorded (loss nan)" in said[0], v["notes"]
    eager = said[0].split("torch.compile'd model (loss ")[1].split(")")[0]
    assert math.isfinite(float(eager)), said


def test_a_nanogpt_shaped_script_verifies_bitwise_from_every_snapshot(tmp_path, elsewhere):
    """Module-level training, memmap batches at torch.randint offsets, accumulation, a
    disabled GradScaler, clipping, lr per step: the micro-batches go through rec.step."""
    run = record(tmp_path, "prefetching_gpt.py", "run.h5")
    rc, v, p = replay_json("verify", str(run), cwd=elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 8, p.stderr[-3000:]


def test_a_batch_prefetched_by_the_previous_step_is_named_not_called_nondeterministic(
    tmp_path, elsewhere
):
    """nanoGPT's own loop: each micro-step fetches the next batch into globals X, Y. A replay
    carried on from step 0 rebuilds them; one from the snapshot of step 4 (where a bisect of a
    failure at step 5 starts) cannot. Verify starts every snapshot afresh and says which."""
    run = record(tmp_path, "prefetching_gpt.py", "run.h5", "--prefetch")
    rc, v, p = replay_json("verify", str(run), cwd=elsewhere)
    assert rc == 1 and v["deterministic"] is False, p.stderr[-3000:]
    fd, cause = v["first_divergence"], v["cause"]
    assert fd["step"] == 4 and fd["carried_on"] == 0, fd
    assert cause["kind"] == "outside_state", cause
    assert "not from the snapshot of step 4 itself" in cause["summary"], cause
    # the globals are named (replay/capture/suspects.py), and where they go
    assert "the step changes X (tensor" in cause["summary"], cause
    assert cause["hint"].startswith("hand X, Y to the step through rec.step(batch, name=value)")
    assert [s.split(" ")[0] for s in cause["suspects"]] == ["X", "Y"], cause
    text = replay_cli("verify", str(run), cwd=elsewhere).stdout
    assert "first divergence at step 4, param_fingerprint: carried on from step 0" in text, text


def test_bisect_of_a_prefetching_loop_does_not_blame_the_kernels_alone(tmp_path, elsewhere):
    """The same loop failing at step 6: bisect replays from the snapshot of step 4, whose
    globals hold what the program's start left there, and cannot reproduce it. It must not
    say "non-determinism": two replays of one step disagree because the first moved the
    prefetched batch on, which is named (was: "nondeterministic", the globals only guessed at)."""
    run = record(tmp_path, "prefetching_gpt.py", "run.h5", "--prefetch", "--bad-step", "6")
    rc, v, p = replay_json("bisect", str(run), cwd=elsewhere)
    assert v["first_bad_step"] == 6 and v["reproducible"] is False, p.stderr[-3000:]
    cause = v["divergence_cause"]
    assert cause["kind"] == "outside_state", cause
    assert "the first changed state that no snapshot holds" in cause["summary"], cause
    assert cause["hint"].startswith("hand X, Y to the step through rec.step"), cause


@pytest.mark.slow
def test_a_step_that_compiles_on_its_first_call_is_traced_with_its_compiled_ops(
    tmp_path, elsewhere
):
    """Step 4 is a snapshot's step: the replay's first step, which compiles. The tracer's
    unwrapped dispatch mode misses compiled ops; the trace is taken again with the wrapped one
    (``CompiledDuringTrace``) and names the op, as ``replay trace --step`` does."""
    run = record(tmp_path, "lazily_compiled.py", "4")
    rc, v, p = replay_json("bisect", str(run), cwd=elsewhere)
    assert rc == 0 and v["first_bad_step"] == 4, p.stderr[-3000:]
    assert v["op"] == "aten::log" and v["reproducible"] is True, v
    rc, v, p = replay_json("trace", str(run), "--step", "4", cwd=elsewhere)
    assert rc in (0, 1) and v.get("op") == "aten::log", (rc, v, p.stderr[-3000:])


def test_a_resume_that_fails_on_the_checkpoint_the_run_wrote_names_that_checkpoint(
    tmp_path, elsewhere
):
    """The run wrote checkpoint.pt while it trained; replay runs the start-up again, whose
    resume reads it and raises before the Recorder. Was: only the KeyError, with nothing to say
    that the file it read is one the run itself wrote since it began (the DDP tutorial's
    resume failing on a CUDA checkpoint read the same way)."""
    run = record(tmp_path, "resumes_from_checkpoint.py", "12")
    ckpt = tmp_path / "checkpoint.pt"
    before = digest(ckpt)
    p = replay_cli("verify", str(run), cwd=elsewhere)
    assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "raised KeyError: 'state_dict' before it constructed a replay.Recorder" in last, last
    assert "it read checkpoint.pt (changed " in last and "after the run began" in last, last
    assert "if not replay.replaying():" in last
    assert digest(ckpt) == before  # read, never written
