"""Culprit samples by delta debugging, with a real replay callback; batch slicing."""

from __future__ import annotations

import copy
from collections import namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from replay.trace import trace_step
from replay.trace.samples import (
    batch_size_of,
    find_culprit_samples,
    has_batch_coupling,
    slice_batch,
)


def step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def test_poisoned_sample_is_named_by_the_batch_and_found_by_replay():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    x[5, 3] = float("nan")
    state = copy.deepcopy((model.state_dict(), opt.state_dict()))

    r = trace_step(model, opt, step, (x, y))
    v = r.verdict
    assert v["kind"] == "nonfinite"
    assert v["batch_nonfinite"] == {"leaves": {"[0]": [5]}}
    assert v["op"] == "aten::addmm" and v["module"] == "0"  # first op that consumed it
    assert v["cause"] == "data"
    (bad,) = v["data"]["tensors"]
    assert (bad["name"], bad["nan"], bad["positions"]) == ("batch[0]", 1, [[5, 3]])
    assert r.batch["leaves"][0]["per_sample"]["nonfinite"][5] == 1

    calls = []

    def fails(indices):  # the replay engine's job: restore, replay on these samples only
        calls.append(list(indices))
        model.load_state_dict(state[0])
        opt.load_state_dict(state[1])
        loss = step(model, opt, slice_batch((x, y), indices))
        return not torch.isfinite(loss)

    samples, exact = find_culprit_samples(
        fails, batch_size_of((x, y)), coupled=has_batch_coupling(model)
    )
    assert (samples, exact) == ([5], True)
    assert len(calls) < 16  # better than one replay per sample
    r.set_samples(samples, exact)
    assert r.verdict["samples"] == [5] and r.batch["culprits"] == [5]


def test_ddmin_finds_a_pair_that_must_appear_together():
    def fails(ix):
        return 3 in ix and 11 in ix

    assert find_culprit_samples(fails, 16, coupled=True) == ([3, 11], False)
    assert find_culprit_samples(lambda ix: False, 4, coupled=False) == ([0, 1, 2, 3], False)


def test_slice_batch_nested_structures():
    Pair = namedtuple("Pair", "a b")
    batch = {
        "x": torch.arange(8).view(4, 2),
        "meta": [Pair(torch.arange(4), torch.zeros(3))],
        "scale": torch.ones(1),
        "name": "b0",
    }
    assert batch_size_of(batch) == 4
    s = slice_batch(batch, [1, 3])
    assert s["x"].tolist() == [[2, 3], [6, 7]]
    assert isinstance(s["meta"][0], Pair) and s["meta"][0].a.tolist() == [1, 3]
    assert s["meta"][0].b.shape == (3,) and s["scale"].shape == (1,) and s["name"] == "b0"


def test_batch_coupling():
    assert has_batch_coupling(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    assert not has_batch_coupling(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)))
    assert not has_batch_coupling(nn.Sequential(nn.BatchNorm1d(2)).eval())


# ---------------------------------------------------------------- the sample axis
def test_candidate_axes_for_common_layouts():
    from replay.trace.samples import candidate_axes

    assert candidate_axes((torch.zeros(8, 5), torch.zeros(8))) == [(0, 8)]
    assert candidate_axes((torch.zeros(6, 10), torch.zeros(6, 10))) == [(0, 6), (1, 10)]
    micro = (torch.zeros(4, 8, 3), torch.zeros(4, 8))
    assert candidate_axes(micro) == [(0, 4), (1, 8)]
    assert candidate_axes({"x": torch.zeros(4, 1, 3), "y": torch.zeros(4, 1)}) == [(0, 4)]
    assert candidate_axes(("text", 3)) == []


def test_slice_batch_along_another_axis_keeps_other_leaves():
    x = torch.arange(12).view(3, 4)  # time-major [T, B]
    s = slice_batch((x, x * 10, torch.ones(2)), [3, 1], axis=1)
    assert s[0].tolist() == [[3, 1], [7, 5], [11, 9]] and s[1].tolist() == [
        [30, 10],
        [70, 50],
        [110, 90],
    ]
    assert s[2].shape == (2,)


def causal_loss(batch, time_axis: int):
    """A real reduction: each sample's loss depends on the order of its time steps (a running
    sum), and the loss is the mean over samples."""
    (x,) = batch
    x = x.movedim(time_axis, 0)  # [T, B]
    running = torch.cumsum(x, 0) * torch.arange(1, x.shape[0] + 1)[:, None]
    return running.pow(2).mean().item()


