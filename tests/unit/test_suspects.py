"""Naming the state a step changes that no snapshot holds (replay/capture/suspects.py): the step
function's code read for what it reaches, one step run to see what it changes."""

from __future__ import annotations

import copy

import torch

from replay.capture.objects import RunObjects
from replay.capture.suspects import buffers, candidates, changed_by

model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


class Ema:
    def __init__(self, m: torch.nn.Module) -> None:
        self.module = copy.deepcopy(m)

    @torch.no_grad()
    def update(self, m: torch.nn.Module) -> None:
        for e, p in zip(self.module.parameters(), m.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)


ema = Ema(model)
running = torch.zeros(2)  # a global statistic the step keeps
dataset = torch.randn(8, 3)  # read, never written
wrapped = torch.nn.Sequential(model)  # a wrapper sharing the recorded model's state


def _helper(x: torch.Tensor) -> torch.Tensor:
    running.mul_(0.5).add_(x.mean(0).detach()[:2])
    return x


def step(batch: torch.Tensor) -> torch.Tensor:
    out = wrapped(_helper(batch + dataset[0]))
    loss = out.pow(2).mean() + ema.module(batch).mean().detach()
    opt.zero_grad()
    loss.backward()
    opt.step()
    ema.update(model)
    return loss


def _objects() -> RunObjects:
    return RunObjects({"model": model, "optimizer": opt})


def _reached(found: list) -> list[str]:
    """The candidates the step's code reaches (not the recorded modules' own attributes:
    ``model.in_features``)."""
    return [s.name for s, _ in found if not s.unsaved]


def test_the_state_a_step_changes_outside_the_recorded_objects_is_named():
    found = candidates(step, _objects())
    names = {s.name for s, _ in found}
    # reached: through globals, an attribute down, and the user's helper it calls
    assert {"ema.module", "running", "dataset"} <= names, names
    # never the recorded objects, nor a wrapper that shares their state
    assert not names & {"model", "opt", "wrapped"}, names
    changed = changed_by(lambda: step(torch.randn(4, 3)), found)
    assert sorted(s.name for s in changed) == ["ema.module", "running"]
    by = {s.name: s for s in changed}
    assert by["ema.module"].kind == "Linear" and by["ema.module"].where == "step"
    assert by["running"].kind == "tensor float32[2]" and by["running"].where == "_helper"


def test_a_write_to_state_already_nan_is_still_seen():
    """Was: the EMA of weights that had turned NaN (a bisect replays the failing step before it
    explains) kept the same values, so the step seemed to change nothing; a write shows in the
    tensor's version counter."""
    with torch.no_grad():
        for e in ema.module.parameters():
            e.fill_(float("nan"))
    found = [(s, at) for s, at in candidates(step, _objects()) if s.name == "ema.module"]
    assert [s.name for s in changed_by(lambda: ema.update(model), found)] == ["ema.module"]


class Trainer:
    def __init__(self) -> None:
        self.model = model
        self.opt = opt
        self.teacher = copy.deepcopy(model)

    def training_step(self, batch: torch.Tensor) -> torch.Tensor:
        loss = (self.model(batch) - self.teacher(batch).detach()).pow(2).mean()
        with torch.no_grad():
            for t, p in zip(self.teacher.parameters(), self.model.parameters()):
                t.copy_(p)
        return loss


def test_a_bound_methods_own_attributes_are_reached():
    tr = Trainer()
    found = candidates(tr.training_step, _objects())
    assert _reached(found) == ["self.teacher"]
    changed = changed_by(lambda: tr.training_step(torch.randn(2, 3)), found)
    assert [s.name for s in changed] == ["self.teacher"]


NEXT = (torch.randn(2, 3), torch.zeros(2))  # the batch the previous step prefetched


def prefetching_step(batch: object) -> torch.Tensor:
    """nanoGPT's loop: train on the batch fetched last time, fetch the next into the global."""
    global NEXT
    x, _ = NEXT
    NEXT = (torch.randn(2, 3), torch.zeros(2))
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss


def test_a_global_the_step_rebinds_is_named():
    """Was: a global batch the step replaces each step seemed unchanged (its old tensors were
    never written): what is at the name now is compared too."""
    found = candidates(prefetching_step, _objects())
    assert _reached(found) == ["NEXT[0]", "NEXT[1]"]
    changed = changed_by(lambda: prefetching_step(None), found)
    assert [s.name for s in changed] == ["NEXT[0]", "NEXT[1]"]


EPS = 1e-8  # read, never changed
calls = 0  # a counter the step keeps in a global


def counting_step(batch: torch.Tensor) -> torch.Tensor:
    global calls
    calls += 1
    return model(batch).pow(2).mean() * (1 + EPS) / calls


def test_a_number_the_step_keeps_in_a_global_is_named_and_a_constant_is_not():
    found = candidates(counting_step, _objects())
    assert sorted(_reached(found)) == ["EPS", "calls"]
    changed = changed_by(lambda: counting_step(torch.randn(2, 3)), found)
    assert [(s.name, s.kind) for s in changed] == [("calls", "number int")]


class CartPole:
    """An RL environment: its own numpy generator, seeded once, and a state array."""

    def __init__(self) -> None:
        import numpy as np

        self.np_random = np.random.default_rng(0)
        self.state = np.zeros(4)
        self.spec = {"max_steps": 200}  # read, never written


env = CartPole()


