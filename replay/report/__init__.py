"""``replay report RUN -o report.html``: the verdict as one page a team can open.

One self-contained HTML file from a recording (and the forensics sidecar ``replay bisect``
wrote beside it): the verdict, the health over the steps with the first bad step and the
replayable window marked, per-layer values over steps, the traced ops around the culprit, the
doctor's findings and, for a DDP rank set, every rank. The recording is read as untrusted input,
like ``replay info``: no recorded code runs, and every string from it is escaped (``escape.py``)
under a Content-Security-Policy that lets no other script run and nothing be fetched.

=============  ===============================================================
``facts``      what the page shows, read through the store and the typed reports
``sections``   each section as HTML
``svg``        the plots, drawn from Python
``escape``     the one escaping rule; the script's CSP hash
``assets``     the inline stylesheet and script
``page``       the page and its Content-Security-Policy
=============  ===============================================================

Example::

    >>> from replay.report import write_report
    >>> write_report("run.h5", "report.html")  # doctest: +SKIP
"""

from __future__ import annotations

import os

from ..reports import BisectReport
from .facts import read_facts
from .page import render

__all__ = ["build_page", "write_report"]


def build_page(run: str, *, bisect: BisectReport | None = None) -> str:
    """The page for the recording or rank set ``run`` (``bisect``: a ``replay bisect --json``
    report of it, for what only bisect knows: whether the failure reproduces)."""
    return render(read_facts(run, bisect=bisect), os.path.basename(run) or run)


def write_report(run: str, out: str, *, bisect: BisectReport | None = None) -> int:
    """Write the page for ``run`` to ``out`` (a new file, or a regular file replaced whole);
    returns its size in bytes."""
    from ..store.safefile import replace_whole

    page = build_page(run, bisect=bisect).encode("utf-8")
    with replace_whole(out, "the report") as fh:
        fh.write(page)
    return len(page)
