"""Per-op tracing of one training step: which aten op first made a non-finite value, where
(module, source line, forward creation site), on which samples, and the step's full picture.

Example::

    from replay.trace import trace_step
    result = trace_step(model, optimizer, train_step, batch)
    result.verdict["op"], result.verdict["module"], result.verdict["source"]
    result.write("run.forensics.h5", run_id="abc", step=123)
"""

from replay.trace.step import trace_step

__all__ = ["trace_step"]
