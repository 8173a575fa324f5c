"""A failing disk never stops training: one warning, recording off, flushed steps stay readable."""

from __future__ import annotations

import numpy as np

from replay.store import open_recording
from tests.conftest import SCRIPTS, run_py

# Run the test script under a file-size limit: writes past it fail with EFBIG, a real I/O error
# from the kernel (the same path as a full disk), without needing a mount.
LIMITED = """
import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_disk_full_during_recording_leaves_training_running(tmp_path):
    script = str(SCRIPTS / "mlp_train.py")
    args = ["--steps", "300", "--snapshot-every", "5", "--keep", "4", "--vary"]
    full = tmp_path / "full.h5"  # how big the file gets when nothing fails
    run_py(script, str(full), *args, check=True)
    limit = int(full.stat().st_size * 0.7)  # the disk fills up part-way through the run
    out = tmp_path / "run.h5"
    proc = run_py("-c", LIMITED, str(limit), script, str(out), *args)
    assert proc.returncode == 0, proc.stderr
    assert "step 299" in proc.stdout  # every step trained
    warnings = [ln for ln in proc.stderr.splitlines() if "RecorderWarning" in ln]
    assert len(warnings) == 1 and "stopped" in warnings[0] and "training goes on" in warnings[0]
    with open_recording(out) as rec:  # what was flushed before the failure is readable
        h = rec.health()
        assert len(h["step"]) > 0
        assert np.all(np.diff(h["step"]) == 1)
        # The ring stops part-way. (Not the health rows: a group's rows are committed first,
        # before its steps, so the group whose write failed may have them all; under load, one
        # group held the run's last hundred steps and the rows reached step 299.)
        steps = rec.steps()
        assert len(steps) > 0 and steps[-1] < 299
        assert rec.replayable_window() is not None


def test_unwritable_path_warns_once_and_trains(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_py(str(SCRIPTS / "mlp_train.py"), str(blocker / "run.h5"), "--steps", "20")
    assert proc.returncode == 0, proc.stderr
    assert "step 19" in proc.stdout
    assert proc.stderr.count("RecorderWarning") == 1
    assert "Traceback" not in proc.stderr


def test_the_writer_thread_and_process_yield_the_cores_to_training(tmp_path):
    """Both writers run at WRITER_NICE (Linux threads have their own nice value): below training,
    yet high enough to keep up with it (at nice 19 they fell behind for good on 2 busy cores)."""
    import os
    import sys
    import threading

    import pytest
    import torch

    import replay
    from replay.store.writer_process import WRITER_NICE
    from tests.integration.scripts import mlp_train

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread nice values are a Linux feature")
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    model, opt = mlp_train.build()
    with replay.Recorder(
        tmp_path / "run.h5",
        model=model,
        optimizer=opt,
        step_fn=mlp_train.train_step,
        build_fn=mlp_train.build,
        handle_signals=False,
    ) as rec:
        rec.step((torch.randn(8, 16), torch.randint(0, 4, (8,))))
        writer = next(t for t in threading.enumerate() if t.name == "replay-writer")
        assert os.getpriority(os.PRIO_PROCESS, writer.native_id) == WRITER_NICE
        assert os.getpriority(os.PRIO_PROCESS, rec.transport.client.proc.pid) == WRITER_NICE
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own  # untouched


UNKNOWN_WRAPPER = """
import torch, torch.nn.functional as F, replay

class HalfBuiltOptimizer(torch.optim.Optimizer):
    # A wrapper that never calls Optimizer.__init__ (accelerate's AcceleratedOptimizer did not):
    # no step hooks, no .optimizer to find the real one through.
    def __init__(self, inner):
        self.inner = inner
    @property
    def param_groups(self):
        return self.inner.param_groups
    def step(self, closure=None):
        return self.inner.step(closure)
    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)
    def state_dict(self):
        return self.inner.state_dict()
    def load_state_dict(self, sd):
        self.inner.load_state_dict(sd)

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = HalfBuiltOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))

def step(batch):
    x, y = batch
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss

with replay.Recorder(RUN, model=model, optimizer=opt, step_fn=step) as rec:
    for i in range(5):
        print("step", i, float(rec.step((torch.randn(3, 4), torch.randn(3, 2)))))
"""


def test_an_optimizer_wrapper_without_torch_hooks_never_crashes_training(tmp_path):
    """accelerate's AcceleratedOptimizer crashed the training script at Recorder(...): an
    object the recorder does not know turns recording off with one warning, never raises."""
    run = tmp_path / "run.h5"
    script = tmp_path / "train.py"
    script.write_text(f"RUN = {str(run)!r}\n" + UNKNOWN_WRAPPER)
    proc = run_py(str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 4" in proc.stdout
    warnings = [ln for ln in proc.stderr.splitlines() if "RecorderWarning" in ln]
    assert len(warnings) == 1 and "training goes on unrecorded" in warnings[0], proc.stderr
    assert "_optimizer_step_pre_hooks" in warnings[0]
    assert "Traceback" not in proc.stderr
