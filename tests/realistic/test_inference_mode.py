"""A step that computes part of its work under ``torch.inference_mode()`` (a DQN's target
values, an RL critic's bootstrap, an evaluation inside the step): the trace reads every op's
output, and an inference tensor has no version counter."""

import json

from tests.conftest import run_py
from tests.realistic.test_real_programs import PROGRAMS, replay


def test_a_step_with_inference_mode_gets_the_verdict_it_gets_under_no_grad(tmp_path):
    """dqn.py with its target values under inference_mode instead of no_grad. Was: the tracer
    read ``_version`` of the first inference tensor, which raises, so the trace ended at the
    first op and bisect said "no op made a non-finite value" with cause none."""
    script = tmp_path / "dqn.py"
    text = (PROGRAMS / "dqn.py").read_text()
    target = "    with torch.no_grad():\n        next_state_values[non_final_mask]"
    assert target in text
    script.write_text(text.replace(target, target.replace("no_grad", "inference_mode")))
    p = run_py(str(script), "run.h5", cwd=tmp_path, timeout=180)
    assert p.returncode == 3 and "loss is nan at step 55" in p.stderr, p.stderr[-2000:]
    b = replay("bisect", str(tmp_path / "run.h5"), "--json", cwd=tmp_path)
    d = json.loads(b.stdout)
    assert (d["first_bad_step"], d["kind"], d["cause"]) == (55, "nonfinite", "data"), d
    assert [t["name"] for t in d["data"]["tensors"]] == ["batch[5].state"]
    assert d["samples"] == [5] and d["reproducible"] is True
    assert not any("tracing step" in n for n in d["notes"]), d["notes"]
