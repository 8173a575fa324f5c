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
    family: str
    check: Check
    doc: str


RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[_C], _C]:
    """Register ``fn(ctx) -> Finding | list[Finding] | None`` as rule ``name``; ``fn`` is
    returned as it is (other rules may call it: ``lr`` asks ``loss_rising``).

    The rule's family is the module that defines it (``loss``, ``gradients``...).
    """

    def register(fn: _C) -> _C:
        if name in RULES:
            raise ValueError(f"doctor rule {name!r} is registered twice")
        family = fn.__module__.rsplit(".", 1)[-1]
        RULES[name] = Rule(name, family, fn, (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return register
