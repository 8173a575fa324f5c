"""The ``replay`` command: thin click commands over the library; torch is imported only by the
commands that replay (``bisect``, ``verify``...), so ``replay --help`` and ``replay info`` are instant.

Exit codes: 0 success, 1 nothing found (bisect on a healthy window), 2 usage error,
3 unusable recording, 4 unusable entry point, 5 replay failed, 6 internal error (any other
exception: a bug in replay), 7 a DDP rank set with a missing or damaged rank file, 130 interrupted. Errors are one line on stderr, made safe for the
terminal (``replay/safetext.py``); ``REPLAY_TRACEBACK=1`` adds the traceback of an internal error.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import NoReturn

import click

from ..errors import EXIT_INTERNAL, EXIT_INTERRUPTED, ReplayError, exit_code_of
from ..safetext import term_safe
from ._process import own_process
from .bisect import bisect
from .doctor import doctor
from .export import export
from .info import info
from .overfit import overfit
from .preflight import preflight
from .report import report
from .trace import trace
from .trust import trust
from .tui import tui
from .verify import verify
from .whatif import whatif

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="torch-replay", prog_name="replay")
def cli() -> None:
    """Record-and-replay forensic debugger for PyTorch training.

    \b
    replay info RUN.h5      what a recording holds and which steps can be replayed
    replay bisect RUN.h5    the first bad step and op, and whether it reproduces
    replay verify RUN.h5    replay the recorded window and check it is bitwise deterministic
    replay doctor RUN.h5    the debugging checklist: what looks wrong in the run, and what to do
    replay overfit RUN.h5   can the model overfit one recorded batch? (the first law)
    replay whatif RUN.h5 --scale lr=0.1   would the failure still happen with this change?
    replay trace RUN.h5     trace any step per op (--step N) for the TUI's op views
    replay tui RUN.h5       browse a recording and its forensics in the terminal
    replay export RUN.h5 --out DIR   the state before a step as a torch checkpoint, to resume
    replay preflight -- python train.py ...   before a long run: will its steps replay bitwise?
    replay trust RUN.h5     run a recording you did not make (read what it runs first)
    replay report RUN.h5 -o report.html   the verdict as one HTML page to share
    """


cli.add_command(info)
cli.add_command(bisect)
cli.add_command(verify)
cli.add_command(doctor)
cli.add_command(overfit)
cli.add_command(whatif)
cli.add_command(trace)
cli.add_command(tui)
cli.add_command(preflight)
cli.add_command(export)
cli.add_command(trust)
cli.add_command(report)


def fail(message: str, code: int, as_json: bool, line: str | None = None) -> NoReturn:
    """Every error of every command ends here: one line on stderr, ``replay: error: ...`` (made
    safe for the terminal) or ``line``, and, with ``--json``, one JSON document on stdout."""
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": code}))
    click.echo(line or f"replay: error: {term_safe(message)}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: every error is one line on stderr with its exit code (see ``fail``)."""
    if argv is None:
        own_process()  # (see _process.py: garbage collection over torch's heap)
    # JSON asked for (before ``--``: preflight's own command follows), read from the raw
    # arguments, since a usage error can come before click parsed them
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in (args[: args.index("--")] if "--" in args else args)
    try:
        rv = cli.main(args=argv, prog_name="replay", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt) as e:
        said = "aborted" if isinstance(e, click.exceptions.Abort) else "interrupted"
        fail(said, EXIT_INTERRUPTED, as_json, f"replay: {said}")
    except click.ClickException as e:  # a UsageError (a bad option value, a missing argument): 2
        fail(e.format_message(), e.exit_code, as_json)
    except ReplayError as e:
        fail(str(e), exit_code_of(e), as_json)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:  # noqa: BLE001 - the catch-all: one line and exit code 6 (never a
        # traceback, whose locals and messages could hold raw strings from a file)
        if os.environ.get("REPLAY_TRACEBACK"):
            trace = "".join(traceback.format_exception(e))
            click.echo(term_safe(trace, multiline=True), err=True)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        message = (
            f"{type(e).__name__}{': ' + first if first else ''} "
            "(a bug in replay; REPLAY_TRACEBACK=1 shows where. Please report it)"
        )
        line = f"replay: internal error: {term_safe(message)}"
        fail(f"internal error: {message}", EXIT_INTERNAL, as_json, line)
    sys.exit(rv if isinstance(rv, int) else 0)
