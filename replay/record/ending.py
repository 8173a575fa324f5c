"""How the program ended when it raised outside any step: a corrupt sample raising in the data
loader, an evaluation or logging line that overflowed, Ctrl-C. No step record holds that
exception, so without this the recording read "closed cleanly" and bisect "healthy" for a run
that died. It is written to the file's ``/ended`` at close (docs/format.md).
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from typing import Any

__all__ = ["ending"]

_MESSAGE_CHARS = 2000
_TRACEBACK_CHARS = 12000  # with the message, well under layout.ENDED_BYTES as JSON


def _cut(text: str, n: int) -> str:
    """``text`` within ``n`` characters: its start and its end, which name the exception and
    where it was raised."""
    return text if len(text) <= n else text[: n // 5] + "\n...\n" + text[-(n - n // 5 - 5) :]


#: a frame of the traceback a DataLoader worker's exception carries in its message
_FRAME = re.compile(r'^  File "(.+)", line (\d+), in (.+)$', re.M)


def _where(e: BaseException) -> str | None:
    """``path:line in function`` of the innermost frame in the program's own code (not the
    standard library's, an installed package's or replay's), else the innermost frame. A
    DataLoader worker's exception is raised again in the main process with the worker's
    traceback as its message: its frames are the ones that say where (a ``__getitem__``)."""
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(e.__traceback__)]
    message = str(e)
    if "\nOriginal Traceback" in message:
        frames += [(path, int(line), name) for path, line, name in _FRAME.findall(message)]
    if not frames:
        return None
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outside = tuple(
        os.path.join(os.path.abspath(p), "")
        for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, here}
    )
    own = [f for f in frames if not os.path.abspath(f[0]).startswith(outside)]
    path, line, name = (own or frames)[-1]
    return f"{path}:{line} in {name}"


def ending(e: BaseException, last_step: int | None) -> dict[str, Any] | None:
    """What ``/ended`` holds for a program that ``e`` ends after step ``last_step`` (``None``:
    no step was recorded), or ``None`` when ``e`` ends nothing worth saying (``sys.exit(0)``)."""
    if isinstance(e, SystemExit):
        if e.code in (None, 0):
            return None
        kind = "exit"
    else:
        kind = "interrupted" if isinstance(e, KeyboardInterrupt) else "exception"
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {
        "kind": kind,
        "type": type(e).__name__,
        "module": type(e).__module__,
        "message": _cut(str(e), _MESSAGE_CHARS),
        "where": _where(e),
        "traceback": _cut(tb, _TRACEBACK_CHARS),
        "last_step": last_step,
    }
