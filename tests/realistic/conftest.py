"""Fixtures every realistic program's test uses."""

from __future__ import annotations

import pytest


@pytest.fixture
def elsewhere(tmp_path):
    """A working directory that is not the recording's: replay must restore the recorded one."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d
