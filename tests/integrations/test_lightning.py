"""ReplayCallback for PyTorch Lightning: a real ``Trainer.fit()`` recorded in a subprocess, then
replayed by the real CLI without a training loop (tiny MLP, random data, CPU, a few seconds)."""

import difflib
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import replay_cli, replay_here, replay_json, run_py, run_until_checked

pytest.importorskip("lightning")

HERE = Path(__file__).with_name("scripts")


def _fit(out: Path, *flags: str) -> tuple[Path, subprocess.CompletedProcess]:
    p = run_py(str(HERE / "lightning_recorded.py"), str(out), *flags, timeout=180)
    return out / "run.h5", p


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_a_healthy_fit_replays_bitwise(tmp_path, precision):
    """Accumulation 2, clipping 0.5, dropout, a step-interval StepLR; 16-mixed adds the
    GradScaler (scale, unscale, skipped steps) that Lightning's precision plugin drives."""
    run, p = _fit(tmp_path, "--precision", precision)
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, err = replay_json("verify", str(run))
    assert rc == 0, err
    # 96 samples, batches of 8, 2 epochs: 24 micro-batches, 12 optimisation steps
    assert v["deterministic"] is True and v["window"] == [0, 11]
    assert all(s["match"] and s["compared"] for s in v["steps"])
    losses = [s["loss"] for s in v["steps"]]
    assert len(set(losses)) == len(losses)  # real, different steps
    info = replay_here("info", str(run), "--json")
    meta = json.loads(info.stdout)
    text = json.dumps(meta)
    assert "replay.integrations.lightning" in text
    assert ("GradScaler" in text) == (precision == "16-mixed")


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    """The 10th training_step call (micro-batch 1 of optimisation step 4) takes sqrt(h - 100)."""
    run, p = _fit(tmp_path_factory.mktemp("lightning-nan"), "--nan-at", "9")
    assert p.returncode != 0 and "NonFiniteLossError" in p.stderr
    return run


def test_nan_is_found_at_its_step_with_its_op(nan_run):
    run = nan_run
    rc, v, err = replay_json("bisect", str(run))
    assert rc == 0, err
    assert v["first_bad_step"] == 4 and v["kind"] == "nonfinite"
    assert v["op"] == "aten::sqrt" and v["phase"] == "forward"
    assert v["reproducible"] is True
    assert "torch.sqrt(h - 100.0)" in json.dumps(v["source"])


def test_export_of_a_lightning_recording_writes_its_rng_state_tensors_into_skip_json(
    nan_run, tmp_path
):
    """Lightning's per-step values hold the micro-batches' RNG states, tensors: export died
    writing skip.json ("Object of type Tensor is not JSON serializable", exit 6)."""
    rc, d, err = replay_json("export", str(nan_run), "--out", str(tmp_path / "ck"))
    assert rc == 0, err[-2000:]
    skip = json.loads((tmp_path / "ck" / "skip.json").read_text())
    assert skip["first_bad"] == 4 and skip["skip"][0]["step"] == 4, skip
    values = skip["skip"][0]["values"]
    assert values["micro_rng"] and all(r.startswith("tensor uint8[") for r in values["micro_rng"])


