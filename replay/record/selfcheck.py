"""Starting the self-check from the training process (docs/selfcheck.md).

Once the first snapshot and ``self_check_steps`` steps are recorded, the Recorder starts one
child process, ``python -m replay.workflows.selfcheck``, at the lowest priority with one
thread, and goes on: nothing here waits for it, and nothing it does can fail training. The
child replays those steps and writes the verdict beside the recording; a failure reaches the
training's stderr as one line. When they replay, the same child then waits for the run's
snapshot at ``later`` (once the dense ring has turned over: ``keep_snapshots * snapshot_every``
steps in) and replays ``steps`` steps from it: a snapshot taken once training is under way. ``REPLAY_SELF_CHECK=0`` in the environment turns it off for every
Recorder of the process (the test suite does); ``Recorder(self_check=False)`` for one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from typing import Any

import torch

from ..errors import RecorderWarning
from ..store.selfcheck import SelfCheck, write_selfcheck

__all__ = ["SelfCheckLauncher", "ENV"]

ENV = "REPLAY_SELF_CHECK"
RTOL = 1e-3  # a GPU run checked on the CPU: losses within this, not bitwise


class SelfCheckLauncher:
    """Starts the check after step ``at``; a skipped check writes its reason at once."""

    def __init__(
        self,
        path: str,
        run_id: str,
        first_step: int,
        steps: int,
        budget: int,
        state_bytes: int,
        model: torch.nn.Module,
        skip: str | None,
        later: int | None = None,
    ) -> None:
        self.path = path
        self.later = later
        self.run_id = run_id
        self.steps = max(1, steps)
        self.at = first_step + self.steps - 1
        self.first = first_step
        self.budget = budget
        self.state_bytes = state_bytes
        self.model = model
        self.skip = skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.done = False

    def after_step(self, t: int) -> None:
        """Called after each recorded step; starts the check once, after step ``at``."""
        if self.done or t < self.at:
            return
        self.done = True
        try:
            self._start(t)
        except Exception as e:  # noqa: BLE001 - the self-check must never take training down
            warnings.warn(
                f"replay: the self-check of {self.path} could not start ({type(e).__name__}: "
                f"{e}); run `replay preflight` to check that the recording replays",
                RecorderWarning,
                stacklevel=3,
            )

    def _skipped(self, why: str) -> None:
        write_selfcheck(self.path, SelfCheck("skipped", summary=why, run_id=self.run_id))

    def _start(self, t: int) -> None:
        if self.skip is not None:
            self._skipped(self.skip)
            return
        if self.state_bytes > self.budget:
            self._skipped(
                f"the state ({self.state_bytes / 2**30:.1f} GiB) is over the self-check's "
                f"budget ({self.budget / 2**30:.1f} GiB, Recorder(self_check_budget=...)); "
                "run `replay preflight` to check it"
            )
            return
        device, rtol = self._device()
        cmd = [sys.executable, "-m", "replay.workflows.selfcheck", self.path]
        cmd += ["--after", str(t), "--steps", str(self.steps), "--training-pid", str(os.getpid())]
        cmd += ["--run-id", self.run_id]
        if self.later is not None and self.later > t:
            cmd += ["--later", str(self.later)]
        if device is not None:
            cmd += ["--device", device]
        if rtol is not None:
            cmd += ["--rtol", repr(rtol)]
        write_selfcheck(self.path, SelfCheck("running", steps=(self.first, t), run_id=self.run_id))
        self.proc = subprocess.Popen(
            cmd,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )

    def _device(self) -> tuple[str | None, float | None]:
        """Where to replay: the recording's own device when it has room for a second copy of
        the state (bitwise), else the CPU (within ``RTOL``)."""
        p = next(self.model.parameters(), None)
        if p is None or p.device.type != "cuda":
            return None, None
        try:
            free, _ = torch.cuda.mem_get_info(p.device)
        except RuntimeError:
            free = 0
        if free > 2 * self.state_bytes + (256 << 20):
            return str(p.device), None
        return "cpu", RTOL

    def reap(self) -> None:
        """At close: collect the child if it has finished (never waits for it)."""
        if self.proc is not None and self.proc.poll() is not None:
            self.proc = None


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env[ENV] = "0"
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    # The child imports this replay, wherever the training process found it.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def enabled_by_env() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def skip_reason(recorder: Any) -> str | None:
    """Why this Recorder's run is not self-checked, or ``None``."""
    if recorder.not_replayable is not None:
        return f"recorded without replay ({recorder.not_replayable})"
    if recorder.dist is not None:
        return (
            "a rank set (one file per rank) is checked with every rank together: "
            "`replay preflight -- torchrun ...`"
        )
    return None