def test_choose_sample_axes_tells_time_from_samples_by_reversing_them():
    from replay.trace.samples import choose_sample_axes

    torch.manual_seed(0)
    x = torch.randn(6, 10, dtype=torch.float64)  # time-major [T, B]
    calls = []

    def probe(b):
        calls.append(b)
        return causal_loss(b, time_axis=0), 1

    axes, notes = choose_sample_axes((x,), probe)
    assert axes == [1] and "dim 1" in notes[0]
    assert len(calls) == 3  # the reference, dim 0 reversed (changed), dim 1 reversed (same)
    # batch-first: dim 0 reversed leaves the loss the same; no note needed
    axes, notes = choose_sample_axes((x.T.contiguous(),), lambda b: (causal_loss(b, 1), 1))
    assert axes == [0] and notes == []


def test_time_major_sentences_of_their_own_lengths_are_cut_along_the_dim_they_share():
    """language_translation's batches: ``src[Ts, B]``, ``tgt[Tt, B]``, padded to their own
    lengths. Was: with a step that raises (a token out of the vocabulary) no probe could tell
    time from samples; dim 0 was assumed, and bisect said "no sample is to blame" (or named
    time positions). The lengths tell: time is the axis that differs."""
    from replay.trace.samples import choose_sample_axes

    def probe(b):
        raise AssertionError("no probe needed")

    batch = (torch.zeros(9, 8, dtype=torch.long), torch.zeros(12, 8, dtype=torch.long))
    axes, notes = choose_sample_axes(batch, probe)
    assert axes == [1] and "lengths of their own along dim 0" in notes[0]
    assert [t.shape for t in slice_batch(batch, [5], axis=1)] == [(9, 1), (12, 1)]
    # equal lengths, or other dims that differ too: the probes decide, as before
    same = (torch.randn(6, 10), torch.randn(6, 10))
    assert choose_sample_axes(same, lambda b: (float("nan"), 1))[0] == [0]
    images = (torch.randn(8, 3, 4, 4), torch.randn(8, 5))
    assert choose_sample_axes(images, probe)[0] == [0]


def test_choose_sample_axes_finds_micro_batches_by_counting_forward_calls():
    from replay.trace.samples import choose_sample_axes

    x = torch.randn(4, 8, 3)
    axes, notes = choose_sample_axes((x, torch.zeros(4, 8)), lambda b: (float(b[0].sum()), 4))
    assert axes == [0, 1] and "micro-batches" in notes[0]


def test_choose_sample_axes_says_when_it_cannot_tell():
    from replay.trace.samples import choose_sample_axes

    x = torch.randn(6, 10)
    axes, notes = choose_sample_axes((x,), lambda b: (float("nan"), 1))
    assert axes == [0] and "could not be told apart" in notes[0]
    assert choose_sample_axes(("no tensors",), lambda b: (0.0, 1))[0] == []


def test_no_dropout_makes_dropout_the_identity():
    from replay.trace.samples import no_dropout

    x = torch.ones(100)
    with no_dropout():
        assert torch.equal(nn.Dropout(0.5).train()(x), x)
        assert torch.equal(F.dropout(x, 0.9, training=True), x)
    assert not torch.equal(F.dropout(x, 0.5, training=True), x)


def test_a_batch_axis_hint_wins_when_it_fits_the_batch():
    from replay.trace.samples import choose_sample_axes

    x = torch.randn(6, 10, dtype=torch.float64)

    def probe(b):  # a real loss in which dim 0 is the sample axis
        return causal_loss(b, time_axis=1), 1

    assert choose_sample_axes((x,), probe)[0] == [0]
    axes, notes = choose_sample_axes((x,), probe, hint=1)
    assert axes == [1] and "batch_axis" in notes[0]
    assert choose_sample_axes((torch.randn(4, 8, 3), torch.zeros(4, 8)), probe, (0, 1))[0] == [0, 1]
    axes, notes = choose_sample_axes((x,), probe, hint=2)  # no such shared dim: ignored
    assert axes == [0] and "does not fit" in notes[0]


def test_a_list_of_samples_is_cut_by_its_items():
    """A DQN minibatch is a list of transitions (namedtuples of ``[1, 4]`` states, actions,
    rewards), collated inside the step. Was: its samples were looked for along dim 0 of each
    tensor, of size 1, and bisect named sample 0 for the NaN transition at index 5."""
    from replay.trace.samples import candidate_axes, sample_list

    T = namedtuple("T", "state action reward")
    batch = [T(torch.randn(1, 4), torch.tensor([[i % 2]]), torch.tensor([1.0])) for i in range(6)]
    assert sample_list(batch) and batch_size_of(batch) == 6 and candidate_axes(batch) == [(0, 6)]
    sub = slice_batch(batch, [5, 1])
    assert type(sub) is list and sub[0] is batch[5] and sub[1] is batch[1]
    dicts = [{"image": torch.randn(3, 4, 4), "label": torch.tensor(i)} for i in range(3)]
    assert sample_list(dicts) and batch_size_of(dicts) == 3
    # not samples: [x, y], a pair of micro-batches (their rows are the samples), one sample
    x, y = torch.randn(8, 3), torch.randn(8)
    assert not sample_list([x, y]) and batch_size_of([x, y]) == 8
    assert not sample_list([(x, y), (x, y)]) and batch_size_of([(x, y), (x, y)], 1) == 8
    assert not sample_list(batch[:1])


