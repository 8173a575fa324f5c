"""Why a replay differs from its recording: the replay raised, state changed outside the step, or
the computation is not deterministic.

Three causes read the same in a bare comparison ("step 7's loss differs") and need opposite
fixes, so after the first divergence the engine runs two experiments:

1. **The replay raised** where the recording did not: the step depends on something the
   replayed process lacks (a global the loop sets, an object ``build_fn`` does not return).
2. **Two replays from the same state disagree** with each other: the same inputs give different
   bits, real non-determinism (kernels, threads, uninitialised memory, hardware).
3. **The replays agree with each other but not with the recording**: the step's inputs differ
   from the recorded ones, so state changed outside the step. Replaying up to the next kept
   snapshot and comparing every object with it names what drifted (model parameters, module
   buffers, optimizer, scheduler, scaler, gradients, other named objects).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..bisect.compare import (
    HINT_CARRIED,
    HINT_NONDET,
    HINT_OR_CARRIED,
    HINT_OUTSIDE,
    HINT_RAISED,
    VERIFIED_COLUMNS,
    compare_replays,
    same_bits,
)
from ..capture.objects import state_of
from ..capture.suspects import Suspect, buffers, candidates, changed_by, same_tensor
from ..capture.tensors import from_leaves
from ..engine import Engine
from ..engine.entry import source_changed
from ..engine.state import _int_keys
from ..reports import Divergence, DivergenceCause, ExceptionInfo, StateDrift
from ..trace.stats import floating, real_parts

__all__ = ["explain_divergence", "state_diff"]

HINT_NUMERICS = (
    "replay where the recording was made (the same GPU, driver, CUDA, cuDNN and torch, the "
    "same matmul precision and TF32 settings), or compare within a tolerance"
)

HINT_ENVIRON = (
    "replay with the recorded run's environment variables (those named): a program that reads "
    "one into its step (a clip value, a scale, a flag) computes otherwise without it"
)

HINT_STEP_FN = (
    "hand what differs to the step as its batch or a per-step value (rec.step(batch, "
    "name=value)), not through its closure; or record each phase to a Recorder of its own"
)

_NAMES = 5  # names listed per drifted object


def _max_diff(a: Any, b: Any) -> float | None:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape:
        if floating(a) and floating(b) and a.is_complex() == b.is_complex():
            # (a complex tensor by its real and imaginary parts: .double() dropped the latter)
            d = (
                real_parts(a.detach()).double() - real_parts(b.detach()).to(a.device).double()
            ).abs()
            d = d[torch.isfinite(d)]
            return float(d.max()) if d.numel() else None
    return None


Diffs = list[tuple[str, float | None]]


def _diff_paths(live: Any, kept: Any, path: str = "", out: Diffs | None = None) -> Diffs:
    """``(path, max |diff|)`` of every leaf where ``live`` and ``kept`` differ (added to
    ``out``, which is returned)."""
    out = [] if out is None else out
    if isinstance(live, torch.Tensor) or isinstance(kept, torch.Tensor):
        if not (
            isinstance(live, torch.Tensor)
            and isinstance(kept, torch.Tensor)
            and same_tensor(live.detach(), kept)
        ):
            out.append((path, _max_diff(live, kept)))
    elif isinstance(live, dict) and isinstance(kept, dict):
        for k in dict.fromkeys([*live, *kept]):
            _diff_paths(live.get(k), kept.get(k), f"{path}.{k}" if path else str(k), out)
    elif isinstance(live, (list, tuple)) and isinstance(kept, (list, tuple)):
        if len(live) != len(kept):
            out.append((path, None))
        else:
            for i, (a, b) in enumerate(zip(live, kept)):
                _diff_paths(a, b, f"{path}[{i}]", out)
    elif isinstance(live, float) and isinstance(kept, float):
        if not same_bits(live, kept):
            out.append((path, abs(live - kept) if math.isfinite(live - kept) else None))
    elif live != kept:
        out.append((path, None))
    return out


def state_diff(engine: Engine, s: int) -> list[StateDrift]:
    """Compare the live objects with the recorded snapshot of step ``s``, object by object.

    Call it when the live objects hold the state right before ``s`` (``state_before(s)``).
    Returns one entry per object that differs.
    """
    snap = engine.snapshot(s)
    dev = engine._leaf_device
    objs = engine.objs
    model = objs.model
    params = {n for n, _ in model.named_parameters()}
    found: list[StateDrift] = []

    def report(what: str, diffs: Diffs) -> None:
        if diffs:
            sizes = [d for _, d in diffs if d is not None]
            found.append(
                StateDrift(
                    object=what,
                    names=[p for p, _ in diffs[:_NAMES]],
                    count=len(diffs),
                    max_abs_diff=max(sizes) if sizes else None,
                )
            )

    with torch.no_grad():
        diffs = _diff_paths(dict(model.state_dict()), dict(from_leaves(snap["model"], dev)))
        report("model parameters", [d for d in diffs if d[0] in params])
        report("module buffers", [d for d in diffs if d[0] not in params])
        if objs.optimizer is not None and snap.get("optimizer") is not None:
            kept = _int_keys(from_leaves(snap["optimizer"], dev))
            report("optimizer", _diff_paths(state_of(objs.optimizer), kept))
        for role in ("scheduler", "scaler"):
            obj = objs.named.get(role)
            if obj is not None and snap.get(role) is not None:
                report(role, _diff_paths(state_of(obj), from_leaves(snap[role], dev)))
        kept_objects = snap.get("objects") or {}
        for name, obj in objs.extras.items():
            if name in kept_objects:
                report(name, _diff_paths(state_of(obj), from_leaves(kept_objects[name], dev)))
        if "grads" in snap:
            live_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            report("gradients", _diff_paths(live_grads, from_leaves(snap["grads"], dev)))
    return found


def _changed_sources(engine: Engine) -> list[str]:
    """The recorded entry points' files whose source changed since the recording."""
    entries = [e for e in engine.rec.entry.values() if e.get("path")]
    changed = [e["path"] for e in entries if source_changed(e["path"], e.get("sha256"), None)]
    return list(dict.fromkeys(changed))


