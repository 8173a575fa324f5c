"""ReplayCallback for Hugging Face: a real ``Trainer.train()`` recorded in a subprocess, then
replayed by the real CLI without a training loop (a 2-layer GPT-2 of width 16 or a small
classifier, both built from a config; random data; CPU; a few seconds each)."""

import difflib
import json
import subprocess
from pathlib import Path

import pytest

from replay.store.reader import open_recording
from tests.conftest import replay_here, replay_here_json, replay_json, run_py

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

HERE = Path(__file__).with_name("scripts")
RECORDED = HERE / "hf_recorded.py"


def _train(
    out: Path, *flags: str, script: Path = RECORDED
) -> tuple[Path, subprocess.CompletedProcess]:
    p = run_py(str(script), str(out), *flags, timeout=180)
    return out / "run.h5", p


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_healthy_train_replays_bitwise(tmp_path, precision):
    """GPT-2 with dropout, accumulation 2, max_grad_norm 0.5, AdamW, linear warm-up schedule;
    bf16 adds the accelerator's CPU autocast around the model's forward."""
    flags = ["--bf16"] if precision == "bf16" else []
    run, p = _train(tmp_path, *flags)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "RecorderWarning" not in p.stderr
    rc, v, err = replay_json("verify", str(run))
    assert rc == 0, err
    # 88 samples, batches of 8, 2 epochs: 22 micro-batches, windows of 2,2,2,2,2,1: 12 steps
    assert v["deterministic"] is True and v["window"] == [0, 11]
    assert all(s["match"] and s["compared"] for s in v["steps"])
    losses = [s["loss"] for s in v["steps"]]
    assert len(set(losses)) == len(losses)  # real, different steps
    # the norm before the clip to 0.5, as the Trainer logs it
    assert max(open_recording(run).health()["grad_norm"]) > 0.5
    if precision == "fp32":
        info = json.loads(replay_here("info", str(run), "--json").stdout)
        text = json.dumps(info)
        assert "replay.integrations.transformers" in text and "GPT2LMHeadModel" in text


def test_nan_is_found_at_its_step_with_its_op(tmp_path):
    """The 10th forward call (micro-batch 1 of optimisation step 4) takes log(h - 100)."""
    run, p = _train(tmp_path, "--model", "tiny", "--nan-at", "9")
    assert p.returncode != 0 and "NonFiniteLossError" in p.stderr
    rc, v, err = replay_json("bisect", str(run))
    assert rc == 0, err
    assert v["first_bad_step"] == 4 and v["kind"] == "nonfinite"
    assert v["op"] == "aten::log" and v["phase"] == "forward"
    assert v["reproducible"] is True
    assert "torch.log(h - 100.0)" in json.dumps(v["source"])


def test_an_exception_is_recorded_with_its_window(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(RECORDED.read_text().replace("h = torch.log(h - 100.0)", "h = h @ h"))
    run, p = _train(tmp_path, "--model", "tiny", "--nan-at", "9", script=script)
    assert p.returncode != 0 and "RuntimeError" in p.stderr
    rc, v, err = replay_json("bisect", str(run))
    assert rc == 0, err
    assert v["first_bad_step"] == 4 and v["kind"] == "exception"
    assert v["exception"]["type"] == "RuntimeError" and v["op"] == "aten::mm"


def test_the_callback_is_the_only_change_to_the_script():
    plain = (HERE / "hf_plain.py").read_text().splitlines()
    recorded = RECORDED.read_text().splitlines()
    changed = [
        line
        for line in difflib.unified_diff(plain, recorded, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    code = [c for c in changed if not c[1:].startswith(('"""', "log of a negative"))]
    code = [c for c in code if c[1:].strip()]
    assert code == [
        "+from replay.integrations.transformers import ReplayCallback",
        '+        callbacks=[ReplayCallback(f"{args.out}/run.h5")],',
    ], changed
    # and the plain script still trains
    with_plain = run_py(
        str(HERE / "hf_plain.py"), "/nonexistent-out", "--model", "tiny", timeout=180
    )
    assert with_plain.returncode == 0, with_plain.stderr[-2000:]


def _plain_module(script: Path) -> str:
    """The recorded script with TinyClassifier a plain nn.Module (no PreTrainedModel)."""
    return (
        script.read_text()
        .replace("class TinyClassifier(PreTrainedModel):", "class TinyClassifier(nn.Module):")
        .replace("super().__init__(config)", "super().__init__()\n        self.config = config")
        .replace("        self.post_init()\n", "")
    )


def test_model_init_and_a_trainer_subclass_replay_bitwise(tmp_path):
    """A plain nn.Module made by a module-level model_init, and a Trainer subclass whose own
    compute_loss smooths the labels: replay uses both."""
    script = tmp_path / "model_init.py"
    script.write_text(
        _plain_module(RECORDED)
        .replace(
            "def main() -> None:",
            "def make_model():\n"
            "    return TinyClassifier(TinyConfig())\n\n\n"
            "class SmoothTrainer(Trainer):\n"
            "    def compute_loss(self, model, inputs, return_outputs=False, "
            "num_items_in_batch=None):\n"
            "        out = model(**inputs)\n"
            "        loss = nn.functional.cross_entropy(\n"
            '            out["logits"], inputs["labels"], label_smoothing=0.1\n'
            "        )\n"
            "        return (loss, out) if return_outputs else loss\n\n\n"
            "def main() -> None:",
        )
        .replace(
            "    trainer = Trainer(\n        model=model,",
            "    trainer = SmoothTrainer(\n        model_init=make_model,",
        )
    )
    run, p = _train(tmp_path, "--model", "tiny", script=script)
    assert p.returncode == 0, p.stderr[-2000:]
    rc, v, err = replay_json("verify", str(run))
    assert rc == 0, err
    assert v["deterministic"] is True and v["window"] == [0, 11]
    assert all(s["match"] and s["compared"] for s in v["steps"])


def test_a_plain_module_without_model_init_and_its_own_optimizer_replays_by_reentry(tmp_path):
    """A plain nn.Module (no config, no model_init) and an optimizer the script hands the
    Trainer (optimizers=...): replay runs the script again and takes them over in train()."""
    script = tmp_path / "plain_module.py"
    script.write_text(
        _plain_module(RECORDED).replace(
            "    trainer = Trainer(\n        model=model,",
            "    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)\n"
            "    trainer = Trainer(\n        optimizers=(opt, None),\n        model=model,",
        )
    )
    run, p = _train(tmp_path, "--model", "tiny", script=script)
    assert p.returncode == 0 and "RecorderWarning" not in p.stderr, p.stderr[-2000:]
    rc, v, err = replay_json("verify", str(run))
    assert rc == 0 and v["deterministic"] is True and v["window"] == [0, 11], err[-3000:]
    assert "again, up to its replay.Recorder" in err
    rc, d, err = replay_here_json("info", str(run))
    assert "SGD" in json.dumps(d)
