"""Batches by reference, the parts: the index tap keeps the loader's indices in the order its
batches come (an epoch left early included), the digest names a batch bit for bit, and a
record whose reference is malformed is refused like any other damage."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from replay.capture.loader import digest, draw, tap, untap
from replay.errors import RecordingError
from replay.store.validate import check_record


def _loader(**kw):
    data = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    return DataLoader(
        data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0), **kw
    )


@pytest.mark.parametrize("workers", [0, 2])  # with workers the sampler runs ahead (prefetch)
def test_the_tap_names_each_batch_even_after_an_epoch_left_early(workers):
    loader = _loader(num_workers=workers)
    t = tap(loader)
    seen = []
    for i, batch in enumerate(loader):
        seen.append((batch, t.take()))
        if i == 2:
            break  # the loop leaves the epoch early; the next one starts afresh
    for batch in loader:
        seen.append((batch, t.take()))
    assert len(seen) == 3 + 5
    for batch, idx in seen:
        ref = {"indices": np.asarray(idx), "batched": True}
        again = draw(loader.dataset, loader.collate_fn, ref)
        assert digest(again) == digest(batch)
        assert torch.equal(batch[1], torch.as_tensor(idx))
    untap(loader, t)
    assert type(loader.batch_sampler).__name__ == "BatchSampler"


def test_the_digest_tells_one_changed_bit():
    x = torch.zeros(3, 2)
    y = x.clone()
    y.view(torch.int32)[1, 1] ^= 1
    assert digest((x,)) != digest((y,)) and digest((x,)) == digest((x.clone(),))
    assert digest((x,)) != digest((x.double(),))  # the dtype is part of it


@pytest.mark.parametrize(
    "ref",
    [
        "abc",
        {"indices": np.zeros(3), "batched": True, "sha256": "0" * 64},  # floats
        {"indices": np.zeros((2, 2), np.int64), "batched": True, "sha256": "0" * 64},
        {"indices": np.zeros(3, np.int64), "batched": 1, "sha256": "0" * 64},
        {"indices": np.zeros(3, np.int64), "batched": True, "sha256": "short"},
    ],
)
def test_a_malformed_batch_ref_is_refused(ref):
    rec = {"step": 3, "rng": {}, "hparams": [], "modes": np.ones(2, bool), "batch_ref": ref}
    with pytest.raises(RecordingError, match="batch_ref"):
        check_record(rec, "steps", 3, "run.h5")


def test_a_loader_that_cannot_give_references_says_so_when_the_recorder_is_made():
    """Was: ``Recorder(loader=...)`` over an iterable-style dataset worked out why no index
    names a batch and kept the batches by value without a word."""
    from replay.errors import RecorderWarning
    from replay.record.batch_refs import BatchRefs

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(torch.arange(8.0).reshape(4, 2))

    with pytest.warns(RecorderWarning, match="by value, not by reference: its dataset is iterable"):
        refs = BatchRefs(DataLoader(Stream()))
    assert refs.tap is None and refs.reference(torch.zeros(1, 2)) is None
