"""Was: numbers read from files were checked with ``str.isdigit()``, which is true of "²"
(and other Unicode digits) that ``int()`` refuses. A sidecar whose source line was numbered "²"
passed the reader's check, then raised ValueError where the TUI's source view and
``replay report`` turned it into a line number; an op's location "x.py:²:f" raised in the
TUI's op detail; a sharded snapshot's path key "²" raised ValueError where a missing key is a
KeyError. A number from a file is ASCII digits or it is refused."""

from __future__ import annotations

import pytest

from replay.capture.sharded import _get
from replay.store.forensics import ForensicsReader, NotAForensicsFile, write_forensics
from tui.widgets.op_detail import split_location

from .corpus import sidecar_tables


@pytest.mark.parametrize("line", ["²", "١", "3²"])
def test_a_sidecar_source_line_numbered_in_other_digits_is_refused_not_a_crash(tmp_path, line):
    tables = sidecar_tables("run-1")
    tables["sources"] = {"/x.py": {"sha256": "0", "lines": {line: "    return x.log()"}}}
    path = tmp_path / "run.forensics.h5"
    write_forensics(path, run_id="run-1", step=10, tables=tables)
    with pytest.raises(NotAForensicsFile, match="sources"):
        ForensicsReader.open(path).close()


def test_an_op_location_numbered_in_other_digits_is_no_location():
    assert split_location("x.py:12:f") == ("x.py", 12, "f")
    assert split_location("x.py:²:f") is None
    assert split_location("x.py:١٢:f") is None


def test_a_sharded_state_path_key_in_other_digits_is_a_missing_key():
    assert _get({1: "a"}, "1") == (1, "a")
    with pytest.raises(KeyError):
        _get({1: "a"}, "²")
