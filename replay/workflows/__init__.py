"""The workflows the commands run, as library calls that return report objects.

Each opens a recording, drives the engine, the bisector and the tracer, and returns a report (a
dataclass of ``replay.reports``, or ``ExportReport`` beside its workflow); it
knows nothing of click or of how the report is printed (``replay/cli`` parses, calls, renders).

=============  ===========================================================================
``session``    open a recording, start the replay engine on it (by re-entry or build_fn)
``bisect``     the first bad step, why, whether it reproduces, the per-op trace
``verify``     replay the whole window bitwise; when a step differs, why
``trace``      any step, per op, into the forensics sidecar
``whatif``     replay the failing steps once as recorded and once per change
``export``     the state before a step as plain torch.save files, to resume the real run
``overfit``    train on one recorded batch until the loss goes to ~0, and judge the curve
``culprit``    trace a step per op: the culprit op, its samples, the forensics sidecar
``why``        why a replay differs from its recording (two experiments after a divergence)
=============  ===========================================================================

``replay.preflight`` is a workflow too (torch-free: it runs the user's script and ``replay verify``
in child processes). What a person reads is worded in ``replay/cli``: ``cli/render.py`` for the
bisect, verify and trace reports, each other command in its own module.
"""

from .bisect import run_bisect
from .export import run_export
from .trace import run_trace
from .verify import run_verify
from .whatif import run_whatif

__all__ = ["run_bisect", "run_export", "run_trace", "run_verify", "run_whatif"]
