"""Diagnosis (issue 17): the right op, the data named as the cause, samples on any batch axis.

Each look-alike program in ``scripts/diag_*.py`` is recorded in a subprocess and bisected through
the CLI (``python -m replay bisect RUN.h5 --json``). The truth is computed here, independently:
the script's own ``build``/``make_batch``/``train_step`` run in plain torch, without replay, and
the failing step is inspected directly.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import torch
from recorded_runs import cli_json
from torch.overrides import TorchFunctionMode

from replay.reports import BisectReport
from tests.conftest import run_env, run_py

SCRIPTS = Path(__file__).with_name("scripts")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"truth_{name}", SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def record(tmp_path: Path, name: str, *args: str) -> Path:
    run = tmp_path / f"{name}.h5"
    p = run_py(str(SCRIPTS / f"{name}.py"), str(run), *args, timeout=120)
    assert p.returncode == 0 and run.exists(), p.stderr[-2000:]
    return run


def bisect(run: Path) -> dict:
    rc, d, err = cli_json("bisect", str(run))
    assert rc == 0, err
    assert "Traceback" not in err
    assert BisectReport.from_json(d).to_json() == d  # the report reads back as printed
    return d


def first_bad(mod):
    """Train in plain torch; return (first step whose loss, gradients or parameters are not
    finite, the model and optimizer as they were right before it, its batch)."""
    model, opt = mod.build()
    for t in range(mod.STEPS):
        before = copy.deepcopy((model, opt.state_dict()))
        batch = mod.make_batch(t)
        loss = mod.train_step(model, opt, batch)
        params = [p for p in model.parameters()]
        bad = not torch.isfinite(torch.as_tensor(loss)).all() or any(
            not torch.isfinite(p).all() for p in params
        )
        if bad:
            m, state = before
            o = type(opt)(m.parameters(), **opt.defaults)
            o.load_state_dict(state)
            return t, m, o, batch
    return None, model, opt, None


def marker_line(name: str, marker: str) -> int:
    lines = (SCRIPTS / f"{name}.py").read_text().splitlines()
    (hit,) = [i + 1 for i, s in enumerate(lines) if s.rstrip().endswith(f"# {marker}")]
    return hit


def test_log_of_zero_in_an_entropy_term_blames_the_log(tmp_path):
    mod = load("diag_entropy")
    t, model, _, (x, _) = first_bad(mod)
    with torch.no_grad():
        probs = torch.softmax(model(x), dim=-1)
        logp = torch.log(probs)
        # truth: log made -inf from finite probabilities, the product turned it into NaN
        assert torch.isfinite(probs).all() and (probs == 0).any()
        assert torch.isneginf(logp).any() and not torch.isnan(logp).any()
        assert torch.isnan(probs * logp).any()
    d = bisect(record(tmp_path, "diag_entropy"))
    assert d["first_bad_step"] == t
    assert (d["cause"], d["op"], d["phase"], d["made"]) == ("op", "aten::log", "forward", "-inf")
    assert d["source"]["line"] == marker_line("diag_entropy", "ENTROPY")
    conv = d["nan_from_inf"]
    assert conv["op"] == "aten::mul" and conv["from"] == "-inf"
    assert conv["op_index"] > d["op_index"]
    assert any("turned it into NaN" in n for n in d["notes"])


def test_intentional_minus_inf_mask_is_no_false_alarm(tmp_path):
    mod = load("diag_masked_attention")
    t, model, _, _ = first_bad(mod)
    assert t is None  # truth: every step of the plain run is finite

    class Spy(TorchFunctionMode):  # truth: the mask really writes -inf into the scores
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.Tensor.masked_fill:
                masked.append(int(torch.isneginf(out).sum()))
            return out

    masked: list[int] = []
    with Spy():
        out = model(mod.make_batch(0)[0])
    assert masked and masked[0] > 0 and torch.isfinite(out).all()
    run = record(tmp_path, "diag_masked_attention")
    rc, d, err = cli_json("bisect", str(run))
    assert rc == 1, err
    assert d["healthy"] is True


def test_softmax_over_a_fully_masked_row_is_blamed(tmp_path):
    mod = load("diag_masked_attention")
    mod.FULLY_MASKED = True  # the recording below is made with --fully-masked
    t, model, _, (x, keep, _) = first_bad(mod)
    with torch.no_grad():
        out = model(x, keep)
    truth = sorted({int(i) for i in torch.nonzero(torch.isnan(out))[:, 0]})
    assert truth and all(not keep[i].any() for i in truth)
    d = bisect(record(tmp_path, "diag_masked_attention", "--fully-masked"))
    assert d["first_bad_step"] == t
    assert (d["cause"], d["op"], d["made_from"]) == ("op", "aten::_softmax", "intentional")
    assert d["source"]["line"] == marker_line("diag_masked_attention", "SOFTMAX")
    assert d["nan_from_inf"] is None
    assert d["samples"] == truth and d["sample_axes"] == [0]


def test_nan_in_the_data_is_reported_as_a_data_bug(tmp_path):
    mod = load("diag_nan_sample")
    t, _, _, (x, _) = first_bad(mod)
    bad = torch.nonzero(~torch.isfinite(x)).tolist()
    run = record(tmp_path, "diag_nan_sample")
    d = bisect(run)
    assert d["first_bad_step"] == t
    assert d["cause"] == "data"
    (tensor,) = d["data"]["tensors"]
    assert tensor["name"] == "batch[0]" and tensor["positions"] == bad and tensor["nan"] == len(bad)
    assert d["samples"] == sorted({p[0] for p in bad}) and d["samples_exact"] is True
    assert d["op"] == "aten::addmm"  # context: the first op that read it
    p = subprocess.run(
        [sys.executable, "-m", "replay", "bisect", str(run)],
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "the input batch is non-finite: it is a data bug" in p.stdout
    assert "batch[0]" in p.stdout


def test_time_major_batch_blames_a_column(tmp_path):
    mod = load("diag_time_major")
    t, _, _, (x, _) = first_bad(mod)
    columns = sorted({int(b) for b in torch.nonzero(x == mod.PAD)[:, 1]})
    assert columns == [7]
    d = bisect(record(tmp_path, "diag_time_major"))
    assert d["first_bad_step"] == t
    assert (d["cause"], d["op"], d["made"]) == ("op", "aten::div", "NaN")
    assert d["source"]["line"] == marker_line("diag_time_major", "NORMALISE")
    assert d["sample_axes"] == [1] and d["samples"] == columns


def test_micro_batches_name_the_micro_batch_and_the_row(tmp_path):
    mod = load("diag_micro")
    t, _, _, (x, _) = first_bad(mod)
    truth = torch.nonzero((x == 0).all(-1)).tolist()
    assert truth == [[mod.BAD_MICRO, mod.BAD_ROW]]
    d = bisect(record(tmp_path, "diag_micro"))
    assert d["first_bad_step"] == t
    assert (d["op"], d["phase"]) == ("aten::div", "forward")
    assert d["sample_axes"] == [0, 1] and d["samples"] == truth
    assert any("micro-batches" in n for n in d["notes"])


def test_a_batch_axis_hint_on_the_step_function_is_used(tmp_path):
    text = (SCRIPTS / "diag_time_major.py").read_text()
    text = text.replace("\ndef main(", "\ntrain_step.batch_axis = 1\n\n\ndef main(", 1)
    script = tmp_path / "diag_hinted.py"
    script.write_text(text)
    run = tmp_path / "hinted.h5"
    p = subprocess.run(
        [sys.executable, str(script), str(run)], env=run_env(), capture_output=True, timeout=120
    )
    assert p.returncode == 0 and run.exists()
    d = bisect(run)
    assert d["sample_axes"] == [1] and d["samples"] == [7]
    assert any("as batch_axis says" in n for n in d["notes"])
