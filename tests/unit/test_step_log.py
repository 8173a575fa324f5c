"""The step log between the training thread and the writer process (store/step_log.py)."""

from __future__ import annotations

import json
import random

import numpy as np
import torch

from replay.capture.rng import capture_rng, rng_to_tree
from replay.capture.tensors import to_leaves
from replay.record.step_log_writer import StepLogWriter
from replay.store.step_log import StepLog
from replay.store.tree import decode
from replay.store.writer import pack_parts


def _parts(n: int, value: int) -> list[np.ndarray]:
    return [np.full(3, value, np.uint8), np.full(n - 3, value, np.uint8)]


def _pair(size: int) -> tuple[StepLog, StepLog]:
    parent = StepLog.create(size)
    assert parent is not None
    return parent, StepLog.attach(parent.fd)


def test_a_record_is_invisible_until_published_and_whole_after():
    parent, child = _pair(4096)
    try:
        assert parent.begin(7, _parts(100, 7), 3, 2)
        assert child.published() == 0  # begun, not published: a reader sees nothing
        assert list(child.read(0, child.published())) == []
        parent.publish(np.array([1.5, np.nan]))
        (rec,) = child.read(0, child.published())
        assert (rec.step, rec.slot, rec.mlen) == (7, -1, 3)
        assert rec.payload.tobytes() == bytes([7]) * 100
        assert rec.health[0] == 1.5 and np.isnan(rec.health[1])
        assert rec.end == child.published()
    finally:
        parent.close()
        child.close()


def test_a_record_begun_when_training_died_is_never_read():
    # What a kill -9 in the middle of a step leaves: the bytes are in the log, the published end
    # is not moved, so the writer process reads the records before it and nothing of this one.
    parent, child = _pair(4096)
    try:
        parent.begin(0, _parts(64, 1), 3, 1)
        parent.publish(np.zeros(1))
        parent.begin(1, _parts(64, 2), 3, 1)  # ... and the process dies here
        steps = [r.step for r in child.read(0, child.published())]
        assert steps == [0]
    finally:
        parent.close()
        child.close()


def test_records_wrap_around_and_wait_for_the_writer_to_release_space():
    parent, child = _pair(4096)
    try:
        pos, seen, t = 0, [], 0
        for _ in range(60):  # 15 laps of the ring
            while parent.begin(t, _parts(300, t % 251), 3, 4 if t % 3 else 0, slot=t % 3 - 1):
                parent.publish(np.full(4, float(t)) if t % 3 else np.empty(0))
                t += 1
            # full: the writer reads and releases, then there is room again
            assert parent.free() < 400
            end = child.published()
            for rec in child.read(pos, end):
                assert rec.payload.tobytes() == bytes([rec.step % 251]) * 300
                assert rec.slot == rec.step % 3 - 1
                seen.append(rec.step)
            pos = end
            child.release(end)
        assert seen == list(range(t)) and t > 100
    finally:
        parent.close()
        child.close()


def test_an_abandoned_record_gives_back_its_bytes_as_they_were_copied():
    parent, child = _pair(4096)
    try:
        src = _parts(50, 9)
        assert parent.begin(3, src, 3, 1)
        src[1][:] = 0  # the step changes its batch in place after the copy
        payload, mlen = parent.begun()
        assert mlen == 3 and payload.tobytes() == bytes([9]) * 50
        parent.abandon()
        parent.begin(4, _parts(50, 4), 3, 1)
        parent.publish(np.zeros(1))
        assert [r.step for r in child.read(0, child.published())] == [4]
    finally:
        parent.close()
        child.close()


def test_a_record_larger_than_half_the_log_is_refused():
    parent, child = _pair(4096)
    try:
        assert not parent.begin(0, _parts(2100, 1), 3, 0)
    finally:
        parent.close()
        child.close()


