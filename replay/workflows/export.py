"""Export the state before a step as a plain ``torch.save`` checkpoint: resume the real run.

After the verdict, the way back to training is the routine large-model teams describe: roll back
to a state some steps before the failure, skip the data that triggered it, go on. ``run_export``
writes that state so the user's own resume code loads it with nothing but torch:

- one file per object the run recorded (``model.pt``, ``optimizer.pt``, ``scheduler.pt``,
  ``scaler.pt``, any other named object), each its ``state_dict()``;
- ``grads.pt``: the gradients the parameters held (a loop that accumulates across steps, or one
  that never zeroes them, depends on them; ``None`` where a parameter had none);
- ``rng.pt``: the torch, CUDA, numpy and python generator states, as tensors, tuples and ints
  (``torch.load``'s default ``weights_only=True`` takes them);
- ``hparams.json``: every optimizer's numeric hyper-parameters per param group (``lr``,
  ``betas.0``, ...) at each recorded step from there on, by step: the schedule to resume with;
- ``skip.json``: where to resume, and the steps to skip on the way (the failing step, with the
  per-step values the loop recorded for it: its iteration number, its batch's indices);
- ``README.md``: how to load it.

The state is the one right before step ``step``: a snapshot's as stored, or replayed from the
snapshot before it (bitwise, as ``replay verify`` checks) when ``step`` falls between two.
Running the recorded steps from it reproduces the recording (``tests/integration/test_export.py``).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import RecordingError, ReplayError, UsageError
from ..jsonsafe import json_safe
from ..ranks.scan import rank_set
from ..store.hparams import Groups, step_hparams
from .export_state import NotReached, finite, reach
from .outdir import check_out, staged_dir
from .session import AS_RECORDED, ReplayOptions, together, with_engine

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store.reader import Recording

__all__ = ["ExportReport", "export_work", "run_export"]


@dataclass
class ExportReport:
    """What :func:`run_export` wrote."""

    out: str
    step: int  # the exported state is the one right before this step
    snapshot: int  # the snapshot it was restored from
    replayed: int  # steps replayed from that snapshot to reach it
    files: dict[str, str]  # object name -> file name inside ``out``
    first_bad: int | None  # the recording's first failing step, if any
    verified: int = 0  # replayed steps checked bitwise against the recording on the way
    skip: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ranks: dict[str, dict[str, Any]] = field(default_factory=dict)  # a rank set: each rank's

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.ranks:
            del out["ranks"]
        return out


def _default_state(engine: Engine, first_bad: int | None, notes: list[str]) -> tuple[int, int]:
    """``(step, verified)``: the state right before the first failure (after the last healthy
    step), replayed from the snapshot before it and checked bitwise on the way; when that
    cannot be the recorded state, the newest snapshot before it whose weights are all finite.
    Nothing failed: the newest snapshot."""
    if first_bad is not None and first_bad in engine.window:
        try:
            verified = reach(engine, first_bad)
            if finite(engine):
                return first_bad, verified
            notes.append(f"the parameters before step {first_bad} hold NaN/Inf")
        except NotReached as e:
            notes.append(f"the state right before step {first_bad} is not exported: {e}")
    window = engine.window
    limit = window.last if first_bad is None else first_bad
    for s in sorted((s for s in window.snapshots if s <= limit), reverse=True):
        if engine.snapshot_finite(s):
            return int(s), reach(engine, int(s))
        notes.append(f"the snapshot before step {s} holds NaN/Inf: not exported")
    raise ReplayError(
        f"{engine.rec.path}: no kept snapshot before the failure at step {first_bad} is healthy; "
        "name a step with --step"
    )


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    version, internal, gauss_next = random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None  # type: ignore[no-untyped-call]  # torch stubs
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "numpy": (
            str(kind),
            torch.from_numpy(np.asarray(keys).astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(gauss),
        ),
        "python": (int(version), tuple(int(w) for w in internal), gauss_next),
    }


_README = """\
# Resuming from `replay export`

The state right before step {step} of `{run}`{why}. Load it into the objects your training
script builds, then go on from step {step}:

```python
import json, random
import numpy as np
import torch

d = "{out}"
model.load_state_dict(torch.load(f"{{d}}/model.pt"))
{loads}grads = torch.load(f"{{d}}/grads.pt")
for name, p in model.named_parameters():
    p.grad = grads.get(name)
rng = torch.load(f"{{d}}/rng.pt")
torch.set_rng_state(rng["torch"])
if rng["cuda"] is not None:
    torch.cuda.set_rng_state_all(rng["cuda"])
kind, keys, pos, has_gauss, gauss = rng["numpy"]
np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
version, state, gauss_next = rng["python"]
random.setstate((version, tuple(state), gauss_next))
skip = json.load(open(f"{{d}}/skip.json"))  # resume at skip["resume_step"]; skip skip["skip"]
```

