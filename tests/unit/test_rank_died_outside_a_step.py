"""A rank whose program died outside any step (its ``/ended``) against what its peers' files
show: the first (step, rank) of a rank set, from each rank's evidence (no files, no torch).

Was: a rank that died in its data loader was no failure at all, so the first bad (step, rank)
was its peer's next step, which raised only because its collective never got the dead rank."""

from __future__ import annotations

from replay.ranks.first_bad import RankEvidence, describe_failure, first_bad_rank
from replay.reports.ranks import RankFailure
from replay.reports.verdict import Ended

LOADER = Ended("exception", "OSError", "image file is truncated", "train.py:40 in main", "tb", 3)
CLEAN = RankEvidence(None, (), None, ())
PEER_GONE = RankEvidence(None, (), 4, ("raised",))  # a collective error: not its own failure


def test_a_rank_that_died_before_its_peers_collective_failed_is_the_culprit() -> None:
    f = first_bad_rank({0: PEER_GONE, 1: RankEvidence(None, (), None, (), LOADER)})
    assert f is not None and (f.kind, f.ranks, f.step, f.local) == ("died", (1,), 4, True)
    assert f.ended == LOADER and f.after is not None and f.after.ranks == (0,)
    assert describe_failure(f) == (
        "rank 1 died: OSError: image file is truncated, outside any step, after step 3, at "
        "train.py:40 in main; then rank 0 raised at step 4 in a collective the dead rank never "
        "joined"
    )


def test_a_nan_before_the_death_stays_the_culprit() -> None:
    nan = RankEvidence(2, ("loss",), 2, ("grad_nonfinite",))
    f = first_bad_rank({0: nan, 1: RankEvidence(None, (), None, (), LOADER)})
    assert f is not None and (f.kind, f.ranks, f.step) == ("nonfinite", (0,), 2)


def test_a_death_with_no_failure_after_it_and_every_rank_dying_at_once() -> None:
    # the peers were killed by the launcher (NCCL: a watchdog, or torchrun's SIGTERM)
    f = first_bad_rank({0: CLEAN, 1: RankEvidence(None, (), None, (), LOADER)})
    assert f is not None and f.kind == "died" and f.after is None
    assert describe_failure(f).endswith("at train.py:40 in main")
    # a validation loop raising on every rank: every rank is named
    both = first_bad_rank({r: RankEvidence(None, (), None, (), LOADER) for r in (0, 1)})
    assert both is not None and both.ranks == (0, 1)
    assert describe_failure(both).startswith("rank 0 and rank 1 died: OSError")
    # before the first step: the step never entered is 0
    early = Ended("exception", "KeyError", "'x'", None, "tb", None)
    f = first_bad_rank({0: CLEAN, 1: RankEvidence(None, (), None, (), early)})
    assert f is not None and f.step == 0 and "before the first step" in describe_failure(f)


def test_a_died_failure_goes_through_json_and_other_kinds_keep_their_json() -> None:
    f = first_bad_rank({0: PEER_GONE, 1: RankEvidence(None, (), None, (), LOADER)})
    assert f is not None
    assert RankFailure.from_json(f.to_json(evidence=True)) == f
    plain = RankFailure(4, (0,), "exception", False, {0: ["raised"]})
    assert set(plain.to_json()) == {"step", "ranks", "kind", "local"}
    assert RankFailure.from_json(plain.to_json(evidence=True)) == plain
