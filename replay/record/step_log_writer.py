"""The training thread's side of the step log (``store/step_log.py``): a step is safe when
``Recorder.step`` returns.

Before the step runs, its record (RNG states, the batch's bytes, hyper-parameters, module modes,
per-step values) is encoded and copied into the shared log: the one copy of the batch, taken
while it is still as the loop handed it over. After the step, the health row is written beside
it and the record is published. The writer process commits published records on its own; a
``kill -9`` of training loses at most the step in flight.

Only steps whose tensors are all in host memory go this way (a CPU run): a GPU step waits for
its asynchronous copies on the writer thread, as before.
"""

from __future__ import annotations

import collections
import json
import marshal
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..capture.health import health_values
from ..capture.rng import rng_to_tree
from ..capture.tensors import host_leaves, to_leaves
from ..store.contracts import StepException, StepRecord
from ..store.layout import HEALTH_COLUMNS, object_columns
from ..store.step_log import StepLog
from ..store.tree import Keyed, Spliced, decode, encode, layout_key
from ..store.writer import PackCache, manifest_text, pack_parts

__all__ = ["StepLogWriter"]


# What a kill of the whole process group (training and its writer process, ``kill -9 -PGID``)
# may lose: the records published and not yet in the file. Training publishes no new record
# while the oldest of them came more than LAG_SECONDS ago or LAG_STEPS of them wait: it waits
# for the writer process instead (which commits every 0.2 s, or every 256 records).
LAG_SECONDS = 0.5
LAG_STEPS = 1024


class _Reused:
    """A subtree of the record that rarely changes between steps (hyper-parameters), and its
    manifest text while it can be reused: encoding them was the largest part of the manifest
    (an AdamW group: 11 values, 23 nodes). The key is ``marshal``'s exact bytes (``-0.0`` is
    not ``0.0``, ``True`` is not ``1``); values it cannot take (a tensor ``lr``) or any array
    are encoded every time, as before. The recorder passes the very same object while none
    changed (it copies them anew on a change, never in place): then not even the key is
    computed."""

    def __init__(self) -> None:
        self._key: bytes | None = None  # the last tree seen, and its manifest
        self._text = ""
        self._src: Any = None  # the object those were taken from

    def take(self, tree: Any) -> tuple[Any, tuple[str, ...]]:
        """What the record holds in its place (a :class:`Spliced` when the manifest text is
        reused, the leaves otherwise), and that text."""
        if tree is self._src:
            return Spliced(), (self._text,)
        self._src = None
        leaves = to_leaves(tree)
        try:
            key = marshal.dumps(leaves, 2)  # (version 2: no back-references, same bytes)
        except ValueError:
            return leaves, ()
        if key != self._key:
            manifest, buffers = encode(leaves)
            if buffers:
                return leaves, ()
            self._key, self._text = key, manifest_text(manifest)
        self._src = tree  # (held: its id cannot go to another object meanwhile)
        return Spliced(), (self._text,)


class _RngLayout:
    """The RNG subtree of a step's record with its layout key, walked again only when python's
    or numpy's state is not the one walked last: their capture hands back the very same state
    object while the generator was not used (``capture/rng.py``), and torch's CPU state is a
    byte array of one size. A step that used neither (most loops) pays for torch's bytes only:
    the subtree's 20 nodes walked for the key were a third of encoding a step's record."""

    def __init__(self) -> None:
        self._raw: Any = None  # the states last walked, and their subtree as walked
        self._keyed: Keyed | None = None

    def take(self, raw: Any) -> Any:
        py, npy, cpu, cuda = raw
        last, keyed = self._raw, self._keyed
        if (
            keyed is not None
            and py is last[0]
            and npy is last[1]
            and cuda is None
            and cpu.shape == last[2].shape
            and cpu.dtype == last[2].dtype
        ):
            now = cpu.numpy()  # (torch's state, the last buffer: see below)
            return Keyed({**keyed.tree, "torch": now}, keyed.key, [*keyed.buffers[:-1], now])
        tree = rng_to_tree(raw)
        key: list[Any] = []
        buffers: list[np.ndarray | bytes] = []
        self._raw, self._keyed = raw, None
        if not layout_key(tree, key, buffers):
            return tree
        keyed = Keyed(tree, tuple(key), buffers)
        if cuda is None and buffers and buffers[-1] is tree["torch"]:
            self._keyed = keyed
        return keyed


