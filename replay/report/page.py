"""The report page: one self-contained HTML file (no network, no fonts, no external URL).

``render(facts, name)`` assembles the sections (``sections.py``) with the inline stylesheet and
script (``assets.py``) under a Content-Security-Policy that forbids every fetch and every script
but that one by its hash: should a string from the file ever escape escaping, it still could
neither run nor load anything.
"""

from __future__ import annotations

from .. import __version__
from . import sections
from .assets import SCRIPT, STYLE
from .escape import esc, script_hash
from .facts import RunFacts

__all__ = ["render", "csp"]


def csp() -> str:
    """The page's Content-Security-Policy."""
    return (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src {script_hash(SCRIPT)}; base-uri 'none'; form-action 'none'"
    )


def render(f: RunFacts, name: str) -> str:
    """The page for ``f``; ``name``: the recording (or rank set) as the user named it, for the
    command lines it shows."""
    title = f"replay report: {name}"
    body = "".join(
        [
            f"<header><h1>{esc(title)}</h1>",
            f'<p class="note">run {esc(f.run_id)} · made by replay {esc(__version__)} from the '
            "recording alone: it ran no recorded code</p></header>",
            '<nav class="note">verdict · health · layers · ops · doctor · run</nav>',
            sections.verdict_section(f, name),
            sections.ranks_section(f),
            sections.health_section(f),
            sections.layers_section(f),
            sections.ops_section(f),
            sections.params_section(f),
            sections.doctor_section(f),
            sections.run_section(f),
            "<footer>Opened as a file, this page fetches nothing (its Content-Security-Policy "
            "forbids it) and needs no JavaScript but to sort and filter the ops table.</footer>",
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(csp())}">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>"
        f"<body>{body}<script>{SCRIPT}</script></body></html>\n"
    )
