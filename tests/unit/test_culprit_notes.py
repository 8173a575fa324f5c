"""The note bisect leaves when no sample of a failing batch is to blame."""

from __future__ import annotations

from replay.workflows.culprit import no_culprit_note


def test_one_sample_that_fails_alone_is_worded_in_the_singular():
    # Regression: the demo printed "samples 0 fail alone".
    note = no_culprit_note("sample", [0], 8, 0)
    assert note == (
        "no sample is to blame: sample 0 fails alone, and so does the rest of the batch without them"
    )


def test_several_samples_and_micro_batches_are_plural():
    assert "samples 2, 5 fail alone" in no_culprit_note("sample", [2, 5], 8, 0)
    assert "micro-batches 1, 3 fail alone" in no_culprit_note("micro-batch", [1, 3], 4, 0)


def test_a_failure_only_the_whole_batch_makes_is_not_said_to_fail_in_every_part():
    # Regression: the search returns the whole batch when no part of it fails alone (a DDPM
    # step whose NaN comes from the timesteps it draws, which change with the batch's size),
    # and the note said "every part of the batch along dim 0 fails on its own".
    note = no_culprit_note("sample", [0, 1, 2, 3], 4, 1)
    assert note.startswith(
        "no sample is to blame: no part of the batch along dim 1 fails on its own, only the whole"
    )
