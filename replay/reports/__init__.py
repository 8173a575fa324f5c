"""The reports the workflows return and the commands print, one dataclass each.

A workflow (``replay/workflows``) builds one; a command prints it as JSON with ``to_json()``
(``--json``: a public contract, shapes pinned by tests) or in words (``replay/cli/render.py``);
``from_json()`` reads one back (the TUI, a multi-rank replay's per-rank results). No imports
beyond the standard library: the TUI reads them without torch.

===================  ====================================================================
``TraceVerdict``     which op of a traced step is to blame (the forensics sidecar's verdict)
``TracedOp``         what tracing one step named: the culprit fields of the reports below
``BisectReport``     ``replay bisect``: the first bad step, why, whether it reproduces
``VerifyReport``     ``replay verify``: every step of the window compared bitwise
``TraceReport``      ``replay trace``: one step traced per op
``DivergenceCause``  why a replay differs from its recording (verify and bisect)
``Divergence``       where a replay first differs from its recording (the step, the column)
``OverfitReport``    ``replay overfit``: one recorded batch trained on again and again
``WhatIfReport``     ``replay whatif``: the failing steps replayed as recorded and per change
``DoctorReport``     ``replay doctor``: the checklist's findings (``RankSetDoctorReport``: per rank)
``InfoReport``       ``replay info``: what a recording holds (``reports/info.py``)
===================  ====================================================================

``ExportReport`` lives beside its workflow (``replay/workflows/export.py``): nothing reads it back.
"""

from .bisect import BisectReport
from .cause import DivergenceCause, StateDrift
from .culprit import TracedOp
from .divergence import Divergence
from .doctor import DoctorReport, Finding
from .overfit import OverfitReport
from .trace import TraceReport
from .verdict import ExceptionInfo, TraceVerdict
from .verify import VerifiedStep, VerifyReport
from .whatif import StepResult, WhatIfReport

__all__ = [
    "BisectReport",
    "Divergence",
    "DivergenceCause",
    "DoctorReport",
    "ExceptionInfo",
    "Finding",
    "OverfitReport",
    "StateDrift",
    "StepResult",
    "TraceReport",
    "TraceVerdict",
    "TracedOp",
    "VerifiedStep",
    "VerifyReport",
    "WhatIfReport",
]
