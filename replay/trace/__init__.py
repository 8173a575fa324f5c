"""Per-op tracing of one training step: which aten op first made a non-finite value, where
(module, source line, forward creation site), on which samples, and the step's full picture.

Example::

    from replay.trace import trace_step
    result = trace_step(model, optimizer, train_step, batch)
    result.verdict["op"], result.verdict["module"], result.verdict["source"]
    result.write("run.forensics.h5", run_id="abc", step=123)
"""

from replay.trace.samples import (
    batch_size_of,
    candidate_axes,
    choose_sample_axes,
    find_culprit_samples,
    has_batch_coupling,
    slice_batch,
)
from replay.trace.step import trace_step

__all__ = [
    "trace_step",
    "find_culprit_samples",
    "slice_batch",
    "batch_size_of",
    "has_batch_coupling",
    "candidate_axes",
    "choose_sample_axes",
]
