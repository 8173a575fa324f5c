"""Classes of program the rest of tests/realistic does not cover, each a look-alike of a
pytorch/examples program: full-batch graph training (gat/main.py, gcn/main.py:
programs/full_batch_graph.py), layer-local training (mnist_forward_forward/main.py:
programs/layer_local.py), seq2seq translation with padding masks (language_translation:
programs/seq2seq_padding.py), pairs drawn by a Dataset with python's random
(siamese_network: programs/siamese_pairs.py) and workers started by multiprocessing
(mnist_hogwild: programs/hogwild.py). Each is recorded in a subprocess as its author would run it and
replayed with the real CLI from another directory: a healthy run replays bitwise, a planted
failure is bisected to its step, op and sample, and the files the program wrote (its log, a
checkpoint) are byte-identical afterwards."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_py
from tests.realistic.test_real_programs import PROGRAMS, health, record, replay, verify_json


def digests(folder: Path) -> dict[str, str]:
    """Every file the run left (the recording included), by content."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def last_logged_epoch(log: Path) -> tuple[int, float]:
    """The last epoch the run logged, and its loss: the run's own account."""
    epochs = [re.match(r"epoch (\d+) loss (\S+)", ln) for ln in log.read_text().splitlines()]
    last = [m for m in epochs if m][-1]
    return int(last.group(1)), float(last.group(2))


def first_flagged(run: Path) -> int:
    flags = [health(run, c) for c in ("loss_nonfinite", "grad_nonfinite", "param_nonfinite")]
    return min(int(np.flatnonzero(f == 1.0)[0]) for f in flags if (f == 1.0).any())


@pytest.mark.slow
def test_a_sparse_graph_handed_to_the_step_as_its_batch_replays_bitwise(tmp_path, elsewhere):
    """gcn/main.py's shape: the sparse adjacency and features are the step's batch. Was: kept
    dense, replayed dense, 1 ulp off at step 12 of 30, and verify said "state changed outside
    the step" (and "1073741824 ulps" for 2)."""
    run, p = record(tmp_path, "full_batch_graph.py", "--model", "gcn", "--graph", "batch",
                    "--lr-growth", "1")  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    before = digests(tmp_path)
    rc, v, err = verify_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 30, (v, err[-2000:])
    assert digests(tmp_path) == before and not list(elsewhere.iterdir())


