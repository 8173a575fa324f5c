"""Every child entry point of replay/child.py, launched the one way the project starts a child
(``python_module``), each doing its job or refusing bad input in one line: the CLI, the writer
process, the self-check and the rank worker. (The full runs are elsewhere: a recording starts
the writer, tests/selfcheck/ the self-check, tests/integration/test_distributed.py's verify of
every rank together the rank workers.)"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import numpy as np

import replay
from replay.child import (
    CLI,
    ENTRY_POINTS,
    RANK_WORKER,
    SELF_CHECK,
    WRITER,
    ChildRun,
    python_module,
    run_replay,
)
from replay.errors import EXIT_BAD_RECORDING, EXIT_USAGE
from replay.store.contracts import StepFrame
from replay.store.reader import open_recording
from replay.store.writer import RingSpec, pack_parts
from replay.store.writer_process import WriterClient

PACKAGE = Path(replay.__file__).parent


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(python_module(module, *args), capture_output=True, text=True, timeout=120)


def _runs_as_main(path: Path) -> bool:
    """Whether the module runs as a child's __main__: a package's ``__main__.py``, or a module
    with an ``if __name__ == "__main__":`` block."""
    if path.name == "__main__.py":
        return True
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
            consts = [n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant)]
            if names == ["__name__"] and consts == ["__main__"]:
                return True
    return False


def test_every_module_run_as_a_child_is_a_named_entry_point():
    """A module started as a child only through a constant of replay/child.py: one with a
    __main__ block that is not named there would be a hidden upward dependency, and a constant
    naming no module a child that cannot start."""
    as_main = set()
    for f in PACKAGE.rglob("*.py"):
        if _runs_as_main(f):
            rel = f.relative_to(PACKAGE.parent).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__main__" else rel.parts
            as_main.add(".".join(parts))
    assert as_main == set(ENTRY_POINTS)


def test_the_cli_child_says_a_missing_recording_in_one_line(tmp_path):
    got = run_replay("info", str(tmp_path / "none.h5"), timeout=120)
    assert got.code == EXIT_BAD_RECORDING, got.stderr
    assert "Traceback" not in got.stderr and got.error_line().startswith("replay: error:")
    # what preflight reports of a verify or bisect child that failed: the message alone
    assert got.replay_error("no verdict") == got.error_line().removeprefix("replay: error: ")
    assert ChildRun(2, "", "").replay_error("no verdict") == "no verdict"
    assert _run(CLI, "--help").stdout.startswith("Usage: replay")


def test_the_writer_child_writes_what_it_is_sent(tmp_path):
    path = str(tmp_path / "run.h5")
    client = WriterClient().create(
        path, run_id="e" * 32, meta={"config": {}}, sources={},
        steps=RingSpec(4, 4096, 4096), snapshots=RingSpec(2, 4096, 4096), health_slots=8,
    )  # fmt: skip
    assert WRITER in client.proc.args  # type: ignore[operator]
    batch = np.arange(64, dtype=np.float32)
    parts, mlen = pack_parts({"step": 0, "batch": batch})
    client.commit(steps=[StepFrame(0, parts, mlen)], health=[], last_step=0)
    client.close()
    with open_recording(path) as rec:
        assert np.array_equal(rec.read_step(0)["batch"], batch)


def test_the_self_check_child_says_in_its_verdict_that_the_run_never_reached_the_file(tmp_path):
    """Started beside a live training process (this one) for a run whose file never came."""
    assert "--after" in _run(SELF_CHECK, "--help").stdout
    run = tmp_path / "none.h5"
    got = _run(
        SELF_CHECK, str(run), "--after", "0", "--steps", "2", "--training-pid", str(os.getpid())
    )
    assert got.returncode == 0 and got.stderr == "", got.stderr
    verdict = json.loads((tmp_path / "none.selfcheck.json").read_text())
    assert verdict["status"] == "error" and "before step 0 reached the file" in verdict["summary"]


def test_the_rank_worker_child_refuses_a_missing_spec_in_one_line(tmp_path):
    """Was: started without its spec it died in a traceback (IndexError)."""
    for args in ((), (str(tmp_path / "none.json"),)):
        got = _run(RANK_WORKER, *args)
        assert got.returncode == EXIT_USAGE, got.stderr
        assert got.stderr.count("\n") == 1 and got.stderr.startswith("replay: error: rank worker")
