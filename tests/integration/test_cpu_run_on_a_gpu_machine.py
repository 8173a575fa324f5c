"""A CPU run on a machine with GPUs stays off them, recording and replaying (issue 43).

The recorder named the machine's GPUs for the file's environment (``record/env.py``) from the
writer thread after the first step: ``torch.cuda.get_device_name`` initialises CUDA, so a CPU
run took a context on a GPU someone else may be training on, every later step went the writer
thread's way instead of the step log (``transport._host_run`` reads ``is_initialized``), and
``replay info`` read the run as a CUDA run. A replay named them too (``numerics.current_env``),
so a CPU replay, a CPU run's self-check among them, took a GPU context beside the training.

This machine has no GPU, so the program (``scripts/cpu_run_gpu_machine.py``) makes
``torch.cuda`` say two devices are there and counts every initialisation of CUDA.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import replay_json, run_py

SCRIPT = Path(__file__).with_name("scripts") / "cpu_run_gpu_machine.py"


def test_a_cpu_run_on_a_gpu_machine_never_initialises_cuda(tmp_path: Path) -> None:
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    p = run_py(SCRIPT.name, "run.h5", cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "RecorderWarning" not in p.stderr, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [], "CUDA initialised while recording"
    rc, info, err = replay_json("info", "run.h5", cwd=tmp_path)
    assert rc == 0 and info["steps_recorded"] == 12, (info, err)
    assert info["env"]["devices"] == []
    assert info["bitwise_cuda"] is None  # a CPU run: no GPU to replay bitwise on
    # The replay runs the program again (its torch.cuda says GPUs too): bitwise, and CUDA never
    # initialised (an initialisation raises in the program, which fails the replay).
    rc, verify, err = replay_json("verify", "run.h5", cwd=tmp_path)
    assert rc == 0 and verify["deterministic"] is True, (verify, err[-3000:])
    assert "numerics differ" not in err
