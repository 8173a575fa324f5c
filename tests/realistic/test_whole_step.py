"""Issue 33 on look-alikes of real programs (tests/realistic/programs), each recorded as its
author would run it and bisected with the real CLI: the op named is the first producer over the
whole step, checked against a plain per-op scan of the same program (plain_scan.py), and the
op that only noticed it later is named as where it surfaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import replay_json, run_py

HERE = Path(__file__).parent
PROGRAMS = HERE / "programs"


def record(tmp: Path, program: str, *args: str) -> Path:
    script = tmp / program
    shutil.copy(PROGRAMS / program, script)
    p = run_py(str(script), "run.h5", *args, cwd=tmp, timeout=180)
    assert (tmp / "run.h5").exists(), p.stderr[-2000:]
    return tmp / "run.h5"


def plain_scan(tmp: Path, program: str, *args: str) -> list[dict | None]:
    """The first producer of each step of a plain run of ``program`` (its own recording goes
    to a throwaway file)."""
    d = tmp / "scan"
    d.mkdir()
    run_py(str(HERE / "plain_scan.py"), str(d / "scan.json"), str(PROGRAMS / program),
           str(d / "scan.h5"), *args, cwd=d, timeout=180)  # fmt: skip
    return json.loads((d / "scan.json").read_text())


def bisect(run: Path) -> dict:
    rc, v, err = replay_json("bisect", str(run), cwd=run.parent)
    assert rc == 0 and v, err[-3000:]  # 0: a culprit found
    return v


def closure_column(run: Path) -> np.ndarray:
    with h5py.File(run.with_suffix(".forensics.h5"), "r") as f:
        return f["ops/closure"][()]


@pytest.mark.slow
def test_lbfgs_names_the_forward_mse_loss_of_the_second_closure_call(tmp_path):
    args = ("--lr", "1e200", "--steps", "2", "--length", "12")
    run = record(tmp_path, "lbfgs_sequence.py", *args)
    scan = plain_scan(tmp_path, "lbfgs_sequence.py", *args)
    v = bisect(run)
    step = v["first_bad_step"]
    first = scan[step]
    assert first["op"] == "aten::mse_loss" and first["closure"] == 1, first  # the second call
    assert v["kind"] == "nonfinite" and v["cause"] == "op"
    assert (v["op"], v["phase"], v["closure"]) == (first["op"], "forward", first["closure"])
    assert v["source"]["function"] == "closure"
    s = v["surfaced"]  # what the parameters' non-finite values came from: a later backward op
    assert s["op_index"] > v["op_index"] and s["phase"] == "backward", s
    closure = closure_column(run)
    assert closure[v["op_index"]] == 1 and closure.max() >= 2
    from replay.cli.render import render_verdict
    from replay.reports import BisectReport

    text = render_verdict(BisectReport.from_json(v))  # what `replay bisect` prints for this JSON
    assert "closure call  2" in text and "surfaced at   aten::" in text


def test_vae_overflow_names_exp_in_reparameterize_surfaced_at_binary_cross_entropy(tmp_path):
    run = record(tmp_path, "vae_overflow.py")
    scan = plain_scan(tmp_path, "vae_overflow.py")
    v = bisect(run)
    assert v["kind"] == "exception" and "between 0 and 1" in v["exception"]["message"]
    first = scan[v["first_bad_step"]]
    assert first["op"] == "aten::exp"
    assert v["op"] == first["op"] and v["cause"] == "op" and v["made"] == "+inf"
    assert v["source"]["function"] == "reparameterize"
    assert v["surfaced"]["op"] == "aten::binary_cross_entropy"
    assert v["surfaced"]["how"].startswith("raised RuntimeError")
    assert v["closure"] is None


@pytest.mark.slow
def test_gan_in_a_moduledict_names_the_forward_log_not_the_backward_div(tmp_path):
    run = record(tmp_path, "gan_moduledict.py")
    scan = plain_scan(tmp_path, "gan_moduledict.py")
    v = bisect(run)
    first = scan[v["first_bad_step"]]
    assert first["op"] == "aten::log" and first["phase"] == "forward/other", first
    assert v["kind"] == "nonfinite" and (v["op"], v["phase"]) == ("aten::log", "forward")
    assert v["source"]["function"] == "bce"
    # the loss the step returns got its NaN from the backward div of that log (D's update)
    assert v["surfaced"]["op"] == "aten::div" and v["surfaced"]["phase"] == "backward"


def test_time_major_lm_with_flattened_targets_blames_column_7(tmp_path):
    run = record(tmp_path, "lm_time_major.py")
    v = bisect(run)
    assert v["kind"] == "exception" and v["exception"]["type"] == "IndexError"
    assert v["op"] == "aten::embedding"
    assert v["sample_axes"] == [1] and v["samples"] == [7], v["notes"]
    assert v["samples_exact"] is True


def test_ragged_batch_that_cannot_be_cut_along_its_samples_says_so_instead_of_naming_one(
    tmp_path,
):
    """Flat tokens[N] with lengths[B]: a sub-batch keeps every token and fails differently
    (split's sizes no longer add up) than the whole batch (the embedding's IndexError)."""
    run = record(tmp_path, "ragged_bags.py")
    v = bisect(run)
    assert v["kind"] == "exception" and v["exception"]["type"] == "IndexError"
    assert v["op"] == "aten::embedding"
    assert not v.get("samples"), v["samples"]
    notes = " ".join(v["notes"])
    assert "could not be cut consistently along dim 0" in notes, v["notes"]
    assert "split" in notes and "no sample named" in notes, v["notes"]


def max_rss_of(*args: str, cwd: Path) -> tuple[int, str]:
    """Peak RSS (bytes) of ``python -m replay ARGS`` run alone in a child, and its stderr."""
    code = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run([sys.executable, '-m', 'replay', *sys.argv[1:]], "
        "capture_output=True, text=True)\n"
        "sys.stderr.write(p.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, p.returncode)\n"
    )
    p = run_py("-c", code, *args, cwd=cwd, timeout=300)
    rss, rc = p.stdout.split()
    assert rc == "0", p.stderr[-3000:]
    return int(rss), p.stderr


@pytest.mark.slow
def test_many_small_ops_trace_stays_within_its_memory_bound_and_shows_progress(tmp_path):
    """An LSTMCell unrolled under LBFGS, twenty closure calls of thousands of tiny ops, every
    one NaN after the second call: the trace's memory beyond the replay's own stays bounded
    (its op table streams to disk), and it says how far it got on stderr."""
    run = record(tmp_path, "lbfgs_sequence.py", "--lr", "1e200", "--steps", "1", "--length", "30")
    replay_rss, _ = max_rss_of("verify", str(run), cwd=tmp_path)
    trace_rss, err = max_rss_of("trace", str(run), "--step", "0", "--json", cwd=tmp_path)
    with h5py.File(run.with_suffix(".forensics.h5"), "r") as f:
        n_ops = f["ops/phase"].shape[0]
        closure = f["ops/closure"][()]
        status = f["ops/status"][()]
    assert n_ops > 75_000 and closure.max() == 19
    assert (status == 2).sum() > n_ops // 2  # most ops carried the NaN on
    # the old in-memory table and per-op records took over 1 KiB an op: >75 MiB here, on top
    # of the tracer's fixed cost
    assert trace_rss - replay_rss < 96 * 2**20, (trace_rss, replay_rss, n_ops)
    progress = [ln for ln in err.splitlines() if ln.startswith("replay trace: ")]
    assert progress and "closure call" in "".join(progress), err[-2000:]
