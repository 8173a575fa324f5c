"""The frameworks are optional: ``import replay`` (and its CLI) never imports them."""

import subprocess
import sys

import pytest


def test_importing_replay_imports_no_framework():
    code = (
        "import sys, replay, replay.cli, replay.integrations\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'transformers', 'accelerate')]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_transformers_integration_imports_no_lightning():
    """Each integration needs only its own framework: Hugging Face users need no Lightning.
    (Lightning itself peeks at transformers, so the converse is not asked.)"""
    pytest.importorskip("transformers")
    code = (
        "import sys, replay.integrations.transformers\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
