"""A random generator given to ``objects=`` is kept in snapshots (capture/generators.py): its
state survives a round trip through the store's own tree encoding, for every kind a program
makes, and a generator restored from it draws what the original drew."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from replay.capture.objects import objects_from_build
from tests.unit.test_tree_roundtrip import roundtrip  # (what the writer writes, read back)

KINDS = {
    "torch": lambda: torch.Generator().manual_seed(7),
    "numpy_pcg64": lambda: np.random.default_rng(7),
    "numpy_mt19937": lambda: np.random.Generator(np.random.MT19937(7)),
    "numpy_philox": lambda: np.random.Generator(np.random.Philox(7)),
    "random_state": lambda: np.random.RandomState(7),
    "python": lambda: random.Random(7),
}


def _draw(g):
    if isinstance(g, torch.Generator):
        return torch.rand(5, generator=g).tolist()
    if isinstance(g, np.random.Generator):
        return [*g.random(3).tolist(), float(g.standard_normal())]
    if isinstance(g, np.random.RandomState):
        return [*g.rand(3).tolist(), float(g.randn())]
    return [g.random() for _ in range(3)] + [g.gauss(0, 1)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_generator_restored_from_its_snapshot_draws_what_it_drew(kind):
    gen = KINDS[kind]()
    _draw(gen)  # (a state past the seed, with a gauss in waiting where the kind keeps one)
    objs = objects_from_build({"model": torch.nn.Linear(1, 1), "gen": gen})
    assert "gen" in objs.extras
    kept = roundtrip(objs.extras["gen"].state_dict())
    want = _draw(gen)
    _draw(gen)
    objs.extras["gen"].load_state_dict(kept)
    assert _draw(gen) == want
