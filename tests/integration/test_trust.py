"""Trust is granted by the user, never claimed by the file (docs/trust.md).

Regressions pinned here: the "made elsewhere" check read ``hostname`` and ``uid`` from the file,
so a recording whose program was ``python -m timeit -s "<payload>"`` (nothing on disk but the
.h5) ran its payload through bisect, verify, trace, whatif, export and overfit with those fields
removed, copied from this host or mistyped; a module program's refusal named ``train.py`` while
``--trust`` then ran ``shipped/trainmod.py``; rank files of different runs were replayed as one.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import textwrap
import timeit
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT, replay_cli, run_py

PROGRAM = textwrap.dedent(
    """
    import torch, replay
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        opt.zero_grad()
        loss = (model(batch) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    with replay.Recorder("run.h5", objects={"model": model, "optimizer": opt}, step_fn=step,
                         snapshot_every=2) as rec:
        for i in range(4):
            rec.step(torch.full((2, 3), float(i)))
    """
)

REFUSED = 4  # EXIT_BAD_ENTRY: the refusal of a foreign recording's code


@pytest.fixture(scope="module")
def own_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A re-entry recording of the user's own program, signed by the suite's key."""
    d = tmp_path_factory.mktemp("own")
    (d / "prog.py").write_text(PROGRAM)
    p = run_py(str(d / "prog.py"), cwd=d)
    assert p.returncode == 0, p.stderr
    return d / "run.h5"


def _blob(f: h5py.File, name: str) -> Any:
    return json.loads(f[name][()].tobytes().decode())


def _put(f: h5py.File, name: str, value: Any) -> None:
    """Replace a JSON blob as a stranger with h5py would."""
    del f[name]
    f.create_dataset(name, data=np.frombuffer(json.dumps(value).encode(), dtype=np.uint8))


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def _origin(env: dict[str, Any], how: str) -> None:
    if how == "removed":
        env.pop("hostname", None)
        env.pop("uid", None)
    elif how == "copied":
        env["hostname"], env["uid"] = socket.gethostname(), os.getuid()
    else:  # mistyped
        env["hostname"], env["uid"] = 12345, str(os.getuid())


def _timeit_attack(own_run: Path, tmp_path: Path, how: str) -> tuple[Path, Path, str]:
    """``own_run`` turned into ``python -m timeit -s "<payload>"``: a standard-library module,
    nothing on disk but the file."""
    run, marker = _copy(own_run, tmp_path / "run.h5"), tmp_path / "pwned"
    says = "sys.stderr.write('PAYLOAD' + ' RAN')"  # (the refusal quotes the code, not this)
    payload = f"import sys; {says}; open({str(marker)!r}, 'w').close()"
    with h5py.File(run, "r+") as f:
        meta = _blob(f, "meta/run")
        meta["program"] = {"kind": "module", "module": "timeit", "path": timeit.__file__}
        meta["env"].update(argv=["timeit", "-s", payload, "pass"], cwd=str(tmp_path))
        _origin(meta["env"], how)
        meta.pop("signature", None)
        _put(f, "meta/run", meta)
    return run, marker, shlex.join(["python", "-m", "timeit", "-s", payload, "pass"])


# (bisect answers a run whose health shows nothing from the file alone, running no code: a
# predicate every step matches makes it replay)
ANY_STEP = ("--until", "loss > 0")
COMMANDS: list[tuple[str, ...]] = [
    ("bisect", *ANY_STEP),
    ("verify",),
    ("trace", "--step", "1"),
    ("whatif", "--seed", "1"),
    ("export", "--out", "OUT"),
    ("overfit",),
]
HOW = ["removed", "copied", "mistyped"]


@pytest.mark.parametrize(
    "command,how",
    [(c, HOW[i % 3]) for i, c in enumerate(COMMANDS)]
    + [(c, HOW[(i + 1) % 3]) for i, c in enumerate(COMMANDS[:3])],
    ids=lambda v: v[0] if isinstance(v, tuple) else v,
)
def test_a_standard_library_module_program_runs_nothing_without_trust(
    own_run: Path, tmp_path: Path, command: tuple[str, ...], how: str
) -> None:
    run, marker, cmd = _timeit_attack(own_run, tmp_path, how)
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command[1:]]
    p = replay_cli(command[0], str(run), *args, cwd=tmp_path, timeout=120)
    assert p.returncode == REFUSED, p.stderr
    assert not marker.exists() and "PAYLOAD RAN" not in p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("replay: error:")]
    assert len(err) == 1, p.stderr  # one line
    assert cmd in err[0] and f"in {tmp_path}" in err[0] and timeit.__file__ in err[0]
    assert "--trust" in err[0] and f"replay trust {run}" in err[0]
    assert "Traceback" not in p.stderr


