"""replay.safetext: what reaches a terminal from a file (issue 23)."""

from __future__ import annotations

import json

from replay.safetext import term_safe, term_safe_tree


def test_escapes_everything_a_terminal_acts_on_visibly():
    evil = "t\x1b]0;pwned\x07\x1b[2J\x9b31m\x7f\x00\r\u202e\u2028\ud800end"
    out = term_safe(evil)
    assert out == ("t\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\x7f\\x00\\x0d\\u202e\\u2028\\ud800end")
    out.encode("utf-8")  # no lone surrogate left: printable on any UTF-8 terminal


def test_keeps_text_tabs_and_newlines_only_when_asked():
    assert term_safe("naïve 日本 ✗\tx") == "naïve 日本 ✗\tx"
    assert term_safe("a\nb") == "a\\x0ab"  # one line stays one line
    assert term_safe("a\nb", multiline=True) == "a\nb"
    assert term_safe(12) == "12"


def test_tree_escapes_keys_and_values_and_keeps_numbers():
    value = json.loads('{"k\\u001b": ["v\\u009b", 1, 2.5, null, true, {"x": "\\u0007"}]}')
    assert term_safe_tree(value) == {"k\\x1b": ["v\\x9b", 1, 2.5, None, True, {"x": "\\x07"}]}
