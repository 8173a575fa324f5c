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
