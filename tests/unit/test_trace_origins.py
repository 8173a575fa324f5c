"""Origins are kept by storage address, and an address outlives its storage: a tensor made at
the address of a freed one is neither the state present before the step nor heir to the freed
one's origins. Before, ``zero_grad()`` freeing the gradients present before the step and the
allocator handing their addresses to the step's new NaN gradients made some replays of the same
recording say "state: parameters or optimizer state were non-finite before this step" and
others name the op (issue 44). ``torch.frombuffer`` makes the reuse certain: two storages, one
after the other, over the same memory."""

from __future__ import annotations

import math

import torch

from replay.trace.origins import PRESENT, UNKNOWN, Origins, storage_key, storages


def _at(buf: bytearray, value: float) -> torch.Tensor:
    t = torch.frombuffer(buf, dtype=torch.float32)
    t.fill_(value)
    return t


def test_a_new_tensor_at_a_freed_gradients_address_is_not_present_state():
    buf = bytearray(64)
    o = Origins()
    old_grad = _at(buf, 1.0)
    o.present_keys = storages([old_grad])
    old_grad.fill_(math.nan)
    assert o.of(old_grad) == {PRESENT}
    del old_grad  # zero_grad(set_to_none=True)
    new_grad = _at(buf, math.nan)  # the backward's gradient, at the same address
    assert o.of(new_grad) == {UNKNOWN}


def test_a_new_tensor_at_a_freed_nan_tensors_address_does_not_inherit_its_origins():
    buf = bytearray(64)
    o = Origins()
    made = _at(buf, math.nan)
    o.set_output(made, frozenset({7}))
    key = storage_key(made)
    assert o.known_bad(made) and o.of(made) == {7}
    del made
    reused = _at(buf, 0.0)
    assert storage_key(reused) == key
    assert not o.known_bad(reused)  # an in-place op on it reads "finite before", not NaN
    reused.fill_(math.nan)
    assert o.of(reused) == {UNKNOWN} and not o.by_storage
