"""A failure criterion is named the same way on the command line and in a rank's spec: the
multi-rank launcher writes ``{"kind": ...}`` or ``{"until": EXPR}`` and each rank builds the
criterion again with :func:`replay.bisect.criteria.criterion_named`, as ``replay bisect`` does."""

from __future__ import annotations

import pytest

from replay.bisect import NonFinite, Predicate, PredicateError, Raised
from replay.bisect.criteria import criterion_named
from replay.multirank.launch import _criterion_spec


@pytest.mark.parametrize(
    "criterion",
    [NonFinite(), Raised(), criterion_named(until="loss > 4 * median_loss")],
    ids=lambda c: c.kind,
)
def test_a_rank_rebuilds_the_criterion_the_launcher_sent(criterion):
    spec = _criterion_spec(criterion)
    again = criterion_named(**spec)
    assert type(again) is type(criterion) and again.describe() == criterion.describe()


def test_the_names_the_command_line_gives():
    assert criterion_named("auto") is None
    assert isinstance(criterion_named("nonfinite"), NonFinite)
    assert isinstance(criterion_named("exception"), Raised)
    until = criterion_named("auto", "grad_norm > 10 and step >= 3")
    assert isinstance(until, Predicate) and until.describe() == "grad_norm > 10 and step >= 3"
    with pytest.raises(PredicateError):
        criterion_named(until="loss >")
