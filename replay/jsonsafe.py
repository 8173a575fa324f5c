"""JSON has no NaN or infinity: every report and file writes them as "nan", "inf", "-inf".

One rule for the bisect and verify reports, the doctor's JSON, the trace fields and the
forensics sidecar. No imports beyond the standard library: every layer may use it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["json_safe"]


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (nested in dicts, lists and tuples, numpy scalars
    included) replaced by "nan", "inf" or "-inf"; dict keys become strings."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # numpy scalars
        return json_safe(value.item())
    return value
