"""Text from a file, made safe for an HTML page: the one rule every string of a report page obeys.

A recording is untrusted input (``docs/format.md``): its op names, module names, source lines,
paths, argv and sample labels are whatever a stranger put there, ``<script>`` and ``onerror=``
included. Every one of them reaches the page through :func:`esc`: first the terminal rule
(``replay.safetext.term_safe``: control characters, bidirectional overrides and lone surrogates
become visible escapes, so the page cannot reorder text or fail to encode), then
``html.escape`` with quotes (safe inside element text and quoted attribute values alike).

Example::

    >>> esc('<img src=x onerror="alert(1)">')
    '&lt;img src=x onerror=&quot;alert(1)&quot;&gt;'
"""

from __future__ import annotations

import base64
import hashlib
import html

from ..safetext import term_safe

__all__ = ["esc", "esc_code", "script_hash"]


def esc(value: object) -> str:
    """``value`` (any value, as ``str()``) as HTML text, on one line (newlines shown as ``\\n``)."""
    return html.escape(term_safe(value), quote=True)


def esc_code(value: object) -> str:
    """Like :func:`esc`, keeping newlines (source code, a traceback inside ``<pre>``)."""
    return html.escape(term_safe(value, multiline=True), quote=True)


def script_hash(script: str) -> str:
    """The Content-Security-Policy source that lets exactly this inline script run:
    ``'sha256-<base64 of its UTF-8 digest>'`` (CSP Level 2)."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"
