"""RNG capture is exact, including the cached gaussians (numpy's and python's), which change
without new draws, and the raw-memory shortcuts that skip re-reading unchanged states."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from replay.capture.rng import _PythonState, capture_rng, restore_rng, rng_to_tree


def _same_numpy(a, b):
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def test_numpy_state_follows_every_kind_of_use():
    np.random.seed(3)
    for use in (
        lambda: None,
        lambda: np.random.normal(),
        lambda: np.random.normal(),
        lambda: None,
        lambda: np.random.rand(3),
        lambda: np.random.seed(5),
        lambda: None,
    ):
        use()
        assert _same_numpy(capture_rng()[1], np.random.get_state())


def test_numpy_state_follows_a_swapped_global_bit_generator():
    """Was: the raw state's address was taken once, so after ``np.random.set_bit_generator``
    (the old generator still held, its memory unchanged) the old generator's state was
    recorded at every step after, and a replay drew other numbers."""
    old = np.random.get_bit_generator()
    try:
        np.random.seed(3)
        capture_rng()
        np.random.set_bit_generator(np.random.MT19937(5))
        assert _same_numpy(capture_rng()[1], np.random.get_state())
        np.random.rand(4)
        assert _same_numpy(capture_rng()[1], np.random.get_state())
    finally:
        np.random.set_bit_generator(old)
    assert _same_numpy(capture_rng()[1], np.random.get_state())


def test_cached_gaussian_consumed_without_new_draws_is_seen():
    """Legacy normal() draws two values and caches one: the second call changes has_gauss only."""
    np.random.seed(0)
    np.random.normal()  # generates a pair: has_gauss = 1
    first = capture_rng()[1]
    assert first[3] == 1
    np.random.normal()  # consumes the cache: keys unchanged, has_gauss = 0
    second = capture_rng()[1]
    assert second[3] == 0 and _same_numpy(second, np.random.get_state())


def test_restore_reproduces_every_generator():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    np.random.normal()
    tree = rng_to_tree(capture_rng())
    want = (random.random(), np.random.normal(), np.random.rand(), torch.rand(3))
    restore_rng(tree)
    got = (random.random(), np.random.normal(), np.random.rand(), torch.rand(3))
    assert want[:3] == got[:3] and torch.equal(want[3], got[3])


def test_python_state_follows_every_kind_of_use():
    random.seed(3)
    for use in (
        lambda: None,
        lambda: random.random(),
        lambda: None,
        lambda: random.gauss(0, 1),  # draws a pair, caches one in gauss_next
        lambda: random.gauss(0, 1),  # returns the cached value: MT words unchanged
        lambda: [random.getrandbits(32) for _ in range(624)],  # a full MT twist: index unchanged
        lambda: random.seed(5),
        lambda: random.setstate(random.getstate()),
        lambda: None,
    ):
        use()
        assert capture_rng()[0] == random.getstate()


def test_python_state_uses_the_raw_shortcut_on_cpython():
    """The layout check passes on this interpreter, so the shortcut is on; an instance whose
    layout does not match (a pure-python Random) falls back to getstate()."""
    assert _PythonState()._addr is not None

    class Shadow:
        gauss_next = None

        def getstate(self):
            return (3, tuple(range(625)), None)

    fallback = _PythonState(Shadow())
    assert fallback._addr is None and fallback() == (3, tuple(range(625)), None)


def test_a_global_generator_numpy_cannot_keep_is_named_not_unpacked():
    """Was: ``ValueError: too many values to unpack (expected 5)`` as the reason recording
    stopped, for a program that set numpy's global bit generator to PCG64."""
    old = np.random.get_bit_generator()
    try:
        np.random.set_bit_generator(np.random.PCG64(3))
        with pytest.raises(ValueError, match="runs on PCG64"):
            rng_to_tree(capture_rng())
    finally:
        np.random.set_bit_generator(old)
