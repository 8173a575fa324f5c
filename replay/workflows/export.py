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
from dataclasses import dataclass, field
from typing import Any

from ..errors import ReplayError, UsageError
from .session import with_engine

__all__ = ["ExportReport", "run_export"]

_ROLES = ("model", "optimizer", "scheduler", "scaler")


@dataclass
class ExportReport:
    """What :func:`run_export` wrote."""

    out: str
    step: int  # the exported state is the one right before this step
    snapshot: int  # the snapshot it was restored from
    replayed: int  # steps replayed from that snapshot to reach it
    files: dict[str, str]  # object name -> file name inside ``out``
    first_bad: int | None  # the recording's first failing step, if any
    skip: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "out": self.out,
            "step": self.step,
            "snapshot": self.snapshot,
            "replayed": self.replayed,
            "files": dict(self.files),
            "first_bad": self.first_bad,
            "skip": list(self.skip),
            "notes": list(self.notes),
        }


def _check_out(out: str) -> None:
    """Never write over anything: ``out`` is created, or it is an empty directory."""
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise UsageError(f"--out {out}: exists and is not an empty directory; name a new one")


def _default_step(rec: Any, engine: Any) -> tuple[int, int | None, list[str]]:
    """The newest snapshot before the first failure whose weights are all finite (the last
    healthy state kept), or the newest snapshot of the window when nothing failed."""
    notes: list[str] = []
    bad = rec.first_bad()
    fails = [s for s in (bad["nonfinite"], bad["exception"]) if s is not None]
    first_bad = min(fails) if fails else None
    window = engine.window
    limit = window.last if first_bad is None else first_bad
    for s in sorted((s for s in window.snapshots if s <= limit), reverse=True):
        if engine.snapshot_finite(s):
            return s, first_bad, notes
        notes.append(f"the snapshot before step {s} holds NaN/Inf: not exported")
    raise ReplayError(
        f"{rec.path}: no kept snapshot before the failure at step {first_bad} is healthy; "
        "name a step with --step"
    )


def _others(objs: Any) -> dict[str, Any]:
    """The objects besides the model and the optimizer (which the step function updates)."""
    named = {n: objs.named.get(n) for n in ("scheduler", "scaler", *objs.extras)}
    return {n: o for n, o in named.items() if o is not None and hasattr(o, "state_dict")}


def _plain(x: Any) -> Any:
    """A state dict with its tensors as bytes: comparable with ``==``, bit for bit."""
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        return (
            "tensor",
            str(t.dtype),
            tuple(t.shape),
            t.reshape(-1).view(torch.uint8).numpy().tobytes(),
        )
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float) and x != x:
        return ("nan",)
    return x


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
    device: str | None = None,
    entry: str | None = None,
    trust: bool = False,
    reenter: bool = False,
) -> ExportReport:
    """Write the state right before ``step`` (default: the last healthy snapshot before the
    failure) to the new directory ``out``; see the module's docstring for what is in it."""
    import torch

    _check_out(out)

    def work(rec: Any, engine: Any, step: int | None = step) -> ExportReport:
        if step is None:
            step, first_bad, notes = _default_step(rec, engine)
        else:
            bad = rec.first_bad()
            fails = [s for s in (bad["nonfinite"], bad["exception"]) if s is not None]
            first_bad, notes = (min(fails) if fails else None), []
            if step not in engine.window:
                w = engine.window
                raise UsageError(
                    f"--step {step}: outside the replayable window (steps {w.first}..{w.last})"
                )
        snapshot = engine.window.snapshot_for(step)
        objs = engine.objs
        if step != snapshot:
            engine.state_before(snapshot)
            before = {n: _plain(o.state_dict()) for n, o in _others(objs).items()}
            engine.state_before(step)  # (from the live state: the steps in between, replayed)
            stale = [n for n, o in _others(objs).items() if _plain(o.state_dict()) == before[n]]
            if stale:
                at = ", ".join(str(s) for s in engine.window.snapshots)
                raise UsageError(
                    f"--step {step}: replaying steps {snapshot}..{step - 1} did not change "
                    f"{', '.join(stale)} (the loop steps it outside the step function, which "
                    f"replay does not run), so its state before step {step} is unknown; "
                    f"export the state of a snapshot: --step {at}"
                )
        else:
            engine.state_before(step)
        states: dict[str, Any] = {}
        for name in (*_ROLES, *objs.extras):
            obj = objs.named.get(name)
            if obj is not None and hasattr(obj, "state_dict"):
                states[name] = obj.state_dict()
        grads = {n: p.grad for n, p in objs.model.named_parameters()}
        rng = _rng_state()  # step's recorded states, which state_before put in place
        skip: list[dict[str, Any]] = []
        if first_bad is not None and first_bad >= step:
            skip.append({"step": first_bad, "values": _values(engine, first_bad, notes)})
        os.makedirs(out, exist_ok=True)
        files: dict[str, str] = {}
        for name, sd in states.items():
            files[name] = f"{name}.pt"
            torch.save(sd, os.path.join(out, files[name]))
        files["grads"] = "grads.pt"
        torch.save(grads, os.path.join(out, "grads.pt"))
        files["rng"] = "rng.pt"
        torch.save(rng, os.path.join(out, "rng.pt"))
        with open(os.path.join(out, "skip.json"), "w") as fh:
            json.dump({"resume_step": step, "first_bad": first_bad, "skip": skip}, fh, indent=2)
        files["skip"] = "skip.json"
        loads = "".join(
            f'{name}.load_state_dict(torch.load(f"{{d}}/{name}.pt"))\n'
            for name in states
            if name != "model"
        )
        why = (
            f", the last healthy state kept before the failure at step {first_bad}"
            if first_bad is not None and first_bad >= step
            else ""
        )
        with open(os.path.join(out, "README.md"), "w") as fh:
            fh.write(
                _README.format(
                    step=step,
                    run=os.path.basename(run),
                    why=why,
                    out=out,
                    loads=loads,
                    files="\n".join(f"- `{f}`" for f in files.values()),
                )
            )
        files["README"] = "README.md"
        return ExportReport(
            out=out,
            step=step,
            snapshot=snapshot,
            replayed=step - snapshot,
            files=files,
            first_bad=first_bad,
            skip=skip,
            notes=notes,
        )

    return with_engine(run, work, device=device, entry=entry, trust=trust, reenter=reenter)


def _values(engine: Any, t: int, notes: list[str]) -> dict[str, Any] | None:
    """Step ``t``'s recorded per-step values (the loop's iteration number, its batch's indices)
    as JSON, where the loop passed any; they identify the batch to skip."""
    from ..jsonsafe import json_safe

    try:
        values = engine.values(t)
    except Exception as e:  # noqa: BLE001 - the step to skip is named by its number anyway
        notes.append(f"step {t}'s recorded values could not be read ({type(e).__name__}: {e})")
        return None
    return json_safe(values) if values else None