def test_a_crafted_healthy_recording_is_answered_from_the_file_without_running_anything(
    own_run: Path, tmp_path: Path
) -> None:
    """bisect of a run whose health shows no symptom answers from the file alone: no refusal
    is needed, since nothing of the recording's runs (it never re-ran the program to say so)."""
    run, marker, _ = _timeit_attack(own_run, tmp_path, "copied")
    p = replay_cli("bisect", str(run), cwd=tmp_path, timeout=120)
    assert p.returncode == 1 and p.stdout.startswith("healthy: "), p.stderr
    assert not marker.exists() and "PAYLOAD RAN" not in p.stderr and p.stderr == ""


def test_the_crafted_program_is_a_real_payload_under_trust(own_run: Path, tmp_path: Path) -> None:
    """The attack above is one: with --trust, the payload runs (and the program, which never
    constructs a Recorder, is then refused on its own). Its marker file is one replay removes
    after a re-run (hands_off.py), so the payload also says it ran."""
    run, _, _ = _timeit_attack(own_run, tmp_path, "copied")
    p = replay_cli("verify", str(run), "--trust", cwd=tmp_path, timeout=120)
    assert "PAYLOAD RAN" in p.stderr, p.stderr
    assert p.returncode == REFUSED and "before it constructed a replay.Recorder" in p.stderr


def test_a_signed_recording_replays_and_a_copy_edited_in_one_byte_does_not(
    own_run: Path, tmp_path: Path
) -> None:
    ok = replay_cli("verify", str(own_run), cwd=tmp_path, timeout=120)
    assert ok.returncode == 0, ok.stderr
    info = replay_cli("info", str(own_run), "--json", cwd=tmp_path)
    assert json.loads(info.stdout)["trust"]["standing"] == "signed"

    edited = _copy(own_run, tmp_path / "edited.h5")
    with h5py.File(edited, "r+") as f:  # one byte of the recorded source: a signed field
        sources = _blob(f, "meta/sources")
        path = next(iter(sources))
        sources[path] = sources[path].replace("lr=0.1", "lr=0.2", 1)
        _put(f, "meta/sources", sources)
    p = replay_cli("verify", str(edited), cwd=tmp_path, timeout=120)
    assert p.returncode == REFUSED, p.stderr
    assert "foreign (its signature does not match" in p.stderr
    assert f"`python {own_run.parent / 'prog.py'}` in {own_run.parent}" in p.stderr

    once = replay_cli("verify", str(edited), "--trust", cwd=tmp_path, timeout=120)
    assert once.returncode == 0, once.stderr
    again = replay_cli("verify", str(edited), cwd=tmp_path, timeout=120)
    assert again.returncode == REFUSED  # --trust is not remembered

    home = os.environ["REPLAY_HOME"]
    trusted = replay_cli("trust", str(edited), cwd=tmp_path)
    assert trusted.returncode == 0 and "trusted" in trusted.stdout, trusted.stderr
    assert stat.S_IMODE(os.stat(os.path.join(home, "trusted")).st_mode) == 0o600
    now = replay_cli("verify", str(edited), cwd=tmp_path, timeout=120)
    assert now.returncode == 0, now.stderr
    info = replay_cli("info", str(edited), "--json", cwd=tmp_path)
    assert json.loads(info.stdout)["trust"]["standing"] == "trusted"


