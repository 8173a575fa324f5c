"""Text from a file, made safe for a terminal: the one rule every command and the TUI apply.

A recording is untrusted input. A run name holding ``ESC ] 0 ; ... BEL`` sets the terminal's
title when printed raw, ``ESC [ 2 J`` clears the screen, and other sequences can move the cursor
over earlier lines, write to the clipboard or make a link. So every string that came from a
file is passed through :func:`term_safe` before it is printed or shown: control characters
become visible escapes (``\\x1b``), never bytes the terminal acts on.

Escaped: C0 controls (U+0000..U+001F) but ``\\t`` (and ``\\n`` when ``multiline``), DEL,
C1 controls (U+0080..U+009F: 8-bit CSI and OSC), the Unicode line and paragraph separators,
bidirectional overrides and isolates (they reorder what is shown: "Trojan Source"), and lone
surrogates (which cannot be encoded for output). Everything else, non-ASCII text included,
is kept.

Example::

    >>> term_safe("run\\x1b]0;pwned\\x07")
    'run\\\\x1b]0;pwned\\\\x07'
"""

from __future__ import annotations

import sys
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

__all__ = ["term_safe", "term_safe_tree", "say", "UNSAFE"]


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


UNSAFE: frozenset[int] = frozenset(
    [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
    + [0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
    + list(range(0xD800, 0xE000))
)
_SINGLE = {c: _escape(c) for c in UNSAFE if c != 0x09}
_MULTI = {c: s for c, s in _SINGLE.items() if c != 0x0A}


def term_safe(text: Any, *, multiline: bool = False) -> str:
    """``text`` (any value, as ``str()``) with every character a terminal would act on escaped.

    ``multiline`` keeps newlines (source code, a traceback); otherwise they are escaped too, so
    a string cannot fake extra lines of a report.
    """
    s = text if isinstance(text, str) else str(text)
    return s.translate(_MULTI if multiline else _SINGLE)


def say(text: str) -> None:
    """A note on stderr, its lines made safe (paths and source diffs come from the file)."""
    print(term_safe(text, multiline=True), file=sys.stderr, flush=True)


T = TypeVar("T")


def term_safe_tree(value: T) -> T:
    """A copy of a JSON-like value (dicts, lists, tuples, scalars, a report's dataclasses) with
    every string, keys too, passed through :func:`term_safe` (single-line). Other values are
    returned as they are (a namedtuple comes back a plain tuple)."""
    safe: T = _safe_tree(value)
    return safe


def _safe_tree(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return replace(
            value,
            **{f.name: _safe_tree(getattr(value, f.name)) for f in fields(value) if f.init},
        )
    if isinstance(value, str):
        return term_safe(value)
    if isinstance(value, dict):
        return {
            (term_safe(k) if isinstance(k, str) else k): _safe_tree(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_safe_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_safe_tree(v) for v in value)
    return value
