"""The engine's in-memory checkpoints: reusing an evicted one's buffers must copy, never alias."""

import torch

from replay.capture.objects import objects_from_build
from replay.engine.state import capture_state, restore_state


def _objs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return objects_from_build((model, opt))


def _train(objs, n=2):
    for _ in range(n):
        objs.optimizer.zero_grad()
        objs.model(torch.randn(5, 4)).square().mean().backward()
        objs.optimizer.step()


def _flat(objs):
    sd = objs.model.state_dict()
    st = objs.optimizer.state_dict()["state"]
    return [t.clone() for t in sd.values()] + [
        v.clone() for s in st.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]


def test_a_reused_checkpoint_holds_the_new_state_and_restores_it_bitwise():
    objs = _objs()
    _train(objs)
    old = capture_state(objs)
    old_buffers = [t.data_ptr() for t in old["model"].values()]
    _train(objs)
    want = _flat(objs)
    new = capture_state(objs, reuse=old)
    assert [t.data_ptr() for t in new["model"].values()] == old_buffers  # no new allocation
    _train(objs, 3)  # the live state moves on; the checkpoint must not move with it
    restore_state(objs, new)
    assert all(torch.equal(a, b) for a, b in zip(_flat(objs), want))
    _train(objs)  # training after a restore must not write into the checkpoint either
    restore_state(objs, new)
    assert all(torch.equal(a, b) for a, b in zip(_flat(objs), want))
