"""``replay whatif RUN.h5 CHANGE...``: would the failure still happen with this change?"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any, TypeGuard

import click

from ..errors import EXIT_NOTHING_FOUND, EXIT_OK
from ..reports.whatif import CHANGES, Experiment, StepResult, WhatIfReport
from ..safetext import term_safe
from ._replaying import engine_options, replaying

if TYPE_CHECKING:
    from ..workflows.session import ReplayOptions

__all__ = ["whatif", "render_whatif"]

_BARS = "▁▂▃▄▅▆▇█"
_BAD = "×"  # a non-finite value, or the step raised
_SKIPPED = "·"
SPARK_MAX = 60  # characters a sparkline; longer ranges show runs of steps per character


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _log(x: float) -> float:
    return math.log10(max(abs(x), 1e-30))


def _spark(steps: list[StepResult], key: str, lo: float, hi: float, width: int) -> str:
    """One character a step (a run of steps past ``SPARK_MAX``), on a log scale shared by every
    line (``lo``..``hi`` in log10). A run with a non-finite value shows it; else its largest;
    blank when nothing in it was measured (the gradient norm of a step whose optimizer did not
    step: a micro-step of gradient accumulation)."""
    per = max(1, math.ceil(len(steps) / SPARK_MAX))
    out = []
    for i in range(0, len(steps), per):
        chunk = [s for s in steps[i : i + per] if not s.skipped]
        measured = [x for s in chunk if (x := getattr(s, key)) is not None or s.failed]
        vals = [x for x in measured if _finite(x)]
        if not chunk:
            out.append(_SKIPPED)
        elif not measured:
            out.append(" ")
        elif len(vals) < len(measured):
            out.append(_BAD)
        else:
            v = max(_log(x) for x in vals)
            f = 0.0 if hi <= lo else (v - lo) / (hi - lo)
            out.append(_BARS[min(len(_BARS) - 1, max(0, round(f * (len(_BARS) - 1))))])
    return "".join(out).ljust(width)


def _num(x: object) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)  # (json_safe's "nan", "inf")


def render_whatif(r: WhatIfReport) -> str:
    """The report a person reads."""
    lo, hi = r.from_step, r.to_step
    lines = [
        f"replay whatif {term_safe(r.recording)}: steps {lo}..{hi}, from the snapshot of "
        f"step {r.snapshot}; failure looked for: {r.kind}"
    ]
    rf, bf = r.recorded_failure, r.baseline.first_failure
    lines.append(
        f"  recorded  fails at step {rf}" if rf is not None else "  recorded  no failure in range"
    )
    if r.reproduces:
        lines.append("  baseline  reproduces the recording bitwise")
    else:
        dv = r.divergence
        step, col, was, got = (dv.step, dv.column, dv.recorded, dv.replayed) if dv else [None] * 4
        lines.append(
            f"  baseline  DIFFERS from the recording at step {step} "
            f"({col}: recorded {_num(was)}, replayed {_num(got)})"
        )
    runs: list[tuple[str, list[StepResult], Experiment | None]] = [
        ("recorded", r.recorded, None),
        ("baseline", r.baseline.steps, r.baseline),
    ] + [(term_safe(e.change), e.steps, e) for e in r.experiments]
    per = max(1, math.ceil((hi - lo + 1) / SPARK_MAX))
    width = math.ceil((hi - lo + 1) / per)
    scales = {}
    for key in ("loss", "grad_norm"):
        vals = [_log(x) for _, steps, _ in runs for s in steps if _finite(x := getattr(s, key))]
        scales[key] = (min(vals), max(vals)) if vals else (0.0, 0.0)
    name_w = max(12, *(len(n) for n, _, _ in runs))
    col_w = max(width, 9)
    lines.append("")
    lines.append(
        f"  {'':{name_w}}  {'loss':{col_w}}  {'grad norm':{col_w}}  "
        f"{'fails at':>8}  {'final loss':>10}  {'param dist':>10}"
    )
    for name, steps, e in runs:
        first = next((s.step for s in steps if s.failed), None)
        last = next((s for s in reversed(steps) if not s.skipped), None)
        dist = "" if e is None or e is r.baseline else _num(e.param_distance)
        lines.append(
            f"  {name:{name_w}}  {_spark(steps, 'loss', *scales['loss'], col_w)}  "
            f"{_spark(steps, 'grad_norm', *scales['grad_norm'], col_w)}  "
            f"{'-' if first is None else first:>8}  "
            f"{_num(None if last is None else last.loss):>10}  {dist:>10}"
        )
    lines.append(
        f"  (log scale per column, one character {'a step' if per == 1 else f'per {per} steps'} "
        f"from {lo}; {_BAD} non-finite or raised, {_SKIPPED} skipped, blank not measured; "
        "param dist: |params - baseline's| / |baseline's| at the end, - when the baseline's "
        "are not finite)"
    )
    lines.append("")
    for e in r.experiments:
        name = term_safe(e.change)
        if e.stopped is not None:
            exc = next((s.exception for s in e.steps if s.step == e.stopped), None)
            lines.append(f"  {name}: step {e.stopped} raised {term_safe(exc)}; stopped there")
    removed = [e.change for e in r.helpful]
    if bf is None:
        lines.append(f"verdict: the baseline has no failure in steps {lo}..{hi}")
    elif removed:
        lines.append(
            f"verdict: {', '.join(term_safe(x) for x in removed)} "
            f"remove{'s' if len(removed) == 1 else ''} the failure (no failure through step {hi})"
        )
    else:
        lines.append(f"verdict: no change removes the failure (the baseline fails at step {bf})")
    for n in r.notes:
        if not n.startswith("the baseline has no failure"):  # the verdict just said so
            lines.append(f"note: {term_safe(n)}")
    return "\n".join(line.rstrip() for line in lines)


_FLAGS = tuple(kind for kind, value in CHANGES.items() if value)  # the flags with a value
_ORDER = "replay.whatif.order"


class _InOrder(click.Command):
    """Remembers the order the change flags came in: click hands each flag's values over
    apart, and the experiments run in the order given."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        order: list[tuple[str, str | None]] = []
        it = iter(args)
        for a in it:
            if a == "--":
                break
            name, eq, val = a.partition("=")
            if name == "--no-autocast":
                order.append(("no-autocast", ""))
            elif name.startswith("--") and name[2:] in _FLAGS:
                order.append((name[2:], val if eq else next(it, None)))
        ctx.meta[_ORDER] = order
        return super().parse_args(ctx, args)