def test_a_list_of_micro_batches_is_cut_by_micro_batch_then_row():
    """open_clip's --accum-freq batches handed over as one step: a list of (images, texts)
    micro-batches. Was: cut along dim 0 of every tensor, row 5 of every micro-batch at once, and
    bisect named "sample 5" without saying of which micro-batch."""
    from replay.trace.samples import candidate_axes, choose_sample_axes, micro_list

    batch = [(torch.randn(4, 3), torch.arange(4 * 6).reshape(4, 6) + 10 * m) for m in range(3)]
    assert micro_list(batch) and not micro_list(batch[:1]) and micro_list(batch[:1], least=1)
    assert candidate_axes(batch) == [(0, 3), (1, 4)]
    assert batch_size_of(batch) == 3 and batch_size_of(batch, 1) == 4
    picked = slice_batch(batch, [2, 0])
    assert type(picked) is list and picked[0] is batch[2] and picked[1] is batch[0]
    rows = slice_batch(picked[:1], [3, 1], 1)
    assert torch.equal(rows[0][1], batch[2][1][[3, 1]]) and torch.equal(
        rows[0][0], batch[2][0][[3, 1]]
    )

    def never(_):
        raise AssertionError("a list of micro-batches needs no probe")

    axes, notes = choose_sample_axes(batch, never)
    assert axes == [0, 1] and "list of 3 micro-batches" in notes[0]
    # not micro-batches: one row each (a list of samples), or rows of different counts inside one
    assert not micro_list([(torch.randn(1, 3), torch.randn(1)) for _ in range(3)])
    assert not micro_list([(torch.randn(4, 3), torch.randn(5)) for _ in range(3)])


def test_non_finite_data_in_a_list_of_micro_batches_is_named_by_micro_batch_and_row():
    from replay.workflows.culprit import _data_samples

    batch = [(torch.zeros(4, 3), torch.zeros(4)) for _ in range(2)]
    batch[1][0][2, 1] = float("nan")
    assert _data_samples(batch, [0, 1]) == [[1, 2]]


def test_a_tuple_of_per_sample_lists_is_cut_by_position_not_by_channel():
    """torchvision detection's collate_fn: a tuple of images of their own sizes and a tuple of
    target dicts. Was: cut along dim 0 of every tensor, an image's channels (3, the commonest
    leading size), and bisect named "sample 2" where the degenerate box was sample 3's."""
    from replay.trace.samples import candidate_axes, micro_list, zipped
    from replay.workflows.culprit import _data_samples

    images = [torch.rand(3, 20 + i, 24) for i in range(4)]
    targets = [
        {"boxes": torch.rand(3, 4), "labels": torch.ones(3), "image_id": i} for i in range(4)
    ]
    batch = (tuple(images), tuple(targets))
    assert zipped(batch) and not micro_list(batch)
    assert batch_size_of(batch) == 4 and candidate_axes(batch) == [(0, 4)]
    cut = slice_batch(batch, [3, 1])
    assert type(cut) is tuple and cut[0][0] is images[3] and cut[1][1] is targets[1]
    # lists beside a tensor of as many rows are zipped too; lengths that differ are not
    labelled = ([torch.rand(3, 5, 5)] * 4, torch.arange(4))
    assert zipped(labelled) and torch.equal(slice_batch(labelled, [2])[1], torch.tensor([2]))
    assert not zipped(([torch.rand(3)] * 4, [torch.rand(3)] * 3))
    targets[3]["boxes"][0, 2] = float("-inf")
    assert _data_samples(batch, [0]) == [3]


def test_a_nan_in_a_complex_batch_is_named_by_its_sample():
    """MRI reconstruction's k-space, an STFT handed over as the batch: complex tensors. Was:
    looked at only when floating point, so a NaN in one was named by no sample."""
    from replay.workflows.culprit import _data_samples

    kspace = torch.randn(5, 8, dtype=torch.cfloat)
    kspace[2, 3] = complex(float("nan"), 0.0)
    assert _data_samples((kspace, torch.zeros(5)), [0]) == [2]


def test_two_complex_states_differ_by_their_imaginary_parts_too():
    """Was: compared through .double(), which dropped the imaginary parts (and warned)."""
    from replay.workflows.why import _max_diff

    a = torch.randn(4, 3, dtype=torch.cfloat)
    b = a.clone()
    b[1, 2] += 0.5j
    assert _max_diff(a, b) == 0.5
