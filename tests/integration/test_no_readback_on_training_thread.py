"""``rec.step`` never reads a tensor's value back on the training thread (issue 43 item 2).

On a GPU every ``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``, ``bool(t)`` or ``float(t)`` of
a device tensor waits for everything queued: a host-device synchronisation. The recorder used to
make one per step (``bool(torch.isfinite(loss))`` of the previous step, the gradient norm's
``.item()``, the writer thread's health reads). Now the step's health goes to the host in one
non-blocking copy and is read from the host buffer when its event says it is ready
(``capture/readback.py``, ``record/inflight.py``). On the CPU the same code runs, so counting the
reads here proves the GPU path reads nothing: these are real training loops with the reading
methods of ``torch.Tensor`` wrapped to count the calls made on the training thread inside
``rec.step``.

A call is the recorder's when the nearest frame of the call's stack that is the recorder's
(``replay/``) or the program's (this file) is the recorder's: torch's own reads inside the user's
step (Adam's ``step.item()`` on the CPU) are the program's, the recorder's hooks inside it (the
gradient probe, the clip's wrapper) are the recorder's.

Both routes a step takes are covered: the writer thread (the route of a GPU step;
``REPLAY_STEP_LOG=off`` sends a CPU run there) and the shared step log, which only a step whose
tensors are all in host memory takes: there the record (batch, RNG states) is encoded on the
training thread with ``.numpy()`` of host tensors, which is not counted on that route.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import traceback

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import replay
from replay.store import open_recording

_READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__")
_REPLAY = os.path.dirname(replay.__file__) + os.sep


def _the_recorders(frame) -> bool:
    """Whether the nearest frame that is the recorder's or this program's is the recorder's."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_REPLAY):
            return True
        if name == __file__:
            return False
        frame = frame.f_back
    return False


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def clipped_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    optimizer.step()
    return loss


def batch_for(t):
    g = torch.Generator().manual_seed(t)
    return torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g)


class _Counter:
    """Wraps the reading methods of ``torch.Tensor``; counts calls on ``thread`` while ``on``."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.on = False
        self.exempt: tuple[str, ...] = ()  # reads not counted (the step log's, see above)
        self.calls: collections.Counter[str] = collections.Counter()
        self.where: list[str] = []
        self._saved: dict[str, object] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in _READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, original))
        original_sync = torch.cuda.synchronize

        def sync(*a, **k):
            self._count("torch.cuda.synchronize", None)
            return original_sync(*a, **k)

        monkeypatch.setattr(torch.cuda, "synchronize", sync)

    def _wrap(self, name, original):
        def wrapper(t, *a, **k):
            self._count(name, t)
            return original(t, *a, **k)

        return wrapper

    def _count(self, name, t) -> None:
        if not self.on or threading.current_thread() is not self.thread:
            return
        if name in self.exempt or not _the_recorders(sys._getframe(2)):
            return
        self.calls[name] += 1
        self.where.append(f"{name}:\n" + "".join(traceback.format_stack(limit=8)[:-1]))


@pytest.mark.parametrize("route", ["step log", "writer thread"])
def test_rec_step_reads_nothing_back_from_the_device_on_the_training_thread(
    tmp_path, monkeypatch, route
):
    if route == "writer thread":
        monkeypatch.setenv("REPLAY_STEP_LOG", "off")
    counter = _Counter(threading.current_thread())
    counter.install(monkeypatch)
    model, opt = build()
    path = tmp_path / "run.h5"
    losses = []
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=clipped_step,
        build_fn=build,
        snapshot_every=1000,  # (a snapshot of live state is encoded where it lives; item 3)
        fingerprint_every=5,
    ) as rec:
        for t in range(30):
            batch = batch_for(t)
            if route == "step log":  # the host batch and RNG states it encodes (see above)
                counter.exempt = ("numpy",)
            counter.on = t >= 3  # after warm-up
            try:
                losses.append(rec.step(batch))
            finally:
                counter.on = False
    assert not counter.calls, f"{dict(counter.calls)} read on the training thread:\n" + (
        "\n".join(counter.where[:3])
    )
    # and the file holds the right values, read from the host buffers
    with open_recording(path) as f:
        h = f.health()
        assert h["step"].tolist() == list(range(30))
        assert h["loss"].tolist() == [x.item() for x in losses]
        assert (h["loss_nonfinite"] == 0).all() and (h["grad_nonfinite"] == 0).all()
        assert (h["grad_norm"] > 0.1).all()  # measured before the clip to 0.1
        assert h["step"][h["param_nonfinite"] == 0].tolist() == [0, 5, 10, 15, 20, 25]
