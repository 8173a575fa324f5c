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

import contextlib
import os
import subprocess
import threading
import warnings
from typing import Any

import torch

from ..child import ROOT, SELF_CHECK, free_port, python_module
from ..errors import RecorderWarning, warn_at_user_line
from ..store.selfcheck import RTOL, SelfCheck, read_selfcheck, write_selfcheck
from .config import RecorderConfig

__all__ = ["SelfCheckLauncher", "ENV"]

ENV = "REPLAY_SELF_CHECK"
CONTEXT_BYTES = 768 << 20  # a second process's CUDA context and allocator slack on that GPU


class SelfCheckLauncher:
    """Starts the check after step ``at``; a skipped check writes its reason at once."""

    def __init__(
        self,
        path: str,
        run_id: str,
        config: RecorderConfig,
        state_bytes: int,
        model: torch.nn.Module,
        skip: str | None,
    ) -> None:
        self.path = path
        self.run_id = run_id
        self.first = config.start_step
        self.steps = max(1, config.self_check_steps)
        self.at = self.first + self.steps - 1
        # the run's snapshot once the dense ring has turned over (module docstring)
        self.later = self.first + config.keep_snapshots * config.snapshot_every
        self.budget = config.self_check_budget
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

    def at_close(self, made_at: tuple[str, int] | None) -> None:
        """The recording closed with the check still running (a short run, or cores the
        training keeps busy: it runs at the lowest priority): say so once, or the run would end
        as if it had been proven to replay."""
        proc = self.proc
        try:
            if proc is None or proc.poll() is not None:
                return
            v = read_selfcheck(self.path, self.run_id, as_written=True)
        except Exception:  # noqa: BLE001 - closing never fails for the self-check's sake
            return
        if v is None or v.status != "running":
            return
        warn_at_user_line(  # (``made_at``, the Recorder's line, at interpreter exit)
            f"replay: the self-check of {self.path} had not finished when the recording closed "
            "(it goes on at the lowest priority while this process lives): that it replays is "
            f"not proven yet; `replay verify {self.path}` checks it",
            made_at,
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
        device, rtol, need = self._device()
        cmd = python_module(SELF_CHECK, self.path)
        cmd += ["--after", str(t), "--steps", str(self.steps), "--training-pid", str(os.getpid())]
        cmd += ["--run-id", self.run_id]
        if self.later > t:
            cmd += ["--later", str(self.later)]
        if device is not None:
            cmd += ["--device", device]
        if rtol is not None:
            cmd += ["--rtol", repr(rtol)]
        if need is not None:
            cmd += ["--gpu-bytes", str(need)]
        # The child holds none of the training's descriptors: its one line comes back through
        # a pipe, and a thread of this process writes it on our stderr (a `| tee` of the run
        # ends with the run, whatever the check does).
        read, write = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [*cmd, "--report-fd", str(write)],
                env=_child_env(cpu_only=device == "cpu"),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=(write,),
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        running = SelfCheck("running", steps=(self.first, t), run_id=self.run_id, pid=self.proc.pid)
        write_selfcheck(self.path, running)
        threading.Thread(
            target=self._relay, args=(read, self.proc), name="replay-self-check", daemon=True
        ).start()

    def _relay(self, read: int, proc: subprocess.Popen[bytes]) -> None:
        """Copy what the check says onto the training's stderr until it exits; then reap it,
        and when it died without a verdict, say so in the verdict's place (never "running")."""
        try:
            with contextlib.suppress(OSError):
                while chunk := os.read(read, 4096):
                    os.write(2, chunk)
        finally:
            os.close(read)
        code = proc.wait()
        v = read_selfcheck(self.path, self.run_id, as_written=True)
        if v is not None and v.status == "running" and v.pid == proc.pid:
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            dead = SelfCheck(
                "error",
                summary=f"the self-check process (pid {proc.pid}) ended ({how}) before its verdict",
                run_id=self.run_id,
                pid=proc.pid,
            )
            # a link or device put at the verdict's name is refused (UnsafePath): this thread
            # runs in the training process and must not print a traceback into its stderr
            with contextlib.suppress(OSError):
                write_selfcheck(self.path, dead)

    def _device(self) -> tuple[str | None, float | None, int | None]:
        """Where to replay, the tolerance, and the GPU memory a replay there needs: the
        recording's own GPU when it has room for a second training (bitwise), else the CPU
        (within ``RTOL``). A second training needs what this one peaked at (state, gradients,
        activations), the engine's two checkpoints of the state, and a CUDA context: never a
        second model on the training GPU without that room. The child reads the free memory
        again right before it replays (the later check may start hours on)."""
        p = next(self.model.parameters(), None)
        if p is None or p.device.type != "cuda":
            return None, None, None
        try:
            free, _ = torch.cuda.mem_get_info(p.device)
            peak = torch.cuda.max_memory_allocated(p.device)
        except RuntimeError:
            free = peak = 0
        need = peak + 2 * self.state_bytes + CONTEXT_BYTES
        # cuDNN's autotuner picks kernels by timing them: a replay beside training may pick
        # others, so only a tolerance can be asked of it
        rtol = RTOL if torch.backends.cudnn.benchmark else None
        if free > need:
            return str(p.device), rtol, need
        return "cpu", RTOL, None


def _child_env(cpu_only: bool = False) -> dict[str, str]:
    """The check's environment: no self-check of its own, one thread; ``cpu_only``: no GPU
    visible at all (a program that calls ``.cuda()`` cannot put a second model on the training
    GPU; replay maps the recorded state onto the CPU). A torchrun job of one process is left
    its own port: the re-run's ``init_process_group`` makes a group of its own, never joining
    the job's rendezvous."""
    env = {**os.environ, ENV: "0"}
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if env.get("WORLD_SIZE") == "1" and "MASTER_PORT" in env:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0")
        env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        for k in [k for k in env if k.startswith("TORCHELASTIC_")]:
            del env[k]
    # The child imports this replay, wherever the training process found it.
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
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