def explain_divergence(
    engine: Engine, divergence: Divergence, replayed_exception: ExceptionInfo | None
) -> DivergenceCause:
    """Tell why step ``divergence.step`` differs from the recording (see the module doc)."""
    out = _explain(engine, divergence, replayed_exception)
    environ = getattr(engine, "environ_differences", None)
    if environ and out.kind != "nondeterministic":
        # The program runs here without a variable the recorded run had, or with another
        # value: one it reads into its step is the likeliest outside input of all.
        out.changed_environ = list(environ)
        out.summary += f"; the environment differs from the recorded run's: {', '.join(environ)}"
        out.hint = HINT_ENVIRON
    return out


def _explain(
    engine: Engine, divergence: Divergence, replayed_exception: ExceptionInfo | None
) -> DivergenceCause:
    t = divergence.step
    changed = _changed_sources(engine)
    out = DivergenceCause(step=t, changed_files=changed)
    handed = engine.unmade_step_fn(t)
    if handed is not None:
        # Not state, nor numerics: the program handed its step another function (or the same
        # one over other objects) at step c that a replay could not make again, and ran the
        # first one it is handed.
        c, fn = handed
        what = f"over another {fn['over']}" if fn.get("over") else "another step function"
        out.kind = "outside_state"
        out.summary = (
            f"step {c} was handed {fn['qualname']} {what} than the step before (the recorder "
            f"said so while the run trained): a replay runs every step with the function the "
            f"program hands its first step, so steps from {c} on do not replay as recorded"
        )
        out.hint = HINT_STEP_FN
        return out
    if divergence.column == "exception":
        rec_type, got = divergence.recorded, divergence.replayed
        if got is not None:
            msg = replayed_exception["message"] if replayed_exception else ""
            out.kind = "raised"
            out.summary = (
                f"the replay of step {t} raised {got}: {msg}"
                + (f" (the recording raised {rec_type})" if rec_type else "")
                + ("" if rec_type else "; the recorded step did not raise")
            )
            out.hint = HINT_RAISED
            out.exception = ExceptionInfo(type=str(got), message=msg)
            _name_buffers(engine, out)
            return out
        out.summary = f"the recorded step {t} raised {rec_type}, its replay did not"
        out.hint = HINT_OUTSIDE
        return out
    carried = divergence.carried_on
    if carried is not None:  # (verify_window's finding: no experiment can redo it here)
        out.snapshot = t
        out.summary = (
            f"step {t} replays bitwise when the replay carries on from the snapshot of step "
            f"{carried}, but not from the snapshot of step {t} itself: the step reads state "
            "the snapshots do not hold, so a bisect of a failure after step "
            f"{t} would not reproduce it"
        )
        out.hint = HINT_CARRIED
        _name_suspects(engine, t, out, memories=True)
        return out
    engine.state_before(t, keep=True)
    a = engine.run_step(t).row()
    engine.state_before(t, keep=True)
    b = engine.run_step(t).row()
    if compare_replays(a, b) is not None:
        col = next(
            (c for c in (*VERIFIED_COLUMNS, "grad_norm") if not same_bits(a.get(c), b.get(c))),
            "exception",
        )
        out.kind = "nondeterministic"
        out.summary = (
            f"two replays of step {t} from the same state disagree ({col}: {a.get(col)} vs "
            f"{b.get(col)}): same inputs, different bits"
        )
        out.hint = HINT_NONDET
        if engine.window.snapshot_for(t) > int(engine.rec.config.get("start_step") or 0):
            # From a later snapshot, the first replay also ran on what the program's own start
            # left in state no snapshot holds; the replays after it on what the first left.
            out.hint = f"{HINT_NONDET}; {HINT_OR_CARRIED}"
            out.summary = out.summary.replace(
                ": same inputs, different bits",
                f" (replayed from the snapshot of step "
                f"{engine.window.snapshot_for(t)}, not the run's start)",
            )
        # Or not non-determinism at all: the first replay changed state the step reads that no
        # snapshot holds (an RL environment's own generator), and the second read it changed.
        said = out.summary, out.hint
        out.summary = (
            f"two replays of step {t} from the same snapshot disagree ({col}: {a.get(col)} vs "
            f"{b.get(col)}): the first changed state that no snapshot holds, and the second "
            "started from what it left"
        )
        _name_suspects(engine, t, out)
        if out.suspects:
            out.kind = "outside_state"
        else:
            out.summary, out.hint = said
        return out
    later = [s for s in engine.window.snapshots if s > t]
    differs: list[StateDrift] = []
    if later:
        out.snapshot = later[0]
        engine.replay_through(later[0])
        differs = state_diff(engine, later[0])
    out.differs = differs
    if differs:
        what = ", ".join(d.object for d in differs)
        first = differs[0]
        summary = (
            f"state changed outside the step: replaying from the snapshot of step "
            f"{engine.window.snapshot_for(t)} up to step {out.snapshot} gives {what} that "
            f"differ from the snapshot recorded there (e.g. {first.object} "
            f"{', '.join(first.names[:3])}), while two replays of step {t} agree bitwise"
        )
    else:
        summary = (
            f"two replays of step {t} agree bitwise but not with the recording: the step read "
            "something replay does not restore"
        )
    if changed:
        summary += f"; note that {', '.join(changed)} changed since the recording"
    numerics = getattr(engine, "numerics_differences", None)
    if numerics and not differs:
        # The replays agree with each other, and this machine computes otherwise than the
        # recording's did: a numerics difference, not objects to restructure.
        out.kind, out.hint = "outside_state", HINT_NUMERICS
        out.summary = (
            f"two replays of step {t} agree bitwise but not with the recording, and the "
            f"numerics differ from the recording's ({'; '.join(numerics)}): a numerics "
            "difference, not state outside the step"
        )
        return out
    out.kind, out.summary, out.hint = "outside_state", summary, HINT_OUTSIDE
    _name_suspects(engine, t, out, memories=True)
    return out


