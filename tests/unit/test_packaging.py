"""What the distribution installs: ``replay`` and ``replay_tui`` (the folder ``tui/``), and no
top-level ``tui`` that would collide with another package of that name in a user's environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH: what is importable comes from the installed distribution alone."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_installed_tui_is_replay_tui_and_there_is_no_top_level_tui(tmp_path):
    code = (
        "import importlib.util, sys\n"
        "import replay_tui, replay_tui.app, replay_tui.screens, replay_tui.widgets\n"
        "assert callable(replay_tui.make_app)\n"
        "print(replay_tui.__file__)\n"
        "print(importlib.util.find_spec('tui'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,  # not the repository root, whose folder tui/ would be importable from ''
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    assert Path(out[0]) == ROOT / "tui" / "__init__.py"
    assert out[1] == "None"


def test_every_package_folder_is_listed_in_pyproject():
    """The mapped folder rules out ``packages.find``: a new subpackage must be listed by hand."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = set()
    for top, name in (("replay", "replay"), ("tui", "replay_tui")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            on_disk.add(".".join((name, *rel)))
    assert listed == on_disk


def test_the_wheel_holds_replay_tui_and_its_styles_and_no_tui(tmp_path):
    """Build the wheel from a copy of the tree (the backend writes build/ beside its input)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("replay", "tui"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = tmp_path / "dist"
    out.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from setuptools import build_meta; build_meta.build_wheel({str(out)!r})",
        ],
        cwd=src,
        env=_clean_env(),
        capture_output=True,
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"replay", "replay_tui"}
    assert "replay_tui/app.py" in names and "replay_tui/app.tcss" in names
    assert "replay_tui/screens/ops.tcss" in names
    assert "replay/py.typed" in names
    (top_level,) = (n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert sorted(zipfile.ZipFile(wheel).read(top_level).decode().split()) == [
        "replay",
        "replay_tui",
    ]
