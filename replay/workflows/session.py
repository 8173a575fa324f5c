"""Opening a recording and starting the replay engine on it (torch is imported here)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import RecordingError
from ..limits import env_number
from ..safetext import say
from ..store.liveness import WriterState, wait_for_drain

if TYPE_CHECKING:
    from ..capture.guard import LiveProgram
    from ..engine import Engine
    from ..ranks.scan import RankScan
    from ..store.reader import Recording

__all__ = ["AS_RECORDED", "ReplayOptions", "with_engine", "together"]

T = TypeVar("T")


@dataclass(frozen=True)
class ReplayOptions:
    """Where and what every replaying command replays (``--device``, ``--entry``, ``--trust``:
    docs/trust.md, ``--reenter``: docs/reentry.md), handed from the CLI to the engine as one."""

    device: str | None = None
    entry: str | None = None
    trust: bool = False
    reenter: bool = False


AS_RECORDED = ReplayOptions()  # where it was recorded, its recorded entry, only trusted code

DRAIN_WAIT = 600.0  # seconds; REPLAY_DRAIN_WAIT overrides


def wait_until_drained(run: str) -> None:
    """A recording whose training died is still being committed by its writer process: wait
    for it rather than replay a partial window (a live run is read as it is)."""

    def waiting(state: WriterState) -> None:
        more = f" ({state.steps_to_come} steps to come)" if state.steps_to_come else ""
        say(f"replay: {run}: its training died; waiting for its writer to finish{more}")

    timeout = env_number("REPLAY_DRAIN_WAIT", DRAIN_WAIT)
    if not wait_for_drain(run, timeout=timeout, on_wait=waiting):
        raise RecordingError(
            f"{run}: its writer process is still committing the steps of a training run that "
            f"died, after {timeout:g} s; run this again once it has finished (replay info shows it)"
        )


def with_engine(
    run: str,
    work: Callable[[Recording, Engine], T],
    options: ReplayOptions = AS_RECORDED,
    *,
    check: Callable[[Recording], T | None] | None = None,
    pin_steps: int | None = None,
    pin_from: int | None = None,
) -> T:
    """Open ``run``, start the replay engine on it and return ``work(recording, engine)``.

    The engine's objects come from the recorded program run again up to its Recorder
    (re-entry: a recording without ``build_fn``, or ``options.reenter``), or from the recorded
    ``build_fn`` (``--entry`` names another). ``work`` then runs inside the re-run program,
    which ends before any training. ``check(recording)`` runs before any user code does: it
    refuses a request the file alone shows wrong (it raises), or answers one the file alone
    can (what it returns, unless ``None``, is the result, and nothing runs). ``pin_steps``: replay only the first steps
    of the window, read into memory at once (a live run's ring moves on); ``pin_from``: the
    first steps from the oldest kept snapshot at or after that step. The recording and the
    engine are closed afterwards.
    """
    from ..engine import Engine
    from ..engine.entry import parse_entry_override
    from ..engine.hands_off import hands_off
    from ..store import open_recording

    override = parse_entry_override(options.entry)

    wait_until_drained(run)
    # Whatever user code runs from here (the program re-run, build_fn, each replayed step)
    # changes no file of the user's and connects nowhere (replay/engine/hands_off.py).
    with hands_off(), open_recording(run) as rec:
        if pin_steps is not None:
            rec.pin(pin_steps, pin_from)
        answer = check(rec) if check is not None else None
        if answer is not None:
            return answer
        if override is None and (options.reenter or "build_fn" not in rec.entry):
            return _reentered(rec, work, options)
        engine = Engine(rec, device=options.device, entry=override, trust=options.trust)
        with closing(engine):
            return work(rec, engine)


def _reentered(
    rec: Recording,
    work: Callable[[Recording, Engine], T],
    options: ReplayOptions,
) -> T:
    from ..engine import Engine
    from ..engine.foreign import check_trusted
    from ..engine.reentry import run_program

    Engine.check_replayable(rec, live_ok=True)  # before the program runs for nothing
    check_trusted(rec, None, options.trust, program=True)

    def takeover(live: LiveProgram) -> T:
        with closing(Engine(rec, device=options.device, trust=True, program=live)) as engine:
            return work(rec, engine)

    return run_program(rec.meta, rec.env, rec.sources, takeover, recording=rec.path, log=say)


def together(
    scan: RankScan,
    mode: str,
    options: ReplayOptions,
    opened: Callable[[], None] | None = None,
    **job: Any,
) -> dict[str, Any]:
    """The leader's report (JSON) of the DDP rank set ``scan`` replayed with every rank together
    (``replay.multirank.launch``; ``job``: the mode's own arguments)."""
    from ..multirank.launch import replay_rank_set

    if opened is not None:
        opened()
    return replay_rank_set(scan, mode, **asdict(options), **job)