@pytest.mark.parametrize(
    ("model", "step", "op", "modules", "line"),
    [
        # the attention's matmuls overflow: in the forward or, a step earlier, the backward
        # (which, depends on the thread count the run had)
        ("gat", 16, "aten::bmm", ("gat1", "gat2"), "torch.matmul("),
        pytest.param(
            "gcn",
            22,
            "aten::nll_loss_forward",
            (None,),
            "loss = criterion(",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_full_batch_graph_run_whose_lr_explodes_is_bisected_to_the_overflowing_op(
    tmp_path, elsewhere, model, step, op, modules, line
):
    """The step takes no batch (the epoch number; the graph in its closure), the loop grows
    the lr through ExponentialLR: bisect names the step the run's own log first shows a
    non-finite loss at and the op that overflowed, and the log and checkpoint stay as they
    were. The window up to that step replays bitwise first (a bisect that never replays
    proves nothing)."""
    run, p = record(tmp_path, "full_batch_graph.py", "--model", model)
    assert p.returncode == 3 and f"at step {step};" in p.stderr, p.stderr[-2000:]
    epoch, loss = last_logged_epoch(tmp_path / "train.log")  # the step before: finite
    assert epoch == step - 1 and math.isfinite(loss)
    # The step whose own update first made something non-finite, by the recorder's flags (its
    # loss may still be finite: the overflow can come in the backward, and the stop after).
    step = first_flagged(run)
    before = digests(tmp_path)
    v = replay("verify", str(run), "--all", "--json", cwd=elsewhere)
    assert json.loads(v.stdout)["deterministic"] is True, v.stderr[-2000:]
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert (d["first_bad_step"], d["kind"], d["cause"]) == (step, "nonfinite", "op"), d["notes"]
    assert d["op"] == op and d["module"] in modules, {k: d[k] for k in ("op", "module", "notes")}
    assert d["reproducible"] is True and d["deterministic"] is True
    source = (PROGRAMS / "full_batch_graph.py").read_text().splitlines()
    assert line in source[d["source"]["line"] - 1], d["source"]
    after = digests(tmp_path)
    assert after.pop("run.forensics.h5", None) is not None  # bisect's own sidecar
    assert after == before and not list(elsewhere.iterdir())


@pytest.mark.slow  # (the unit test in test_health_flags_overflow.py pins it in the default tier)
def test_a_layer_local_run_whose_network_holds_no_parameters_is_healthy_not_non_finite(
    tmp_path, elsewhere
):
    """mnist_forward_forward's shape (programs/layer_local.py): layers in a plain list, each
    trained by its own optimizer inside its own ``train()``. Was: the network's fingerprint of
    no parameters was flagged non-finite, so ``replay info`` said "first non-finite at step 0"
    and ``replay bisect`` named step 0 of a healthy run."""
    run, p = record(tmp_path, "layer_local.py")
    assert p.returncode == 0, p.stderr[-2000:]
    info = replay("info", str(run), cwd=elsewhere)
    assert "no NaN/Inf or exception recorded" in info.stdout, info.stdout
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    assert b.returncode == 1 and json.loads(b.stdout)["first_bad_step"] is None, b.stderr[-2000:]


def test_every_layers_steps_of_a_layer_local_run_replay_bitwise(tmp_path, elsewhere):
    """Layer 1's steps run ``Layer.train.<locals>.step`` over layer 1 and layer 0's outputs,
    where a replay is handed layer 0's closure. Was: layer 0's steps replayed bitwise, layer
    1's did not (the recorder said so at its first step); now each step record where the
    closure changed keeps what it holds (the layer by its name among the objects, the inputs
    as tensors: format.md ``step_fn``), and a replay makes it again, from any snapshot."""
    run, p = record(tmp_path, "layer_local.py", "--epochs", "6", "--snapshot-every", "4")
    assert p.returncode == 0 and "RecorderWarning" not in p.stderr, p.stderr[-2000:]
    rc, v, err = verify_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 12, v.get("cause")
    rc, v, err = replay_json_all(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True, v.get("cause")


def replay_json_all(run: Path, cwd: Path) -> tuple[int, dict, str]:
    """``replay verify --all``: every snapshot replayed afresh (layer 1's from its own)."""
    p = replay("verify", str(run), "--all", "--json", cwd=cwd)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_a_seq2seq_token_out_of_the_vocabulary_is_blamed_on_its_sample_along_dim_1(
    tmp_path, elsewhere
):
    """language_translation's shape (programs/seq2seq_padding.py): time-major source and
    target sentences padded to lengths of their own, an nn.Transformer with padding masks. A
    target token out of the vocabulary in sample 5 at step 9 raises in the target embedding.
    Was: the sample axis could not be told apart (the step raises: no loss to compare), dim 0
    was assumed, and bisect said "no sample is to blame". The program's log (appended to by
    logging.basicConfig at start-up, which a replay runs again) and checkpoint stay as they
    were."""
    run, p = record(tmp_path, "seq2seq_padding.py", "--bug", "token")
    assert p.returncode == 1 and "IndexError: index out of range" in p.stderr, p.stderr[-2000:]
    before = _tree(tmp_path)
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert (d["first_bad_step"], d["kind"], d["exception"]["type"]) == (
        9,
        "exception",
        "IndexError",
    )
    assert (d["op"], d["module"], d["phase"]) == ("aten::embedding", "tgt_embedding", "forward")
    assert d["samples"] == [5] and d["sample_axes"] == [1], d["notes"]
    assert d["reproducible"] is True
    after = _tree(tmp_path)
    assert after.pop("run.forensics.h5", None) is not None
    assert after == before and not list(elsewhere.iterdir())


@pytest.mark.slow
def test_a_seq2seq_batch_with_an_all_padding_sentence_is_healthy_and_replays_bitwise(
    tmp_path, elsewhere
):
    """The same run with sample 5's source all padding at step 9: every key of its attention
    rows masked with -inf, on purpose. torch's attention gives such rows zeros: no failure,
    and no op is to be named for the masks' -inf."""
    run, p = record(tmp_path, "seq2seq_padding.py", "--bug", "blank", "--epochs", "2")
    assert p.returncode == 0, p.stderr[-2000:]
    before = _tree(tmp_path)
    v = replay("verify", str(run), "--all", "--json", cwd=elsewhere)  # step 9 among them
    d = json.loads(v.stdout)
    assert v.returncode == 0 and d["deterministic"] is True, v.stderr[-2000:]
    assert d["window"][0] <= 9 <= d["window"][1], d["window"]
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    assert b.returncode == 1 and json.loads(b.stdout)["healthy"] is True, b.stderr[-2000:]
    t = replay("trace", str(run), "--step", "9", cwd=elsewhere)
    assert t.returncode == 0 and "no op made a non-finite value" in t.stdout, t.stdout[-2000:]
    after = _tree(tmp_path)
    after.pop("run.forensics.h5", None)
    assert after == before and not list(elsewhere.iterdir())


def first_nonfinite_in_recorded_batches(run: Path) -> tuple[int, str, int]:
    """The first recorded step whose batch holds a NaN, which tensor of it and which sample:
    read off the recording's batches, no replay."""
    import torch

    from replay.capture.tensors import from_leaves
    from replay.store import open_recording

    with open_recording(run) as rec:
        for t in sorted(rec.steps()):
            batch = from_leaves(rec.read_step(t)["batch"])
            for i, x in enumerate(batch):
                rows = torch.isnan(x.reshape(len(x), -1)).any(1).nonzero().flatten().tolist()
                if rows:
                    return t, f"batch[{i}]", rows[0]
    raise AssertionError("no NaN in any recorded batch")


@pytest.mark.slow
def test_a_siamese_pair_holding_a_nan_image_is_blamed_on_the_data_when_bce_raises(
    tmp_path, elsewhere
):
    """siamese_network's shape (programs/siamese_pairs.py): pairs drawn with python's random in
    a Dataset's __getitem__, so the loader's batches go by value (said once, at the program's
    line), a sigmoid and BCELoss. A NaN pixel in one image: BCELoss's range check raises. Was:
    the raising op named alone (cause null) and samples "14, 15" by delta debugging (a pair of
    one sample fails differently: the example's .squeeze()); now cause data, the NaN tensor and
    its one sample, read off the batch."""
    run, p = record(tmp_path, "siamese_pairs.py", "--seed", "5")
    assert p.returncode == 1 and "between 0 and 1" in p.stderr, p.stderr[-2000:]
    said = [ln for ln in p.stderr.splitlines() if "recorded by value from here on" in ln]
    assert len(said) == 1 and said[0].startswith(f"{tmp_path / 'siamese_pairs.py'}:"), said
    step, tensor, sample = first_nonfinite_in_recorded_batches(run)
    assert step == 4  # the run printed steps 0..3
    b = replay("bisect", str(run), "--json", cwd=elsewhere)
    d = json.loads(b.stdout)
    assert (d["first_bad_step"], d["kind"], d["cause"]) == (step, "exception", "data"), d["notes"]
    assert d["op"] == "aten::binary_cross_entropy" and d["exception"]["type"] == "RuntimeError"
    assert [t["name"] for t in d["data"]["tensors"]] == [tensor]
    assert d["samples"] == [sample] and d["reproducible"] is True
    rc, v, err = verify_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True, (v.get("cause"), err[-2000:])


@pytest.mark.slow
def test_hogwild_workers_recording_without_build_fn_are_told_and_never_trained_again(
    tmp_path, elsewhere
):
    """mnist_hogwild's shape (programs/hogwild.py): the Recorders are in processes that
    multiprocessing starts. Was: nothing said while it trained; replay verify re-ran the
    program, whose workers trained for real a second time, wrote run.rank0.1.h5 and
    run.rank1.1.h5 beside the recordings (and started self-checks), and only then said the
    program "ran to its end before it constructed a replay.Recorder". Now the recorder says
    while the run trains that these recordings will not replay, and verify refuses in one
    line, running nothing."""
    run, p = record(tmp_path, "hogwild.py")
    assert p.returncode == 0, p.stderr[-2000:]
    said = [ln for ln in p.stderr.splitlines() if "multiprocessing started" in ln]
    assert len(said) == 2 and all(ln.startswith(f"{tmp_path / 'hogwild.py'}:") for ln in said)
    before = _tree(tmp_path)
    v = replay("verify", str(tmp_path / "run.rank0.h5"), cwd=elsewhere)
    assert v.returncode == 3 and "recorded without replay" in v.stderr, v.stderr[-2000:]
    assert "Traceback" not in v.stderr and "running python" not in v.stderr
    assert _tree(tmp_path) == before and not list(elsewhere.iterdir())


def test_a_recorder_in_a_process_a_replayed_program_started_refuses_before_anything(tmp_path):
    """The guard for a process the re-run program starts (a hogwild worker of a recording made
    before the recorder said so, a subprocess): its Recorder ends the process in one line
    before it trains or writes anything."""
    from replay.capture.guard import REENTERED_ENV

    code = "import replay, torch; replay.Recorder('run.h5', objects={'model': torch.nn.Linear(1, 1)}); print('trained')"  # fmt: skip
    p = run_py("-c", code, cwd=tmp_path, env={REENTERED_ENV: "12345"})
    assert p.returncode == 1 and "trained" not in p.stdout, p.stderr[-2000:]
    (line,) = p.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("replay: a process the replayed program started (pid "), line
    assert "replay re-runs the program in pid 12345" in line and "does not train" in line
    assert not list(tmp_path.iterdir())
