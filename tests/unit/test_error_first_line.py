"""``errors.first_line``: how every one-line message quotes an error it caught. The reader quoted
``str(e).splitlines()[0]``, which raised IndexError (an internal error, exit 6) for an HDF5 error
with an empty message, where the error's type is the only thing to say."""

from __future__ import annotations

import pytest

from replay.errors import first_line


def test_an_error_with_an_empty_message_is_named_by_its_type_not_an_index_error():
    assert first_line(OSError()) == "OSError"
    assert first_line(KeyError("")) == "''"  # (a KeyError's str is its key's repr)
    assert first_line(RuntimeError("   \n  ")) == "RuntimeError"


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("Unable to open object (bad header)", "Unable to open object (bad header)"),
        ("first\nsecond\nthird", "first"),
        ("\n  leading blank lines\ntail", "leading blank lines"),
    ],
)
def test_the_first_non_blank_line_of_a_message_is_quoted(message, line):
    assert first_line(ValueError(message)) == line