def test_the_callback_is_the_only_change_to_the_script():
    plain = (HERE / "lightning_plain.py").read_text().splitlines()
    recorded = (HERE / "lightning_recorded.py").read_text().splitlines()
    changed = [
        line
        for line in difflib.unified_diff(plain, recorded, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    code = [c for c in changed if not c[1:].startswith(('"""', "(counted", "Usage"))]
    code = [c for c in code if c[1:].strip()]
    assert code == [
        "+from replay.integrations.lightning import ReplayCallback",
        '+        callbacks=[ReplayCallback(f"{args.out}/run.h5")],',
    ], changed
    # and the plain script still trains
    with_plain = run_py(str(HERE / "lightning_plain.py"), "/nonexistent-out", timeout=180)
    assert with_plain.returncode == 0, with_plain.stderr[-2000:]


def test_manual_optimisation_records_what_it_can_and_bisect_says_why_it_cannot_replay(tmp_path):
    """Replay does not rebuild manual optimisation: said once, and the steps' health, batches
    and RNG states are recorded without snapshots. info reads them; bisect and verify refuse
    with the reason, naming the first failure the health shows."""
    script = tmp_path / "manual.py"
    script.write_text(
        (HERE / "lightning_recorded.py")
        .read_text()
        .replace(
            "self.save_hyperparameters()",
            "self.save_hyperparameters()\n        self.automatic_optimization = False",
        )
        .replace(
            "        loss = nn.functional.cross_entropy(self.head(h), y)\n",
            "        loss = nn.functional.cross_entropy(self.head(h), y)\n"
            "        opt = self.optimizers()\n"
            "        opt.zero_grad()\n"
            "        self.manual_backward(loss)\n"
            "        opt.step()\n",
        )
        .replace("        accumulate_grad_batches=2,\n        gradient_clip_val=0.5,\n", "")
    )
    p = run_py(str(script), str(tmp_path), "--nan-at", "5", timeout=180)
    assert p.stderr.count("manual optimisation") == 1, p.stderr[-2000:]
    assert "records their health, batches and RNG states" in p.stderr
    assert "NonFiniteLossError" in p.stderr  # the NaN of step 5 ended fit(), as recorded
    info = replay_here("info", str(tmp_path / "run.h5"), "--json")
    assert info.returncode == 0, info.stderr
    d = json.loads(info.stdout)
    assert d["steps_recorded"] == 6 and d["snapshots"] == [] and d["replayable_window"] is None
    assert "manual optimisation" in d["not_replayable"]
    assert d["first_bad"]["nonfinite"] == 5
    text = replay_here("info", str(tmp_path / "run.h5")).stdout
    assert "nothing: recorded without replay (manual optimisation" in text
    for cmd in ("bisect", "verify"):
        b = replay_cli(cmd, str(tmp_path / "run.h5"))
        assert b.returncode == 3, b.stderr
        assert "recorded without replay (manual optimisation" in b.stderr
        assert "first failure in its health is at step 5" in b.stderr
        assert "Traceback" not in b.stderr


def _variant(tmp_path: Path, namespace: str) -> Path:
    """lightning_recorded.py as most tutorials write it: no save_hyperparameters() (the
    constructor's arguments kept as attributes), in the ``namespace`` package."""
    text = (
        (HERE / "lightning_recorded.py")
        .read_text()
        .replace("self.save_hyperparameters()", "self.nan_at, self.lr = nan_at, lr")
        .replace("self.hparams.", "self.")
    )
    if namespace == "pytorch_lightning":
        text = text.replace("import lightning.pytorch as L", "import pytorch_lightning as L")
        text = text.replace("from lightning.pytorch.plugins", "from pytorch_lightning.plugins")
    assert "save_hyperparameters" not in text and "hparams" not in text
    script = tmp_path / "variant.py"
    script.write_text(text)
    return script


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_a_module_without_save_hyperparameters_replays_by_reentry_in_both_namespaces(
    tmp_path, namespace
):
    """Lightning's own examples never call save_hyperparameters(); most tutorials import
    pytorch_lightning. Replay runs the script again and takes over in fit()."""
    pytest.importorskip(namespace)
    script = _variant(tmp_path, namespace)
    p = run_py(str(script), str(tmp_path), timeout=180)
    assert p.returncode == 0 and "RecorderWarning" not in p.stderr, p.stderr[-2000:]
    rc, v, err = replay_json("verify", str(tmp_path / "run.h5"))
    assert rc == 0 and v["deterministic"] is True and v["window"] == [0, 11], err[-3000:]
    assert "again, up to its replay.Recorder" in err


def test_pytorch_lightning_nan_is_found_at_its_step_with_its_op(tmp_path):
    pytest.importorskip("pytorch_lightning")
    script = _variant(tmp_path, "pytorch_lightning")
    p = run_py(str(script), str(tmp_path), "--nan-at", "9", timeout=180)
    assert p.returncode != 0 and "NonFiniteLossError" in p.stderr
    rc, v, err = replay_json("bisect", str(tmp_path / "run.h5"))
    assert rc == 0, err[-3000:]
    assert v["first_bad_step"] == 4 and v["op"] == "aten::sqrt" and v["reproducible"] is True


def _cli(out: Path, *flags: str) -> list[str]:
    """lightning_cli.py's command line with the callback added as docs/integrations.md says."""
    return [
        str(HERE / "lightning_cli.py"),
        "fit",
        "--trainer.callbacks+=replay.integrations.lightning.ReplayCallback",
        f"--trainer.callbacks.path={out}/run.h5",
        f"--trainer.default_root_dir={out}",
        "--trainer.accelerator=cpu",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        *flags,
    ]


def test_lightningcli_replays_though_its_config_file_exists_and_leaves_that_file_alone(tmp_path):
    """A LightningCLI program wired from the command line alone. Its SaveConfigCallback refuses a
    config.yaml that exists, and the recorded run wrote one: the self-check and every replay
    died "SaveConfigCallback expected .../config.yaml to NOT exist" before the take-over."""
    pytest.importorskip("jsonargparse")
    p = run_until_checked(*_cli(tmp_path, "--trainer.max_epochs=3"), cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    check = json.loads((tmp_path / "run.selfcheck.json").read_text())
    assert check["status"] == "ok", check
    config = (tmp_path / "config.yaml").read_bytes()
    rc, v, err = replay_json("verify", str(tmp_path / "run.h5"))
    assert rc == 0 and v["deterministic"] is True and v["window"] == [0, 23], err[-3000:]
    assert (tmp_path / "config.yaml").read_bytes() == config


def test_lightningcli_nan_is_found_at_its_step_with_its_op(tmp_path):
    pytest.importorskip("jsonargparse")
    p = run_py(*_cli(tmp_path, "--trainer.max_epochs=2", "--model.nan_at=11"), timeout=300)
    assert "NonFiniteLossError" in p.stderr, p.stderr[-3000:]
    rc, v, err = replay_json("bisect", str(tmp_path / "run.h5"))
    assert rc == 0, err[-3000:]
    assert v["first_bad_step"] == 11 and v["op"] == "aten::sqrt" and v["reproducible"] is True
    assert "torch.sqrt(out - 100.0)" in json.dumps(v["source"])


def test_a_fit_of_large_batches_keeps_the_steps_its_budget_allows(tmp_path):
    """Was: a framework's first step hands its batch over only at its end, after the snapshot
    before it had sized the file's rings from a guess of 16 KiB a step: 256 KiB batches under
    ``keep_bytes`` of 8 MiB kept 500 steps (the default budget, 15,000 steps whatever their
    size). The rings are sized from the first batch now, as ``Recorder.step`` sizes them: the
    dense tier's 150 steps, the fewest a plan keeps."""
    p = run_py(str(HERE / "lightning_big_batches.py"), str(tmp_path), "20", timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    info = json.loads(replay_here("info", str(tmp_path / "run.h5"), "--json").stdout)
    assert info["reach"]["step_slots"] == 150, info["reach"]
    rc, v, err = replay_json("verify", str(tmp_path / "run.h5"))
    assert rc == 0 and v["deterministic"] is True and v["window"] == [0, 19], err