def test_a_module_program_is_refused_naming_the_file_it_resolves_to(
    own_run: Path, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("print('the file the recording names')\n")
    (tmp_path / "shipped").mkdir()
    marker = tmp_path / "planted-ran"
    planted = tmp_path / "shipped" / "trainmod.py"
    planted.write_text(
        f"import sys\nsys.stderr.write('PLANTED RAN\\n')\nopen({str(marker)!r}, 'w')\n"
    )
    run = _copy(own_run, tmp_path / "run.h5")
    with h5py.File(run, "r+") as f:
        meta = _blob(f, "meta/run")
        meta["program"] = {
            "kind": "module",
            "module": "shipped.trainmod",
            "path": str(tmp_path / "train.py"),
        }
        meta["env"].update(argv=["train.py"], cwd=str(tmp_path))
        _put(f, "meta/run", meta)
    p = replay_cli("bisect", str(run), *ANY_STEP, cwd=ROOT, timeout=120)
    assert p.returncode == REFUSED and not marker.exists(), p.stderr
    assert "PLANTED RAN" not in p.stderr
    assert f"`python -m shipped.trainmod` in {tmp_path} (file {planted})" in p.stderr
    ran = replay_cli("bisect", str(run), *ANY_STEP, "--trust", cwd=ROOT, timeout=120)
    assert "PLANTED RAN" in ran.stderr, ran.stderr  # what the refusal named is what --trust runs


# Two ranks recorded by one process with rank=/world_size=, each given its run id by the
# launcher's REPLAY_RUN_ID (the second from argv): the model and step of test_rank_sets.
RANKS = textwrap.dedent(
    """
    import os, sys
    import torch, replay
    from tests.unit.test_rank_sets import build, train_step

    for rank, run in ((0, "first"), (1, sys.argv[2])):
        os.environ["REPLAY_RUN_ID"] = run
        model, opt = build()
        with replay.Recorder(sys.argv[1], model=model, optimizer=opt, step_fn=train_step,
                             build_fn=build, snapshot_every=2, rank=rank, world_size=2) as rec:
            for s in range(4):
                rec.step(torch.full((3, 4), float(s + rank)))
    """
)


def test_rank_files_of_different_runs_are_refused_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "ranks.py").write_text(RANKS)
    for name, second in (("same", "first"), ("mixed", "second")):
        p = run_py(str(tmp_path / "ranks.py"), str(tmp_path / name / "run.h5"), second)
        assert p.returncode == 0, p.stderr
    with h5py.File(tmp_path / "same" / "run.rank0.h5", "r") as a:
        with h5py.File(tmp_path / "same" / "run.rank1.h5", "r") as b:
            assert a.attrs["run_id"] == b.attrs["run_id"]  # one run: one id
    p = replay_cli("verify", str(tmp_path / "mixed" / "run.h5"), cwd=tmp_path, timeout=120)
    assert p.returncode == REFUSED, p.stderr
    assert "not of one run" in p.stderr and "importing" not in p.stderr


def test_the_key_is_made_once_0600_by_processes_racing_for_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "REPLAY_HOME": str(home), "PYTHONPATH": str(ROOT)}
    code = "from replay.trust import user_key; print(user_key().hex())"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(keys) == 1 and len(next(iter(keys))) == 64
    assert sorted(os.listdir(home)) == ["key"]  # no temporary file left
    assert stat.S_IMODE(os.stat(home / "key").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700


def test_a_key_that_cannot_be_made_leaves_an_unsigned_recording_and_one_warning(
    tmp_path: Path,
) -> None:
    """Recording never fails over its signature: a data directory that cannot be made (a file
    in its way) records unsigned, says so once, and the recording is foreign."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "in-the-way").write_text("")
    env = {"REPLAY_HOME": str(tmp_path / "in-the-way" / "replay")}
    p = run_py(str(tmp_path / "prog.py"), cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("this recording will be unsigned") == 1, p.stderr
    info = replay_cli("info", str(tmp_path / "run.h5"), "--json", cwd=tmp_path, env=env)
    trust = json.loads(info.stdout)["trust"]
    assert trust["standing"] == "foreign" and trust["why"].startswith("unsigned"), trust