def _begun_as_fresh(log, step, rng, hp, modes, batch, values):
    """The record begun in ``log`` is byte for byte the fresh encoding of what it was given
    (``rng``: the raw states); its payload and manifest length."""
    payload, mlen = log.begun()
    fresh = {
        "step": step,
        "rng": rng_to_tree(rng),
        "hparams": to_leaves(hp),
        "modes": np.asarray(modes, dtype=bool),
        "batch": to_leaves(batch),
        "exception": None,
        "values": to_leaves(values) if values else None,
    }
    parts, fresh_mlen = pack_parts(fresh)
    assert payload.tobytes() == b"".join(p.tobytes() for p in parts), step
    assert mlen == fresh_mlen, step
    return payload, mlen


def test_reused_hyper_parameter_manifests_give_the_bytes_a_fresh_encoding_gives():
    """The step log writer reuses the manifest text of hyper-parameters that did not change; the
    record must be byte for byte what encoding everything afresh gives, and a change the
    equality of python values would miss (``-0.0`` for ``0.0``, ``True`` for ``1``) is seen."""
    log = StepLog.create(1 << 20)
    assert log is not None
    writer = StepLogWriter(log, alive=lambda: True)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(), None)
    groups = [
        [{"lr": 0.1, "betas": (0.9, 0.999), "foreach": None, "wd": 0.0}],
        [{"lr": 0.1, "betas": (0.9, 0.999), "foreach": None, "wd": 0.0}],  # the same: reused
        [{"lr": 0.1, "betas": (0.9, 0.999), "foreach": None, "wd": -0.0}],
        [{"lr": 0.1, "betas": (0.9, 0.999), "foreach": True, "wd": -0.0}],
        [{"lr": torch.tensor(0.05), "betas": (0.9, 0.999), "foreach": 1, "wd": -0.0}],
    ]
    batch = (torch.arange(6.0).view(2, 3), torch.tensor([1, 0]))
    try:
        for step, hp in enumerate(groups):
            assert writer.begin(step, rng, hp, [True], batch, None)
            payload, mlen = _begun_as_fresh(log, step, rng, hp, [True], batch, None)
            record = writer.abandon({"type": "E"})
            back = decode(json.loads(payload[:mlen].tobytes()), payload[mlen:].tobytes())
            assert repr(back["hparams"]) == repr(record["hparams"])
            wd = back["hparams"][0]["wd"]
            assert np.copysign(1.0, wd) == (1.0 if step < 2 else -1.0)
        assert type(back["hparams"][0]["foreach"]) is int
    finally:
        log.close()


Pair = __import__("collections").namedtuple("Pair", "x y")

# Each differs from the one before it in one way the manifest sees (a dtype, a shape, a
# container, a scalar's type or sign, the RNG's position, a value among the values).
BATCHES = [
    ((torch.arange(6.0).view(2, 3), torch.tensor([1, 0])), {"it": 1}),
    ((torch.arange(6.0).view(2, 3), torch.tensor([1, 0])), {"it": 2}),  # only the values
    ((torch.arange(6.0).view(3, 2), torch.tensor([1, 0])), {"it": 2}),
    ((torch.arange(6.0).view(3, 2).bfloat16(), torch.tensor([1, 0])), {"it": 2}),
    ([torch.arange(6.0).view(3, 2), torch.tensor([1, 0])], None),
    (Pair(torch.ones(2, requires_grad=True), torch.tensor([1, 0])), None),
    ({"x": torch.ones(4, 4)[:, 1], "mask": torch.tensor([True, False])}, None),  # not contiguous
    ({"x": torch.ones(4), "n": 3, "scale": -0.0, "name": "a"}, {"lr": 0.5, "flag": True}),
    ({"x": torch.ones(4), "n": True, "scale": 0.0, "name": "a"}, {"lr": 0.5, "flag": 1}),
    ({"x": torch.ones(4), "size": torch.Size([4])}, {"ids": torch.arange(3)}),  # general path
    ((torch.arange(6.0).view(2, 3), torch.tensor([1, 0])), {"it": 3}),
    ((torch.arange(6.0).view(2, 3), torch.tensor([1, 0])), {"it": 3}),  # a module more, below
]