class StepLogWriter:
    """Begins, publishes or abandons one step at a time in a :class:`StepLog`."""

    def __init__(
        self, log: StepLog, *, alive: Callable[[], bool], watched: tuple[str, ...] = ()
    ) -> None:
        self.log = log
        self.watched = watched  # the objects with their own health columns (capture/watch.py)
        self._ncols = len(HEALTH_COLUMNS) + len(object_columns(watched))
        self._alive = alive  # whether the writer process still reads the log
        self.waited = 0  # steps that found the log full and waited for the writer
        self.lagged = 0  # steps that waited because the file lagged LAG_SECONDS or LAG_STEPS
        # (end in the log, time published) of each record not known to be in the file yet
        self._unreleased: collections.deque[tuple[int, float]] = collections.deque()
        self.overflowed = 0  # steps that went the slow way for want of room
        self._hparams = _Reused()  # the run's optimizer's hyper-parameters
        self._object_hparams = _Reused()  # the other optimizers'
        self._packer = PackCache()  # the record's manifest, reused while its layout holds
        self._rng = _RngLayout()
        self._modes: tuple[list[bool], np.ndarray] = ([], np.zeros(0, dtype=bool))

    def begin(
        self,
        step: int,
        rng: Any,
        hparams: Any,
        modes: list[bool],
        batch: Any,
        values: dict[str, Any] | None,
        batch_ref: dict[str, Any] | None = None,
        trainable: np.ndarray | None = None,
        object_hparams: dict[str, Any] | None = None,
        step_fn: dict[str, Any] | None = None,
    ) -> bool | None:
        """Copy the step's record into the log; ``False``: the caller hands the step to the
        writer thread instead (a record too large for the log, or the writer process gone) and
        waits until it is passed on, so that it too is safe once the step returns; ``None``:
        a tensor of the batch or the values is not in host memory (the writer thread's too).

        A full log means the writer process is behind: training waits for room, as long as
        that process lives (a bounded backlog is what bounds a kill's loss, and memory)."""
        leaves = host_leaves(batch)
        kept = host_leaves(values) if values else None
        if (leaves is None and batch is not None) or (kept is None and values):
            return None
        if self._unreleased:
            self._bound_lag()
        hp, hp_text = self._hparams.take(hparams)
        if modes != self._modes[0]:  # (the array is a buffer of the record: never changed)
            self._modes = (modes, np.asarray(modes, dtype=bool))
        record: StepRecord = {
            "step": Spliced(),  # type: ignore[typeddict-item]  # its text is spliced in below
            "rng": self._rng.take(rng),
            "hparams": hp,
            "modes": self._modes[1],
            "batch": leaves,
            "exception": None,
            "values": kept,
        }
        if batch_ref is not None:  # the batch by reference (capture/loader.py)
            record["batch_ref"] = batch_ref
        if trainable is not None:  # the parameters' requires_grad, changed since the last step
            record["trainable"] = trainable
        if object_hparams is not None:  # the other optimizers' (capture/hparams.py)
            record["object_hparams"], more = self._object_hparams.take(object_hparams)
            hp_text += more
        if step_fn is not None:  # another step function than the step before's
            record["step_fn"] = host_leaves(step_fn)  # (its tensors: in host memory)
        # The step number changes every step and nothing else in the layout usually does.
        parts, mlen = self._packer.pack(record, (f'{{"t":"int","v":{int(step)}}}', *hp_text))
        ncols = self._ncols
        if self.log.begin(step, parts, mlen, ncols):
            return True
        if sum(int(p.nbytes) for p in parts) > self.log.size // 4:
            self.overflowed += 1
            return False  # never fits: no point waiting
        self.waited += 1
        delay = 0.0005
        while self._alive():
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
            if self.log.begin(step, parts, mlen, ncols):
                return True
        self.overflowed += 1
        return False

    def _bound_lag(self) -> None:
        """Wait while the records not yet in the file span more than ``LAG_SECONDS`` or
        ``LAG_STEPS`` (as long as the writer process lives): what a process-group kill loses."""
        pending = self._unreleased
        delay = 0.0  # (none waited yet)
        while True:
            released = self.log.released()
            while pending and pending[0][0] <= released:
                pending.popleft()
            if not pending or (
                len(pending) < LAG_STEPS and time.monotonic() - pending[0][1] <= LAG_SECONDS
            ):
                return
            if not delay:
                self.lagged += 1
            if not self._alive():
                return
            delay = min(delay * 2, 0.01) or 0.0005
            time.sleep(delay)

    def snapshot(self, step: int, slot: int, state: dict[str, Any]) -> bool | None:
        """Copy a snapshot of live state (views of the model's own tensors) into the log and
        publish it at once: the one copy, as ``copy_tree`` took before. ``False``: no room;
        ``None``: a tensor not in host memory."""
        leaves = host_leaves(state)
        if leaves is None:
            return None
        parts, mlen = pack_parts({"step": step, **leaves})
        if not self.log.begin(step, parts, mlen, 0, slot=slot):
            return False
        self.log.publish(())
        self._unreleased.append((self.log.head, time.monotonic()))
        return True

    def publish(self, health: dict[str, Any]) -> None:
        self.log.publish(health_values(health, self.watched))
        self._unreleased.append((self.log.head, time.monotonic()))

    def abandon(self, exception: StepException) -> StepRecord:
        """The step raised: drop its record from the log and return it, with the exception, as
        leaves for the writer thread (the batch as it was before the step ran)."""
        payload, mlen = self.log.begun()
        self.log.abandon()
        record: StepRecord = decode(json.loads(payload[:mlen].tobytes()), payload[mlen:].tobytes())
        record["exception"] = exception
        return record