The RNG states are those the recorder captured right before step {step} (after its batch was
fetched): restore them after your data loader has produced that step's batch. Files:
{files}
"""


def run_export(
    run: str,
    out: str,
    *,
    step: int | None = None,
    options: ReplayOptions = AS_RECORDED,
) -> ExportReport:
    """Write the state right before ``step`` (default: the last healthy snapshot before the
    failure) to the new directory ``out``; see the module's docstring for what is in it.

    A DDP rank set: every rank replayed together, each rank's state into ``out/rank<r>/``;
    the report is the leader's (the rank the workflow runs on), with every rank's in ``ranks``.
    """
    check_out(out)
    scan = rank_set(run)
    if scan is None:
        return with_engine(run, export_work(run, out, step), options)
    with staged_dir(out) as tmp:  # every rank's folder, or none
        d = together(scan, "export", options, step=step, export_dir=tmp, shown_out=out)
    ranks = {r: x["export"] for r, x in d["ranks"].items()}
    lead = ranks[str(d["multi_rank"]["leader"])]
    return replace(
        ExportReport(**lead),  # the leader's, with every rank's files under rank<r>/
        out=out,
        files={
            f"rank{r}/{name}": f"rank{r}/{f}"
            for r, x in ranks.items()
            for name, f in x["files"].items()
        },
        verified=min(x["verified"] for x in ranks.values()),
        ranks=ranks,
    )


def export_work(
    run: str,
    out: str,
    step: int | None,
    *,
    first_bad: int | None = None,
    shown: str | None = None,
) -> Callable[[Recording, Engine], ExportReport]:
    """What :func:`run_export` does with the engine up. ``first_bad``: the failing step to
    export before (default: the recording's own); ``shown``: where ``out`` will be, for its
    README (a multi-rank export writes into a staged folder)."""

    def work(rec: Recording, engine: Engine, step: int | None = step) -> ExportReport:
        from ..capture.objects import ROLES, state_of

        first_bad_step = rec.first_failure() if first_bad is None else first_bad
        notes: list[str] = []
        if step is None:
            step, verified = _default_state(engine, first_bad_step, notes)
        else:
            if step not in engine.window:
                raise UsageError(engine.window.outside(f"--step {step}"))
            verified = reach(engine, step)
            if not finite(engine):
                notes.append(f"the parameters before step {step} hold NaN/Inf")
        snapshot = engine.window.snapshot_for(step)
        objs = engine.objs
        states: dict[str, Any] = {}
        for name in (*ROLES, *objs.extras):
            obj = objs.named.get(name)
            if obj is not None and hasattr(obj, "state_dict"):
                states[name] = state_of(obj)  # (a ZeRO optimizer: this rank's shard)
        grads = {n: p.grad for n, p in objs.model.named_parameters()}
        rng = _rng_state()  # step's recorded states, which state_before put in place
        skip: list[dict[str, Any]] = []
        if first_bad_step is not None and first_bad_step >= step:
            skip.append({"step": first_bad_step, "values": _values(engine, first_bad_step, notes)})
        with staged_dir(out) as tmp:  # renamed to out once whole: never a partial one
            files: dict[str, str] = {}
            for name, obj in [*states.items(), ("grads", grads), ("rng", rng)]:
                files[name] = f"{name}.pt"
                _save(obj, os.path.join(tmp, files[name]))
            with open(os.path.join(tmp, "skip.json"), "x") as fh:
                json.dump(
                    {"resume_step": step, "first_bad": first_bad_step, "skip": skip}, fh, indent=2
                )
            files["skip"] = "skip.json"
            schedule = _schedule(rec, step)
            if schedule:
                with open(os.path.join(tmp, "hparams.json"), "x") as fh:
                    json.dump({"steps": schedule}, fh, indent=1)
                files["hparams"] = "hparams.json"
            loads = "".join(
                f'{name}.load_state_dict(torch.load(f"{{d}}/{name}.pt"))\n'
                for name in states
                if name != "model"
            )
            why = f", the last healthy state kept before the failure at step {first_bad_step}"
            with open(os.path.join(tmp, "README.md"), "x") as fh:
                fh.write(
                    _README.format(
                        step=step,
                        run=os.path.basename(run),
                        why=why if skip else "",
                        out=shown or out,
                        loads=loads,
                        files="\n".join(f"- `{f}`" for f in files.values()),
                    )
                )
            files["README"] = "README.md"
        return ExportReport(
            out=shown or out,
            step=step,
            snapshot=snapshot,
            replayed=step - snapshot,
            files=files,
            first_bad=first_bad_step,
            verified=verified,
            skip=skip,
            notes=notes,
        )

    return work


def _schedule(rec: Recording, step: int) -> dict[str, Groups]:
    """Every optimizer's numeric hyper-parameters, per param group, at each recorded step from
    ``step`` on (the schedule the resumed run follows), by step; ``{}`` without an optimizer."""
    out: dict[str, Groups] = {}
    for t in (int(t) for t in rec.steps() if t >= step):
        try:
            values = step_hparams(rec, t)
        except (KeyError, RecordingError):  # (the ring moved on, or a damaged record)
            continue
        if values:
            out[str(t)] = values
    return out


def _save(obj: Any, path: str) -> None:
    """``torch.save`` through a file we create (``O_EXCL``), so that a full disk is the
    ``OSError`` it is (torch reports it as ``RuntimeError: ... unexpected pos``)."""
    import torch

    with open(path, "xb") as fh:
        try:
            torch.save(obj, fh)
        except RuntimeError as e:
            if isinstance(e.__context__, OSError):
                raise e.__context__ from None
            raise


def _values(engine: Engine, t: int, notes: list[str]) -> dict[str, Any] | None:
    """Step ``t``'s recorded per-step values (the loop's iteration number, its batch's indices)
    as JSON, where the loop passed any; they identify the batch to skip."""
    try:
        values = engine.values(t)
    except Exception as e:  # noqa: BLE001 - the step to skip is named by its number anyway
        notes.append(f"step {t}'s recorded values could not be read ({type(e).__name__}: {e})")
        return None
    return json_safe(values) if values else None
