"""Hard failures already in the health record: NaN/Inf and exceptions. Doctor points to bisect."""

from __future__ import annotations

from ..reports.doctor import EvidenceValue
from .context import Context
from .registry import Finding, rule


@rule
def nonfinite_recorded(ctx: Context) -> Finding | None:
    """A NaN/Inf loss, gradient or weight was recorded (AMP-skipped steps excluded)."""
    if (step := ctx.rec.first_bad()["nonfinite"]) is None:
        return None
    h = ctx.health
    i = int((h["step"] == step).nonzero()[0][0])
    where = [k for k in ("loss", "grad", "param") if h[f"{k}_nonfinite"][i] == 1]
    return Finding(
        "nonfinite_recorded",
        "error",
        f"non-finite values first recorded at step {step} (in: {', '.join(where)})",
        {"step": step, "in": where},
        f"Run `replay bisect {ctx.rec.path}` to find the first op that produced it, the module, "
        "the source line and the samples of the batch responsible.",
        [step],
    )


@rule
def exception_recorded(ctx: Context) -> Finding | None:
    """A step raised an exception."""
    if (step := ctx.rec.first_bad()["exception"]) is None:
        return None
    try:
        exc = ctx.rec.read_step(step).get("exception") or {}
    except KeyError:
        exc = {}
    return Finding(
        "exception_recorded",
        "error",
        f"step {step} raised {exc.get('type', 'an exception')}: {exc.get('message', '')}"[:200],
        {"step": step, "type": exc.get("type"), "message": exc.get("message")},
        f"Run `replay bisect {ctx.rec.path}` to get the op, module, source line and samples "
        "that raised, replayed from the recorded state.",
        [step],
    )


@rule
def died_outside_a_step(ctx: Context) -> Finding | None:
    """The program died outside any step: an exception between steps (the data loader, a
    validation or logging line, a callback), a failing ``sys.exit``, Ctrl-C; or, where the file
    was never closed and nothing writes it, a kill no exception announced."""
    rec = ctx.rec
    if (ended := rec.ending()) is None:
        return None
    after = [] if ended.last_step is None else [ended.last_step]
    evidence: dict[str, EvidenceValue] = {"after_step": ended.last_step, "kind": ended.kind}
    if ended.kind == "killed":
        return Finding(
            "died_outside_a_step",
            "error",
            f"the program {ended.describe().removeprefix('it ')}",
            {**evidence, "memory": ended.message},
            "Nothing in the file says why: read the kernel's log (`dmesg`, `journalctl -k`: "
            "'Out of memory: Killed process') and the job scheduler's. Memory that grows step "
            "after step is a leak (a tensor kept across steps: a loss summed without .item(), "
            "a list of outputs).",
            after,
        )
    evidence |= {"type": ended.type, "where": ended.where}
    interrupted = ended.kind == "interrupted"
    return Finding(
        "died_outside_a_step",
        "info" if interrupted else "error",
        f"the program ended: {ended.describe()}",
        evidence,
        "Interrupted by its user (Ctrl-C, SIGINT): nothing failed in training."
        if interrupted
        else "No step raised it, so no replay of a step can find it: it came from the code "
        "between steps (the data loader, a validation or logging line, a callback). "
        f"`replay info {rec.path} --json` holds its traceback; a DataLoader worker's names the "
        "line of __getitem__ that raised, and a corrupt sample is fixed or skipped there.",
        after,
    )
