"""The host buffers health is copied into (``capture/readback.py``): a buffer whose ticket is
unread is never handed to the next copy, and values come back as launched."""

from __future__ import annotations

import math
import struct

import torch

from replay.capture.readback import Readback, value_now
from replay.capture.tensors import CopyStats
from replay.record.inflight import InFlight, PendingStep
from replay.record.writer_thread import StepJob


def test_an_unread_ticket_keeps_its_buffer_until_read() -> None:
    rb = Readback(size=4)
    a = rb.launch([torch.tensor(1.0), torch.tensor(2.0, dtype=torch.float64)])
    b = rb.launch([torch.tensor([3.0, 9.0]), torch.tensor(float("nan"))])  # a's buffer is busy
    assert b.ready() and b.values()[0] == 3.0 and math.isnan(b.values()[1])
    assert a.ready() and a.values() == [1.0, 2.0]  # not overwritten by b
    c = rb.launch([torch.tensor(5, dtype=torch.int64)])  # both read: a buffer is reused
    assert c.ready() and c.values() == [5.0]
    assert len(rb._rings[torch.device("cpu")]) == 2


def test_more_values_than_a_buffer_holds_take_several() -> None:
    rb = Readback(size=2)
    t = rb.launch([torch.tensor(float(i)) for i in range(5)])
    assert t.ready() and t.values() == [0.0, 1.0, 2.0, 3.0, 4.0]
    w = rb.launch_whole(torch.tensor([[1.0, 2.0], [3.0, float("inf")]]))
    w.wait()
    assert w.values() == [1.0, 2.0, 3.0, math.inf]


def test_a_device_value_is_never_read_at_once() -> None:
    assert value_now(torch.tensor(2.5)) == 2.5
    assert value_now(torch.empty((), device="meta")) is None  # no copy launched, no wait


def test_a_value_read_again_after_an_in_place_change_is_the_new_one() -> None:
    # value_now keeps the last tensor's value (a step asks for its gradient norm twice); an
    # in-place change bumps the tensor's version, so the kept value is not returned for it
    gn = torch.tensor(1.5, dtype=torch.float64)
    assert value_now(gn) == 1.5
    gn.mul_(2)
    assert value_now(gn) == 3.0
    gn.fill_(math.inf)
    assert value_now(gn) == math.inf
    assert value_now(torch.tensor(-1.0)) == -1.0 and value_now(gn) == math.inf


def test_a_loss_with_its_graph_an_empty_tensor_and_integers_come_back_as_floats() -> None:
    loss = (torch.tensor([2.0], requires_grad=True) * 1.5).sum()
    rb = Readback(size=4)
    t = rb.launch([loss, torch.empty(0), torch.tensor([7, 8]), torch.tensor(True)])
    assert t.ready()
    got = t.values()
    assert got[0] == 3.0 and math.isnan(got[1]) and got[2:] == [7.0, 1.0]
    slot = rb._rings[torch.device("cpu")][0]
    assert not slot.host.requires_grad and slot.host.grad_fn is None  # not joined to the graph
    assert value_now(loss) == 3.0 and loss.requires_grad  # read, the loss untouched


def test_a_host_steps_health_is_read_at_once_as_the_copy_would_give_it() -> None:
    """A step in host memory settles with no copy launched (``InFlight.launch`` reads each host
    tensor through ``value_now``, which has the loss and gradient norm already): each value is
    the float the readback's copy gives, bit for bit, for every dtype and shape it takes."""
    tensors = {
        "loss": (torch.tensor([2.0], requires_grad=True) * 1.1).sum(),
        "grad_norm": torch.tensor(0.1, dtype=torch.float64),
        "scale": torch.tensor(3.3, dtype=torch.bfloat16),
        "scale_after": torch.tensor([float("-inf"), 1.0], dtype=torch.float16),
        "lr": torch.tensor(2**53 + 1),
        "local_grad_norm": torch.empty(0),
    }
    want = Readback().launch(list(tensors.values()))
    assert want.ready()
    value_now(tensors["grad_norm"])  # (as the optimizer's hook and _looks_bad read them)
    value_now(tensors["loss"].detach())
    health = {"raised": 0.0, **tensors, "grad_absmax": None}
    p = PendingStep(0, CopyStats(), None, [], [], health, None, None)
    p.job = StepJob(0, None, None, [], [], health)
    inflight = InFlight()
    inflight.launch(p)
    (settled,) = inflight.ready()
    assert settled is p and inflight.readback._rings == {}  # nothing copied
    got = [p.health[k] for k in tensors]
    assert all(type(v) is float for v in got)
    assert [struct.pack("<d", v) for v in got] == [struct.pack("<d", v) for v in want.values()]
    assert p.value == p.health["loss"] and p.health["raised"] == 0.0


def test_the_last_two_values_read_are_kept_while_their_tensors_stay_unchanged() -> None:
    gn, loss = torch.tensor(1.5, dtype=torch.float64), torch.tensor(2.5)
    assert value_now(gn) == 1.5 and value_now(loss) == 2.5
    assert value_now(gn) == 1.5 and value_now(loss) == 2.5  # both kept
    loss.add_(1)
    assert value_now(gn) == 1.5 and value_now(loss) == 3.5
    assert value_now(torch.tensor(9.0)) == 9.0 and value_now(gn) == 1.5
