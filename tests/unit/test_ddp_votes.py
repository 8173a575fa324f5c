"""The bookkeeping of the DDP stop's votes (replay/ranks/votes.py), without ranks.

The votes ride DDP's last gradient all-reduce; here a fake probe hands over what that
all-reduce summed. Slots ``[0, W)``: a rank's own gradients went non-finite at this step (NaN);
``[W, 2W)``: a rank's loss went non-finite that many steps ago.
"""

from __future__ import annotations

from typing import Any

import torch

from replay.ranks.votes import BucketVotes, Verdict

W = 2
NAN = float("nan")


class FakeProbe:
    def __init__(self) -> None:
        self.late_loss: Any = 0.0
        self.reduced: torch.Tensor | None = None

    def take_votes(self) -> torch.Tensor | None:
        v, self.reduced = self.reduced, None
        return v


def _votes(grads: dict[int, float] | None = None, late: dict[int, float] | None = None) -> Any:
    v = torch.zeros(2 * W)
    for r, x in (grads or {}).items():
        v[r] = x
    for r, k in (late or {}).items():
        v[W + r] = k
    return v


def _stop() -> tuple[FakeProbe, BucketVotes]:
    probe = FakeProbe()
    return probe, BucketVotes(probe, W, torch.device("cpu"))  # type: ignore[arg-type]


def test_healthy_steps_give_no_verdict() -> None:
    probe, stop = _stop()
    for t in range(3):
        probe.reduced = _votes()
        stop.post(t, 0.5, None)
        assert stop.result() is None
    assert probe.late_loss == 0.0


def test_bad_gradients_stop_at_their_own_step_naming_every_bad_rank() -> None:
    probe, stop = _stop()
    probe.reduced = _votes(grads={0: NAN, 1: NAN})
    stop.post(7, 0.5, None)
    assert stop.result() == Verdict(7, (0, 1), 7)


def test_a_bad_loss_votes_at_the_next_reduction_naming_its_step() -> None:
    probe, stop = _stop()
    probe.reduced = _votes()
    stop.post(4, float("nan"), None)  # finite gradients: nothing to stop on yet
    assert stop.result() is None
    assert probe.late_loss == 1.0  # what this rank's hook writes at step 5
    probe.reduced = _votes(late={0: 1.0})
    stop.post(5, 0.5, None)
    assert stop.result() == Verdict(4, (0,), 5)


def test_a_pending_loss_vote_ages_across_steps_that_do_not_reduce() -> None:
    probe, stop = _stop()
    stop.post(1, float("inf"), None)  # no_sync(): DDP did not reduce
    stop.post(2, 0.5, None)
    assert stop.result() is None and probe.late_loss == 2.0
    stop.post(3, float("nan"), None)  # the older vote stands
    assert probe.late_loss == 3.0
    # At step 4 rank 0 votes 3 (its loss went bad at step 1), rank 1 votes 1 (step 3):
    probe.reduced = _votes(late={0: 3.0, 1: 1.0})
    stop.post(4, 0.5, None)
    assert stop.result() == Verdict(1, (0,), 4)  # the first bad step, and who went bad there


def test_a_late_loss_vote_names_its_earlier_step_before_bad_gradients() -> None:
    probe, stop = _stop()
    probe.reduced = _votes(grads={1: NAN}, late={0: 1.0})
    stop.post(9, 0.5, None)
    assert stop.result() == Verdict(8, (0,), 9)  # rank 0's loss went bad first


def test_a_loss_on_the_gpu_is_kept_as_a_tensor_without_a_host_sync() -> None:
    probe, stop = _stop()
    stop.post(0, torch.tensor(float("nan")), None)  # (a CPU tensor stands in for the device)
    assert isinstance(probe.late_loss, torch.Tensor) and float(probe.late_loss) == 1.0
    stop.post(1, torch.tensor(0.5), None)
    assert float(probe.late_loss) == 2.0


def test_two_reductions_in_one_step_merge_their_votes() -> None:
    from replay.ranks.ddp_hook import LocalGradProbe

    probe = LocalGradProbe(None, [], rank=0, world_size=W, votes=True)
    probe._reduced = [_votes(grads={1: NAN}, late={0: 2.0}), _votes(late={0: 2.0, 1: 1.0})]
    merged = probe.take_votes()
    assert merged is not None
    assert merged[1].isnan() and merged[0] == 0
    assert merged[W:].tolist() == [2.0, 1.0]
    assert probe.take_votes() is None