def _name_suspects(engine: Engine, t: int, out: DivergenceCause, memories: bool = False) -> None:
    """Name the state the step changes that no snapshot holds (``capture/suspects.py``), in
    the summary and the hint: one more run of step ``t``. ``memories``: when it changes none,
    name a replay memory (a ``deque``) it reads instead, which the loop fills between steps
    (PyTorch's DQN tutorial: ``optimize_model()`` returns early while the memory is short,
    samples it after; replayed from a snapshot, it finds another memory)."""
    try:
        found = candidates(engine.step_fn, engine.objs)
        named = []
        if found:
            engine.state_before(t, keep=True)
            named = changed_by(lambda: engine.run_step(t), found)
    except Exception:  # noqa: BLE001 - naming suspects helps; it must not fail the verdict
        return
    if not named:
        if memories:
            _name_buffers(engine, out, kinds=("deque",))
        return
    # a random generator first: what a step draws from decides all the rest it does
    named.sort(key=lambda s: not s.kind.startswith("random generator"))
    out.suspects = [s.describe() for s in named]
    shown = ", ".join(s.describe() for s in named[:3]) + (" and more" if len(named) > 3 else "")
    out.summary += f"; the step changes {shown}, which no snapshot holds"
    plain = ("tensor", "number", "array")
    unsaved = [s for s in named if s.unsaved]
    named = [s for s in named if not s.unsaved]
    rngs = [s for s in named if s.kind.startswith("random generator")]
    objs = [s for s in named if not s.kind.startswith((*plain, "random generator"))]
    # (an array beside a generator is most often drawn from it: an environment's state, made
    # again at each reset; the advice is then the generator's alone)
    tensors = [
        s for s in named if s.kind.startswith(plain) and not (rngs and s.kind.startswith("array"))
    ]
    says = []
    # a generator the program made and keeps at one name can be held (capture/generators.py);
    # an environment's, which reset(seed=...) makes anew, is seeded from the batch instead
    own = [s for s in rngs if "." not in s.name]
    if own:
        given = ", ".join(f'"{_key(s.name)}": {s.name}' for s in own[:3])
        says.append(
            f"give the Recorder {_names(own)} (objects={{..., {given}}}): snapshots keep a "
            "generator's state"
        )
    if rngs and len(own) < len(rngs):
        says.append(
            f"seed {_names([s for s in rngs if s not in own])} from the step's batch when the "
            "step starts (an environment's reset(seed=...) with the episode's seed as the "
            "batch), or draw from torch's, numpy's global or python's generator, whose states "
            "the Recorder keeps"
        )
    if objs:
        given = ", ".join(f'"{_key(s.name)}": {s.name}' for s in objs[:3])
        says.append(f"give the Recorder {_names(objs)} (objects={{..., {given}}})")
    if tensors:
        says.append(
            f"hand {_names(tensors)} to the step through rec.step(batch, name=value) (a batch "
            f"it prefetched: as the batch), or keep {'them' if len(tensors) > 1 else 'it'} in "
            "an object the Recorder holds (a module's buffer)"
        )
    if unsaved:
        many = len(unsaved) > 1
        where = "their modules' state_dicts" if many else "its module's state_dict"
        says.append(
            f"keep {_names(unsaved)} in {where}, which the snapshots are made of: register "
            f"{'each' if many else 'it'} as a "
            'persistent buffer (self.register_buffer("name", tensor); a number as a 0-dim '
            "tensor) instead of a plain attribute or a buffer with persistent=False"
        )
    out.hint = "; ".join(says)


