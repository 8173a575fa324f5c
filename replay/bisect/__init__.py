"""Finding the first bad step: the search over a recording's health and replays.

Knows nothing of HDF5 (nor torch): it drives a :class:`Subject` (the replay engine provides one
for real recordings; tests give synthetic ones)."""

from .compare import compare_rows, same_bits
from .criteria import NonFinite, Predicate, Raised, Symptom, auto_criterion, is_nonfinite
from .predicate import Expression, History, PredicateError
from .search import SearchError, find_culprit, newest_healthy
from .subject import Subject
from .verify import WindowCheck, verify_window

__all__ = [
    "Expression",
    "History",
    "NonFinite",
    "Predicate",
    "PredicateError",
    "Raised",
    "SearchError",
    "Subject",
    "Symptom",
    "WindowCheck",
    "auto_criterion",
    "compare_rows",
    "find_culprit",
    "is_nonfinite",
    "newest_healthy",
    "same_bits",
    "verify_window",
]
