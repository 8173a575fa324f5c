"""The package layout is the pipeline, and imports only point down it.

Every ``import`` in ``replay/`` (function-level ones included: a lazy import is still a
dependency) is checked against the layers below; a module may import its own layer and the ones
beneath it, never one above. The CLI parses, calls and renders: nothing below it imports it (or
click). The store and the bisector never import torch; the TUI reads through the store alone.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS = {
    "errors": 0,
    "child": 0,  # another replay command in a child process: stdlib only
    "words": 0,  # the words for an op's part in a failure: no imports
    "safetext": 0,
    "thresholds": 0,  # judgements doctor and the TUI share: no imports
    "limits": 0,  # limits a user raises through the environment: the standard library only
    "jsonsafe": 0,  # NaN/inf as strings in JSON: one rule  # strings from a file made safe for the terminal
    "trust": 0,  # the user's key and what it vouches for: the standard library only
    "reports": 0,  # the reports' dataclasses, JSON in and out: the standard library only
    "store": 1,  # the file format: numpy + h5py
    "bisect": 1,  # the search: pure python
    "doctor": 2,  # rules over what the store reads
    "capture": 2,  # what recording and replay both compute, one copy
    "ranks": 2,  # what a rank set is and how each rank records (imports capture, never back)
    "record": 3,  # the recorder: capture on the training thread, the writer, its DDP side
    "trace": 3,  # per-op dispatch mode
    "engine": 3,  # replaying steps (never imports the recorder: see test below)
    "report": 3,  # replay report's page: reads the store, the sidecar, doctor and rank sets
    "workflows": 4,  # what each command does, as library calls
    "multirank": 3,  # a rank set's ranks replayed: which way, one alone, every one together
    # (the per-rank process that runs a workflow is workflows/rank_worker.py)
    "preflight": 4,
    "integrations": 4,  # framework callbacks: a Recorder driven by the framework's hooks
    "cli": 5,  # parse, call, render
    "__main__": 6,
    "__init__": 6,  # the package facade
}
NO_TORCH = {"trust", "reports", "store", "bisect", "doctor", "preflight", "report"}
# The reading side of replay/ranks (the recording side is torch's: context, policy, votes, hook).
RANKS_READING = ("names", "files", "first_bad", "scan", "summary")


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT / "replay")
    return rel.parts[0].removesuffix(".py")


def _no_torch(path: Path) -> bool:
    me = _package(path)
    return me in NO_TORCH or (me == "ranks" and path.stem in (*RANKS_READING, "__init__"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``path``."""
    rel = path.relative_to(ROOT).with_suffix("")
    here = list(rel.parts)
    if here[-1] == "__init__":
        here = here[:-1]
    else:
        here = here[:-1]  # the package the module is in
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
                names = [name] if node.module else [f"{name}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""]
            out += [(node.lineno, n) for n in names]
    return out


FILES = sorted((ROOT / "replay").rglob("*.py"))


def test_every_package_has_a_layer():
    missing = {_package(p) for p in FILES} - set(LAYERS)
    assert not missing, f"give these a layer in LAYERS: {sorted(missing)}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down_the_pipeline(path):
    me = _package(path)
    wrong = []
    for line, name in _imports(path):
        parts = name.split(".")
        if parts[0] == "replay" and len(parts) > 1:
            other = parts[1]
            if other in LAYERS and other != me and LAYERS[other] > LAYERS[me]:
                wrong.append(
                    f"line {line}: {me} (layer {LAYERS[me]}) imports {name} (layer {LAYERS[other]})"
                )
        if parts[0] == "click" and me not in ("cli", "__main__"):
            wrong.append(f"line {line}: {me} imports click (only the CLI may)")
        if parts[0] == "torch" and _no_torch(path):
            wrong.append(f"line {line}: {me} imports torch")
    assert not wrong, "\n".join(wrong)


def test_the_tui_reads_through_the_store_alone():
    """... and reads the reports back through their dataclasses (``replay.reports``)."""
    wrong = []
    for path in sorted((ROOT / "tui").rglob("*.py")):
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] == "torch" or (
                parts[0] == "replay"
                and len(parts) > 1
                and parts[1]
                not in ("store", "errors", "words", "safetext", "thresholds", "reports", "child")
                # rank file sets and their scan: numpy + h5py only
                and name not in [f"replay.ranks.{m}" for m in RANKS_READING]
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_replay_shares_capture_code_with_the_recorder_but_never_imports_it():
    """The promise that a replay measures a step as the recorder did is kept by both using
    ``replay.capture``, not by the engine reaching into the recorder."""
    wrong = [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for pkg in ("engine", "trace", "workflows")
        for p in sorted((ROOT / "replay" / pkg).rglob("*.py"))
        for line, name in _imports(p)
        if name.startswith("replay.record")
    ]
    assert not wrong, "\n".join(wrong)


def test_capture_never_imports_ranks():
    """``ranks`` and ``capture`` share a layer: ``ranks`` builds on ``capture`` (the hook's
    norms are the fingerprint's), so an arrow back would be a circle."""
    wrong = [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for p in sorted((ROOT / "replay" / "capture").rglob("*.py"))
        for line, name in _imports(p)
        if name.startswith("replay.ranks")
    ]
    assert not wrong, "\n".join(wrong)


# What reads a recording back (and the reader itself): none of it belongs in a training process.
READING_SIDE = (
    "replay.store.reader",
    "replay.ranks.scan",
    "replay.ranks.files",
    "replay.engine",
    "replay.trace",
    "replay.bisect",
    "replay.workflows",
    "replay.multirank",
)


def test_the_recorder_loads_nothing_of_the_reading_side():
    """``import replay.record.recorder`` in a fresh interpreter (the training process): the
    recorder names its rank file with ``replay.ranks.names`` alone, never through the reader."""
    code = (
        "import json, sys\nimport replay.record.recorder\nprint(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout)
    assert "replay.ranks.names" in loaded and "replay.ranks.policy" in loaded
    wrong = [m for m in loaded if any(m == r or m.startswith(r + ".") for r in READING_SIDE)]
    assert not wrong, f"importing the recorder loaded {wrong}"


def test_a_recording_run_loads_nothing_of_the_reading_side_while_it_trains(tmp_path):
    """The same after steps recorded and the file closed: the recorder names the state a step
    reads that it does not hold (``capture/suspects.py``) at its first step, and that import
    once went through ``replay.engine`` (the replay engine, the reader and h5py with it)."""
    code = textwrap.dedent(
        """
        import json, sys, torch, replay
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step(x):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            return loss
        rec = replay.Recorder(sys.argv[1], model=model, optimizer=opt, self_check=False)
        for _ in range(3):
            rec.step(torch.randn(4, 3), step)
        rec.close()
        print(json.dumps(sorted(sys.modules)))
        """
    )
    (tmp_path / "train.py").write_text(code)
    out = subprocess.run(
        [sys.executable, "train.py", str(tmp_path / "run.h5")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "RecorderWarning" not in out.stderr, out.stderr  # (a run that replays: it looked)
    loaded = json.loads(out.stdout.splitlines()[-1])
    wrong = [m for m in loaded if any(m == r or m.startswith(r + ".") for r in READING_SIDE)]
    assert not wrong, f"recording loaded {wrong}"
