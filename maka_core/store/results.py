"""What the ledger writers take and give back, as values: the Temporal attempt behind a write
(audit only), the results of a commit and of an import, and ``row_values``, the column values of
a flat row dataclass (an attempt, an operation or journal projection row)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ToolAttempt:
    """The Temporal attempt that performed a write (audit only, never an identity)."""

    workflow_id: str | None = None
    workflow_run_id: str | None = None
    activity_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True)
class CommitResult:
    """``created`` is False for an exact retry; ``ledger_seq`` is the batch's last position."""

    created: bool
    event_ids: tuple[str, ...]
    ledger_seq: int
    created_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImportResult:
    """How many events an import wrote, and how many were already present (exact retries)."""

    imported: int
    existing: int


AttemptArg = ToolAttempt | Mapping[str, Any] | None


def as_attempt(value: AttemptArg) -> ToolAttempt | None:
    """A writer's ``attempt`` argument as the record (a mapping holds its fields)."""
    if value is None or isinstance(value, ToolAttempt):
        return value
    return ToolAttempt(**dict(value))


def row_values(row: Any) -> dict[str, Any]:
    """A flat row dataclass as column values (``asdict`` deep-copies; these hold scalars only)."""
    return {name: getattr(row, name) for name in _field_names(type(row))}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


__all__ = ["AttemptArg", "CommitResult", "ImportResult", "ToolAttempt", "as_attempt", "row_values"]
