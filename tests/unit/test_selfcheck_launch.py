"""How the self-check child is started and re-started (docs/selfcheck.md): its environment,
and the command it execs into (the later check, or the CPU when the training GPU has no room)."""

from __future__ import annotations

import argparse
import os

import pytest

from replay.child import ROOT, SELF_CHECK
from replay.record.selfcheck import _child_env
from replay.workflows import selfcheck


def test_a_check_on_the_cpu_sees_no_gpu(monkeypatch):
    """Was: the "CPU fallback" re-ran a program that calls model.cuda() first, onto the
    training GPU it was meant to spare."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert _child_env(cpu_only=True)["CUDA_VISIBLE_DEVICES"] == ""
    assert _child_env()["CUDA_VISIBLE_DEVICES"] == "0"
    assert _child_env()["REPLAY_SELF_CHECK"] == "0"


def test_a_torchrun_job_of_one_process_is_not_joined_by_its_check(monkeypatch):
    """Was: under `torchrun --nproc-per-node 1` the re-run program's init_process_group used
    the job's own port."""
    for k, v in {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "10.1.2.3",
                 "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    env = _child_env()
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] != "29500"
    assert not any(k.startswith("TORCHELASTIC_") for k in env)


def _args(**kw):
    base = dict(run="run.h5", after=3, steps=4, device="cuda:0", rtol=None, training_pid=7,
                run_id="ab", later=150, start=None, earlier=None, report_fd=9,
                gpu_bytes=1 << 30)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("why", ["later", "no_room"])
def test_the_check_execs_into_the_next_one_with_what_it_needs(monkeypatch, why):
    seen = {}

    def execve(path, cmd, env=None):
        seen.update(path=path, cmd=cmd, env=env)
        raise OSError("not really")

    monkeypatch.setattr(os, "execv", lambda p, c: execve(p, c))
    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr(os, "dup2", lambda a, b: None)
    monkeypatch.setattr(selfcheck.atexit, "_run_exitfuncs", lambda: None)
    if why == "later":
        selfcheck._become_later_check(_args(), (0, 3), 9)
    else:
        change = {"device": "cpu", "rtol": selfcheck.RTOL, "gpu_bytes": None}
        selfcheck._exec_check(_args(), 9, change, cpu_only=True)
    cmd = seen["cmd"]
    assert cmd[3:5] == [ROOT, SELF_CHECK] and cmd[5] == "run.h5"
    flags = {a: b for a, b in zip(cmd, cmd[1:]) if a.startswith("--")}
    assert flags["--report-fd"] == "9" and flags["--training-pid"] == "7"
    if why == "later":
        assert flags["--after"] == "153" and flags["--from"] == "150" and "--later" not in cmd
        assert cmd[cmd.index("--earlier") + 1 : cmd.index("--earlier") + 3] == ["0", "3"]
        assert flags["--device"] == "cuda:0" and seen["env"] is None
    else:
        assert flags["--device"] == "cpu" and flags["--rtol"] == repr(selfcheck.RTOL)
        assert "--gpu-bytes" not in cmd and seen["env"]["CUDA_VISIBLE_DEVICES"] == ""
        assert flags["--later"] == "150"
