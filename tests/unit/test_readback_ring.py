"""The host buffers health is copied into (``capture/readback.py``): a buffer whose ticket is
unread is never handed to the next copy, and values come back as launched."""

from __future__ import annotations

import math

import torch

from replay.capture.readback import Readback, value_now


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