def _changes(given: dict[str, tuple[str, ...]], no_autocast: int) -> list[Any]:
    """The changes in command-line order (checked before torch is imported); ``given``: each
    flag's values, by click's name for it (``skip_step``)."""
    from ..workflows.whatif import parse_change

    grouped = [(kind, a) for kind in _FLAGS for a in given[kind.replace("-", "_")]]
    grouped += [("no-autocast", "")] * no_autocast
    order = click.get_current_context().meta.get(_ORDER) or []
    if sorted(order, key=str) != sorted(grouped, key=str):
        order = grouped  # an option's value looked like a flag: keep click's reading
    return [parse_change(kind, a) for kind, a in order if a is not None]


@click.command(cls=_InOrder)
@click.argument("run", type=click.Path(dir_okay=False, path_type=str))
@click.option("--from-step", type=int, metavar="S", help="First step changed.")
@click.option("--to-step", type=int, metavar="T", help="Last step replayed.")
@click.option("--set", multiple=True, metavar="KEY=VALUE", help="Set a hyper-parameter.")
@click.option("--scale", multiple=True, metavar="KEY=FACTOR", help="Scale a hyper-parameter.")
@click.option("--clip", multiple=True, metavar="MAXNORM", help="Clip the grad norm.")
@click.option("--skip-step", multiple=True, metavar="N", help="Do not run step N.")
@click.option("--drop-samples", multiple=True, metavar="N:I,J", help="Drop samples of step N.")
@click.option("--seed", multiple=True, metavar="K", help="Another RNG draw.")
@click.option("--dtype", multiple=True, metavar="float32", help="The step in float32.")
@click.option("--no-autocast", count=True, help="The step with autocast turned off.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@engine_options
def whatif(
    run: str,
    from_step: int | None,
    to_step: int | None,
    no_autocast: int,
    as_json: bool,
    options: ReplayOptions,
    **given: tuple[str, ...],  # each change flag's values: set=(...), skip_step=(...)
) -> int:
    """Replay RUN's failing steps as recorded, then once per change: does the failure go away?

    Replays steps S..T (default: from the snapshot bisect starts at, or the one before when
    that one is at the failing step, through the first bad step + 3) from the state before S:
    first as recorded (checked bitwise against the recording), then once per change, each from
    that same state. Every flag may repeat; each occurrence is its own experiment, run in the
    order given.

    \b
      --set KEY=VALUE       a param-group hyper-parameter (lr, weight_decay...),
                            in every group, at every step
      --scale KEY=FACTOR    the recorded hyper-parameter times FACTOR
      --clip MAXNORM        clip the gradient norm right before every optimizer step
      --skip-step N         step N is not run; the state carries over to N+1
      --drop-samples N:I,J  step N without samples I, J (along bisect's batch axis)
      --seed K              each step's recorded RNG, reseeded from K: data or luck?
      --no-autocast         every autocast region of the step turned off
      --dtype float32       no autocast, and the batch's floating tensors in float32

    Exit codes: 0 some change removes the failure, 1 none does (or the baseline has no
    failure), 2 usage error or a change the run cannot take, 3 unusable recording, 4 unusable
    entry point, 5 replay failed, 6 internal error.
    """
    from ..workflows.whatif import run_whatif

    changes = _changes(given, no_autocast)
    if not changes:
        raise click.UsageError("name at least one change: " + ", ".join(f"--{k}" for k in CHANGES))
    report = replaying(
        as_json,
        partial(run_whatif, run, changes, from_step=from_step, to_step=to_step, options=options),
        render_whatif,
        progress="replay whatif",
    )
    if as_json and report.baseline.first_failure is None:  # (the text report's verdict says so)
        click.echo(
            f"replay: the baseline has no failure in steps {report.from_step}..{report.to_step}: "
            "nothing for a change to remove",
            err=True,
        )
    return EXIT_OK if report.helpful else EXIT_NOTHING_FOUND