def episode(seed: int) -> torch.Tensor:
    env.state = env.np_random.uniform(-0.05, 0.05, size=4)
    x = torch.from_numpy(env.state).float()
    loss = model(x[:3]).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def test_an_environments_own_generator_and_state_are_named():
    found = candidates(episode, _objects())
    names = {s.name: s.kind for s, _ in found}
    assert names["env.np_random"] == "random generator numpy Generator"
    assert names["env.state"] == "array float64[4]"
    changed = {s.name for s in changed_by(lambda: episode(0), found)}
    assert changed == {"env.np_random", "env.state"}


class Wrapper:
    """gymnasium's wrappers: each holds the next as ``env``; the generator is at the bottom."""

    def __init__(self, env: object) -> None:
        self.env = env
        self.steps = 0


class Bottom:
    def __init__(self) -> None:
        import numpy as np

        self._np_random = np.random.default_rng(1)
        self.state = np.zeros(4)


wrapped_env = Wrapper(Wrapper(Wrapper(Bottom())))


def wrapped_episode(seed: int) -> torch.Tensor:
    bottom = wrapped_env.env.env.env
    bottom.state = bottom._np_random.uniform(-0.05, 0.05, size=4)
    loss = model(torch.from_numpy(bottom.state).float()[:3]).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def test_a_generator_inside_wrapped_environments_is_named():
    found = candidates(wrapped_episode, _objects())
    names = {s.name for s, _ in found}
    assert "wrapped_env.env.env.env._np_random" in names
    assert "wrapped_env.env.env.env.state" not in names  # deep down: generators only
    changed = {s.name for s in changed_by(lambda: wrapped_episode(0), found)}
    assert changed == {"wrapped_env.env.env.env._np_random"}


class _Memory:
    def __init__(self) -> None:
        import collections

        self.memory: collections.deque[tuple[torch.Tensor, ...]] = collections.deque(maxlen=100)
        self.seen: list[int] = [1]  # not empty: not a buffer the loop has yet to fill

    def sample(self, n: int) -> list[tuple[torch.Tensor, ...]]:
        import random

        return random.sample(list(self.memory), n)


replay_memory = _Memory()
episodes: list[torch.Tensor] = []  # an empty list the loop fills


def dqn_step(batch: int) -> torch.Tensor:
    transitions = replay_memory.sample(4)
    x = torch.cat([t[0] for t in transitions]) + len(episodes)
    return model(x).sum()


def test_the_collections_a_step_samples_from_that_the_loop_fills_are_named():
    """A DQN step sampling its replay memory (a deque) is named with the deque, here empty, as
    a replay from a snapshot would find it; an empty global list too; not the collections of
    the recorded model and optimizer (their hooks' dicts), nor a list that holds values."""
    objects = RunObjects({"model": model, "optimizer": opt})
    named = [s.describe() for s in buffers(dqn_step, objects)]
    assert named == [
        "episodes (list, empty here, read by dqn_step)",
        "replay_memory.memory (deque, empty here, read by dqn_step)",
    ]
    replay_memory.memory.append((torch.randn(1, 3),))
    try:
        assert "replay_memory.memory (deque of 1 item, read by dqn_step)" in [
            s.describe() for s in buffers(dqn_step, objects)
        ]
    finally:
        replay_memory.memory.clear()


class Queued(torch.nn.Module):
    """A MoCo-style encoder: a queue of past keys and its pointer kept as plain attributes (as
    many re-implementations keep them), a count in a non-persistent buffer, and state that does
    belong in the snapshots or never changes."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.queue = torch.zeros(2, 8)  # plain attribute: in no state_dict
        self.ptr = 0
        self.width = 8  # a constant: never changed
        self.register_buffer("seen", torch.zeros(()), persistent=False)
        self.register_buffer("mean", torch.zeros(2))  # persistent: the snapshots hold it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.lin(x)
        with torch.no_grad():
            self.queue[:, self.ptr] = k[0]
            self.ptr = (self.ptr + 1) % self.width
            self.seen += 1
            self.mean.mul_(0.9).add_(k.mean(0), alpha=0.1)
        return k @ self.queue


def test_state_a_recorded_module_keeps_outside_its_state_dict_is_named():
    """Was: a queue a module keeps as a plain tensor attribute (MoCo) is in no snapshot, so a
    replay from one differs, and nothing was named: the recorded model counted as held whole.
    Plain tensor and number attributes, and non-persistent buffers, the step changes are
    named, with their module; parameters, persistent buffers and constants are not."""
    torch.manual_seed(0)
    enc = Queued()
    sgd = torch.optim.SGD(enc.parameters(), lr=0.1)

    def train(batch: torch.Tensor) -> torch.Tensor:
        loss = enc(batch).pow(2).mean()
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        return loss

    found = candidates(train, RunObjects({"model": enc, "optimizer": sgd}))
    names = {s.name for s, _ in found}
    assert {"model.queue", "model.ptr", "model.width", "model.seen"} <= names, names
    assert not names & {"model.mean", "model.lin.weight", "model.training"}, names
    changed = changed_by(lambda: train(torch.randn(4, 3)), found)
    assert sorted(s.describe() for s in changed) == [
        "model.ptr (number int, kept by Queued outside its state_dict)",
        "model.queue (tensor float32[2, 8], kept by Queued outside its state_dict)",
        "model.seen (non-persistent buffer tensor float32[], kept by Queued outside its "
        "state_dict)",
    ]
