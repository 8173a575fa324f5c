"""Findings and the registry of rules (refuses duplicates, so two families cannot shadow a name)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ..reports.doctor import Finding  # what a rule returns; replay doctor --json lists them

if TYPE_CHECKING:
    from .context import Context

__all__ = ["Finding", "Rule", "RULES", "rule", "SEVERITIES"]

SEVERITIES = ("error", "warning", "info")


#: What a rule returns: one finding, several, or None when it has nothing to say.
Check = Callable[["Context"], Iterable[Finding] | Finding | None]
_C = TypeVar("_C", bound=Check)


@dataclass(frozen=True)
class Rule:
    name: str
    check: Check


RULES: dict[str, Rule] = {}


def rule(fn: _C) -> _C:
    """Register ``fn(ctx) -> Finding | list[Finding] | None`` as the rule of its own name;
    ``fn`` is returned as it is (other rules may call it: ``lr`` asks ``loss_rising``)."""
    if fn.__name__ in RULES:
        raise ValueError(f"doctor rule {fn.__name__!r} is registered twice")
    RULES[fn.__name__] = Rule(fn.__name__, fn)
    return fn
