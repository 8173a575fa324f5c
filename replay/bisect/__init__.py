"""Finding the first bad step: the search over a recording's health and replays.

Knows nothing of HDF5 (nor torch): it drives a :class:`Subject` (the replay engine provides one
for real recordings; tests give synthetic ones: ``subject.py``)."""

from .criteria import NonFinite, Predicate, Raised, auto_criterion
from .predicate import Expression, History, PredicateError
from .search import SearchError, find_culprit, newest_healthy
from .verify import verify_window

__all__ = [
    "Expression",
    "History",
    "NonFinite",
    "Predicate",
    "PredicateError",
    "Raised",
    "SearchError",
    "auto_criterion",
    "find_culprit",
    "newest_healthy",
    "verify_window",
]
