"""Token usage, as the ledger holds it: Maka's ``tokenUsage`` action, one per model step (on the
step's ``<stepId>:usage`` system event), summed per run and per session by whoever shows it.

Sums are of what vendors reported: a count no step reported stays absent (unknown is not zero).

A vendor's counts are data to check, never trusted arithmetic: every count a step commits is an
integer from 0 to ``MAX_STEP_COUNT`` (``usage_problem``), or the step is refused before anything of
it commits (the model step's ``usage_invalid``). A negative count would buy tokens past a cap, one
too large for a JSON number would not commit at all, and either way the caps would not hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

#: The ``tokenUsage`` counts that are summed (Maka's names).
USAGE_COUNTS = ("input", "output", "total", "cacheRead", "cacheCreation", "reasoning")
#: The counts every reported usage has (Maka's ``tokenUsage`` requires them).
REQUIRED_COUNTS: Final = ("input", "output")
#: The largest count one step may report: a billion tokens, a hundred times the largest context
#: window sold today, and small enough that a session's sums stay exact integers in every JSON
#: reader (below 2**53) for millions of steps.
MAX_STEP_COUNT: Final = 10**9

Usage = dict[str, int | float]


def _count(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def count_problem(value: Any) -> str | None:
    """Why ``value`` is not a count a step may report (``None``: it is one): an integer (not a
    bool, not a float, even an integral one) from 0 to ``MAX_STEP_COUNT``."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"is not an integer (a {type(value).__name__})"
    if value < 0:
        return "is negative"
    if value > MAX_STEP_COUNT:
        return f"is over the bound of {MAX_STEP_COUNT}"
    return None


def usage_problem(usage: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first count of a step's usage that cannot be committed, as ``(key, why)``, or ``None``:
    ``input`` and ``output`` are present, and every count of ``USAGE_COUNTS`` present passes
    ``count_problem``."""
    for key in REQUIRED_COUNTS:
        if key not in usage:
            return key, "is missing"
    for key in USAGE_COUNTS:
        if key in usage:
            problem = count_problem(usage[key])
            if problem is not None:
                return key, problem
    return None


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
    """What one step counts against a token cap: the larger of its vendor's ``total`` and input
    plus output (input counting cached input), so a ``total`` that says less than its parts buys
    nothing. A count below zero counts as zero (a ledger written before counts were checked may
    hold one; it never lowers what a session has spent)."""

    def count(key: str) -> int:
        value = _count(usage.get(key))
        return max(int(value), 0) if value is not None else 0

    return max(count("total"), count("input") + count("output"))
