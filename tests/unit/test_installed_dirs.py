"""One answer to "is this file the standard library's or an installed package's?" for the
recorder (a program started by a tool is not re-run) and the replay (never imported)."""

from __future__ import annotations

import os
import sys
import types

import pytest

from replay.capture.installed import installed, under
from replay.record.entry import describe_program


def test_installed_tells_an_installed_package_from_the_users_own_file(tmp_path):
    own = tmp_path / "train.py"
    own.write_text("print('training')\n")
    assert installed(pytest.__file__)
    assert installed(os.__file__)
    assert not installed(str(own))


def test_under_is_the_folder_or_below_it_never_a_sibling_with_its_name_as_prefix():
    assert under("/a/b", "/a/b")
    assert under("/a/b/c.py", "/a/b/")
    assert not under("/a/bc/d.py", "/a/b")


def test_a_program_whose_main_file_is_an_installed_packages_is_not_described(tmp_path, monkeypatch):
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    main.__file__ = pytest.__file__
    program, why = describe_program()
    assert program is None
    assert why is not None and "belongs to an installed package" in why
    own = tmp_path / "train.py"
    own.write_text("print('training')\n")
    main.__file__ = str(own)
    program, why = describe_program()
    assert why is None and program is not None
    assert program["kind"] == "script" and program["path"] == str(own)
