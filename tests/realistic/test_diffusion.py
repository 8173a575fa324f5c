"""Denoising-diffusion training under accelerate (programs/ddpm_accelerate.py, shaped like
diffusers' train_unconditional.py): the step draws its noise and each sample's timestep from
the global generator, the optimizer and scheduler are accelerate's wrappers, gradients
accumulate over two micro-steps, and an EMA of the weights is state the Recorder is given.
The planted NaN comes from a random draw, not from the data: min-SNR loss weights divide 0 by
0 for a sample whose timestep is the last of a zero-terminal-SNR schedule."""

from __future__ import annotations

import json

import pytest

from tests.realistic.test_real_programs import bisect_json, record, replay
from tests.realistic.test_upstream_classes import digests


def test_a_diffusion_run_under_accelerate_is_traced_to_its_min_snr_division(tmp_path, elsewhere):
    """Was: "tracing step 21 failed: AttributeError: 'AcceleratedOptimizer' object has no
    attribute '_optimizer_step_pre_hooks'" (the trace hooked accelerate's wrapper, an Optimizer
    that never ran ``Optimizer.__init__``; ``whatif --clip`` did the same); the samples search
    said "every part of the batch fails on its own" where no part did; and ``whatif`` drew a
    micro-step's unmeasured gradient norm as non-finite."""
    pytest.importorskip("accelerate")
    run, p = record(tmp_path, "ddpm_accelerate.py", "--zero-terminal-snr")
    assert p.returncode == 1 and "loss is nan at step 21" in p.stderr, p.stderr[-2000:]
    before = digests(tmp_path)

    d = bisect_json(run, elsewhere)
    assert (d["first_bad_step"], d["reproducible"], d["deterministic"]) == (21, True, True), d
    assert (d["cause"], d["op"], d["phase"], d["module"]) == ("op", "aten::div", "forward", None)
    assert d["source"]["code"].endswith("# min-SNR  # fmt: skip"), d["source"]
    assert not any("tracing step" in n for n in d["notes"]), d["notes"]
    # the timesteps change with the batch's size: only the whole batch fails, no sample is named
    assert d["samples"] is None
    assert any("no part of the batch along dim 0 fails on its own" in n for n in d["notes"])

    w = replay("whatif", str(run), "--seed", "1", "--clip", "0.5", "--json", cwd=elsewhere)
    assert w.returncode == 1, w.stderr[-3000:]  # no change removes it
    r = json.loads(w.stdout)
    assert r["reproduces"] is True
    seed, clip = r["experiments"]
    assert seed["first_failure"] == 6 and clip["first_failure"] == 21 and clip["stopped"] is None
    assert any(n.startswith("--seed 1: other random draws fail too, at step 6") for n in r["notes"])
    # micro-steps (odd ones from step 2) take no optimizer step: no norm, not a NaN one
    norms = {s["step"]: s["grad_norm"] for s in r["baseline"]["steps"]}
    assert norms[2] is None and isinstance(norms[3], float) and norms[21] == "nan", norms

    # the warmup's first optimizer step (step 1) runs at lr 0: the two snapshots, before steps
    # 0 and 2, hold the same weights. Was: "42 of 42 trainable parameter tensors never changed"
    doc = replay("doctor", str(run), "--json", cwd=elsewhere)
    assert "params_never_updated" not in doc.stdout and "nonfinite_recorded" in doc.stdout

    after = digests(tmp_path)
    assert {k: after[k] for k in before} == before  # run.forensics.h5 is new, nothing else
    assert set(after) - set(before) == {"run.forensics.h5"}
    assert json.loads((tmp_path / "config.json").read_text())["zero_terminal_snr"] is True
