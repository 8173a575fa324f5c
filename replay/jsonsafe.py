"""JSON has no NaN or infinity, and no tensors: every report and file writes what it reads
from a recording or a live step through one rule.

Non-finite floats become "nan", "inf", "-inf"; a 0-dim tensor or numpy scalar its number; a
small tensor or array (at most ``SMALL`` elements) its nested list; a larger one a summary
such as ``tensor float32[3, 4]`` (a Lightning RNG state is 5056 bytes: no report wants them);
dicts, lists and tuples are walked; anything else JSON cannot hold becomes its type's name.
For the bisect and verify reports, the doctor's JSON, the trace fields, the per-step values
export writes and the forensics sidecar. No imports beyond the standard library (tensors and
arrays are recognised by their ``shape``, ``dtype`` and ``tolist``): every layer may use it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["SMALL", "json_safe"]

SMALL = 16  # elements: a tensor or array up to this size is written whole, larger ones summarised


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it (see the module's rule); dict keys become strings."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
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
    if not (hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "tolist")):
        return str(value) if isinstance(value, complex) else f"<{type(value).__name__}>"
    # a tensor's or numpy array's (or numpy scalar's) number, list or summary
    shape = [int(n) for n in value.shape]
    if math.prod(shape) <= SMALL:
        try:
            data = value.detach() if hasattr(value, "detach") else value
            if getattr(data, "is_sparse", False):
                data = data.to_dense()
            return json_safe(data.tolist())
        except (RuntimeError, TypeError, ValueError):  # a meta or quantised tensor: summarised
            pass
    kind = "tensor" if hasattr(value, "detach") else "array"
    dtype = str(value.dtype).removeprefix("torch.")
    return f"{kind} {dtype}[{', '.join(map(str, shape))}]"