def test_reused_record_manifests_give_the_bytes_a_fresh_encoding_gives():
    """The step log writer reuses the record's manifest while its layout holds (``PackCache``):
    batches of every shape and container, values, module modes and a moved RNG, each record
    byte for byte what encoding everything afresh gives."""
    log = StepLog.create(1 << 20)
    assert log is not None
    writer = StepLogWriter(log, alive=lambda: True)
    hp = [{"lr": 0.1, "betas": (0.9, 0.999)}]
    try:
        for step, (batch, values) in enumerate(BATCHES):
            if step == 6:
                np.random.rand()  # the numpy generator moved: its position is in the manifest
            rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(), None)
            modes = [True, step % 3 == 0] + ([False] if step == len(BATCHES) - 1 else [])
            assert writer.begin(step, rng, hp, modes, batch, values)
            _begun_as_fresh(log, step, rng, hp, modes, batch, values)
            writer.abandon({"type": "E"})
    finally:
        log.close()


def test_the_rng_states_reused_give_the_bytes_a_fresh_encoding_gives():
    """The RNG subtree of a step's record is walked again only when python's or numpy's state
    is another object than the last (``_RngLayout``): whatever moved between steps (each
    generator drawn from, a cached gaussian pending or taken, CUDA states appearing and going),
    each record is byte for byte what encoding everything afresh gives."""
    log = StepLog.create(1 << 20)
    assert log is not None
    writer = StepLogWriter(log, alive=lambda: True)
    batch = (torch.arange(6.0).view(2, 3), torch.tensor([1, 0]))
    cuda = [torch.arange(16, dtype=torch.uint8)]  # (a CUDA generator's state, as bytes)
    moves = [
        lambda: None,
        lambda: None,  # nothing moved: reused
        lambda: torch.rand(2),
        lambda: random.random(),
        lambda: random.gauss(0, 1),  # python caches a gaussian: in the manifest
        lambda: None,
        lambda: random.gauss(0, 1),  # ... and takes it, drawing nothing
        lambda: np.random.rand(),  # numpy's position is in the manifest
        lambda: np.random.normal(),
        lambda: np.random.normal(),  # numpy's cached gaussian taken
        lambda: None,
        "cuda",
        "cuda",
        lambda: None,  # no CUDA states again
        lambda: None,
    ]
    reused = 0
    try:
        for step, move in enumerate(moves):
            if callable(move):
                move()
            raw = capture_rng()
            if move == "cuda":
                raw = (*raw[:3], cuda)
            before = writer._rng._keyed
            assert writer.begin(step, raw, [], [True], batch, None)
            reused += before is not None and writer._rng._keyed is before
            _begun_as_fresh(log, step, raw, [], [True], batch, None)
            writer.abandon({"type": "E"})
        assert reused >= 4  # (the steps where no generator but torch's moved)
    finally:
        log.close()


def test_a_batch_or_value_on_a_device_goes_by_the_writer_thread():
    """``StepLogWriter.begin`` takes only records whose tensors are in host memory: a batch or
    a per-step value holding another device's tensor (or a snapshot's state, ``snapshot``) is
    refused (``None``) before anything is copied, and the log stays as it was."""
    log = StepLog.create(1 << 20)
    assert log is not None
    writer = StepLogWriter(log, alive=lambda: True)
    rng = capture_rng()
    meta = torch.empty(3, device="meta")
    try:
        assert writer.begin(0, rng, [], [True], {"x": torch.ones(2), "m": meta}, None) is None
        assert writer.begin(0, rng, [], [True], (torch.ones(2),), {"aux": [meta]}) is None
        assert writer.begin(0, rng, [], [True], torch.ones(2).to_sparse(), None) is None
        assert writer.snapshot(0, 0, {"model": {"w": torch.ones(2), "b": meta}}) is None
        assert log.head == 0 and log._open is None
        assert writer.begin(0, rng, [], [True], (torch.ones(2),), {"aux": [torch.ones(1)]})
    finally:
        log.close()
