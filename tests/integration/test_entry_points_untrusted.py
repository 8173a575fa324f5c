"""A recording names the code replay imports and calls: treat that as untrusted input.

Regressions pinned here: ``os:abort`` as ``build_fn`` made ``bisect`` exit 134 with no message;
the recorded working directory was put first on ``sys.path``, so a recording could choose where
modules were imported from; a recording from another host was imported without a word. An
edited recording is foreign (docs/trust.md): the checks below hold even under ``--trust``.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import replay_cli, run_env, run_py

USERMOD = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F


    def build():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)


    def train_step(model, optimizer, batch):
        optimizer.zero_grad()
        loss = F.mse_loss(model(batch), batch.sum(1, keepdim=True))
        loss.backward()
        optimizer.step()
        return loss
    """
)

DRIVER = textwrap.dedent(
    """
    import sys
    import torch
    import replay
    from usermod import build, train_step

    if __name__ == "__main__":
        model, opt = build()
        with replay.Recorder(sys.argv[1], model=model, optimizer=opt, step_fn=train_step,
                             build_fn=build, snapshot_every=2) as rec:
            for _ in range(4):
                rec.step(torch.randn(4, 3))
    """
)


def cli(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return replay_cli(*args, cwd=cwd, timeout=180, **kw)


def rewrite_meta(path: Path, change) -> None:
    """Edit ``/meta/run`` as a stranger with h5py would."""
    with h5py.File(path, "r+") as f:
        meta = json.loads(f["meta/run"][()].tobytes().decode())
        change(meta)
        attrs = dict(f["meta/run"].attrs)
        del f["meta/run"]
        ds = f["meta"].create_dataset(
            "run", data=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        )
        ds.attrs.update(attrs)


@pytest.fixture(scope="module")
def module_run(tmp_path_factory):
    """A run whose entry points live in a module of the user's project (not ``__main__``)."""
    proj = tmp_path_factory.mktemp("proj")
    (proj / "usermod.py").write_text(USERMOD)
    (proj / "driver.py").write_text(DRIVER)
    p = run_py("driver.py", "run.h5", cwd=proj, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    return proj


def _copy(module_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run.h5"
    run.write_bytes((module_run / "run.h5").read_bytes())
    return run


def test_a_module_entry_point_replays_from_its_own_project(module_run, tmp_path):
    p = cli("verify", str(module_run / "run.h5"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"importing {module_run / 'usermod.py'}" in p.stderr


def test_the_recorded_working_directory_does_not_choose_what_is_imported(module_run, tmp_path):
    run = _copy(module_run, tmp_path)
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "evil-ran"
    (evil / "usermod.py").write_text(f"open({str(marker)!r}, 'w').close()\n" + USERMOD)

    def point_at_evil(meta):
        meta["env"]["cwd"] = str(evil)
        meta["env"]["sys_path0"] = str(evil)

    rewrite_meta(run, point_at_evil)
    refused = cli("verify", str(run), cwd=tmp_path)  # edited: foreign
    assert refused.returncode == 4 and "foreign" in refused.stderr, refused.stderr
    p = cli("verify", str(run), "--trust", cwd=tmp_path)  # trusted, still not from evil/
    assert p.returncode == 0, p.stderr
    assert not marker.exists()
    assert f"importing {module_run / 'usermod.py'}" in p.stderr


def test_a_standard_library_function_is_never_called_as_an_entry_point(module_run, tmp_path):
    run = _copy(module_run, tmp_path)

    def abort(meta):
        meta["entry"]["build_fn"] = {
            "module": "os",
            "qualname": "abort",
            "path": os.__file__,
            "sha256": None,
            "is_script": False,
        }

    rewrite_meta(run, abort)
    for cmd in (("verify",), ("bisect", "--until", "loss > 0")):  # (a step to replay)
        p = cli(*cmd, str(run), "--trust", cwd=tmp_path)
        assert p.returncode == 4, (cmd, p.returncode, p.stderr)
        assert "standard library or an installed package" in p.stderr
        assert "Traceback" not in p.stderr


def test_a_name_that_leads_out_of_the_recorded_file_is_refused(module_run, tmp_path):
    run = _copy(module_run, tmp_path)

    def reexport(meta):
        meta["entry"]["build_fn"]["qualname"] = "torch.manual_seed"  # usermod imports torch

    rewrite_meta(run, reexport)
    p = cli("verify", str(run), "--trust", cwd=tmp_path)
    assert p.returncode == 4, p.stderr
    assert "is not a function defined in" in p.stderr and "usermod.py" in p.stderr


def test_a_recording_from_another_host_needs_trust(module_run, tmp_path):
    """Another user's recording (here: read with another data directory, whose key did not
    sign it) is refused, naming what would be imported; its hostname field proves nothing."""
    run = _copy(module_run, tmp_path)
    other = {**run_env(), "REPLAY_HOME": str(tmp_path / "another-user")}
    p = cli("verify", str(run), cwd=tmp_path, env=other)
    assert p.returncode == 4
    assert "foreign" in p.stderr and "--trust" in p.stderr and "replay trust" in p.stderr
    assert str(module_run / "usermod.py") in p.stderr  # what would be imported
    assert "importing" not in p.stderr  # nothing was
    # --reenter would run the program instead: the refusal names that command
    prog = cli("verify", str(run), "--reenter", cwd=tmp_path, env=other)
    assert prog.returncode == 4 and "run.h5` in " in prog.stderr, prog.stderr
    assert f"`python {module_run / 'driver.py'} " in prog.stderr
    ok = cli("verify", str(run), "--trust", cwd=tmp_path, env=other)
    assert ok.returncode == 0, ok.stderr
    # The file saying "made here, by you" changes nothing for the user who did not sign it
    rewrite_meta(run, lambda meta: meta["env"].update(hostname=os.uname().nodename))
    again = cli("verify", str(run), cwd=tmp_path, env=other)
    assert again.returncode == 4 and "foreign" in again.stderr