def _name_buffers(
    engine: Engine, out: DivergenceCause, kinds: tuple[str, ...] = ("deque", "list", "dict")
) -> None:
    """A replay that raised where the run did not (or, ``kinds`` deques alone, differs with no
    state named): name the collections the step reads that the loop fills between steps
    (``suspects.buffers``: an RL replay memory it samples from, empty in a replay from a
    snapshot), with the remedy, sampling in the loop."""
    found = [s for s in read_buffers(engine) if s.kind.startswith(kinds)]
    if not found:
        return
    out.suspects = [s.describe() for s in found]
    shown = ", ".join(s.describe() for s in found[:3]) + (" and more" if len(found) > 3 else "")
    out.summary += f"; the step reads {shown}, which no snapshot holds"
    out.hint = buffers_hint(found, named=True)


def read_buffers(engine: Engine) -> list[Suspect]:
    """``suspects.buffers`` of the engine's step (none when they cannot be read)."""
    try:
        return buffers(engine.step_fn, engine.objs)
    except Exception:  # noqa: BLE001 - naming them helps; it must not fail the verdict
        return []


def buffers_hint(found: list[Suspect], named: bool = False) -> str:
    """What to change when the step samples from a collection the loop fills (``named``:
    the text around it names the collection already)."""
    remedy = (
        f"sample what the step takes from {_names(found)} in the training loop and hand it to "
        "the step as its batch (rec.step(transitions)): the loop fills it between steps, so a "
        "replay from a snapshot cannot draw the same samples"
    )
    if named:
        return remedy
    return f"the step reads {found[0].describe()}, which no snapshot holds: {remedy}"


def _names(suspects: list[Suspect]) -> str:
    return ", ".join(s.name for s in suspects[:3]) + (" and the rest" if len(suspects) > 3 else "")


def _key(name: str) -> str:
    key = "".join(c if c.isalnum() else "_" for c in name.removeprefix("self.")).strip("_")
    return key or "state"
