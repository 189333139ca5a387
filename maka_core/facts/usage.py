"""Token usage, as the ledger holds it: Maka's ``tokenUsage`` action, one per model step (on the
step's ``<stepId>:usage`` system event), summed per run and per session by whoever shows it.

Sums are of what vendors reported: a count no step reported stays absent (unknown is not zero).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The ``tokenUsage`` counts that are summed (Maka's names).
USAGE_COUNTS = ("input", "output", "total", "cacheRead", "cacheCreation", "reasoning")

Usage = dict[str, int | float]


def _count(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def add_usage(into: Usage, usage: Mapping[str, Any]) -> Usage:
    """Add one step's (or sum's) counts into ``into``; returns ``into``."""
    for key in USAGE_COUNTS:
        value = _count(usage.get(key))
        if value is not None:
            into[key] = into.get(key, 0) + value
    return into


def sum_usage(parts: Iterable[Mapping[str, Any]]) -> Usage | None:
    """The sum of ``parts``, or ``None`` when there are none."""
    out: Usage | None = None
    for part in parts:
        out = add_usage({} if out is None else out, part)
    return out


def step_tokens(usage: Mapping[str, Any]) -> int:
    """What one step counts against a token cap: its vendor's ``total`` (input, cached input
    included, plus output), else input plus output."""

    def count(key: str) -> int:
        value = _count(usage.get(key))
        return int(value) if value is not None else 0

    return count("total") or count("input") + count("output")
